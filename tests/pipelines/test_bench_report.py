"""The bench report for an L run: scaling by size (seconds, events/s, memory) and the fixed costs of
a small increment on an S lake beside an L lake, without the sections only M and S measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.dev.bench.report import markdown, write

PNG = b"\x89PNG\r\n\x1a\n"
BRONZE, GOLD = "files -> bronze (events)", "gold (stage 1 + 2)"


def fixed(noop: float, one: float) -> dict[str, Any]:
    return {
        "stage": "export",
        "noop": {"median": noop, "min": noop, "max": noop},
        "one_event": {"median": one, "min": one, "max": one},
    }


def l_result() -> dict[str, Any]:
    stage = {
        "stage": GOLD,
        "unit": "events",
        "runs": 1,
        "median_per_s": 8_000.0,
        "min_per_s": 8_000.0,
        "max_per_s": 8_000.0,
        "median_seconds": 250.0,
        "units": [2_000_000.0],
        "seconds": [250.0],
        "peak_rss_mb": {"driver": 900.0, "jvm": 4_100.0},
        "peers": [],
        "note": None,
    }
    return {
        "size": "L",
        "workload": {
            "events": 2_000_000,
            "page_changes_distinct": 600_000,
            "page_changes_landed": 690_000,
            "remote_write_samples": 0,
            "remote_write_requests": 0,
            "kafka_messages": 0,
        },
        "repeats": 1,
        "machine": {"cpus": 2, "cpu": "x", "memory_gb": 23.5, "python": "3.11", "spark": "4.2.0"},
        "stages": [stage],
        "fixed_costs": [fixed(0.3, 2.4)],
        "fixed_costs_small": [fixed(0.25, 2.0)],
        "scaling": {
            "sizes": {"S": 20_000, "M": 200_000, "L": 2_000_000},
            "seconds": {
                "S": {BRONZE: 2.0, GOLD: 5.0},
                "M": {BRONZE: 10.0, GOLD: 25.0},
                "L": {BRONZE: 100.0, GOLD: 250.0},
            },
            "peak_rss_mb": {
                "S": {BRONZE: {"driver": 800.0, "jvm": 3_000.0}, GOLD: {"driver": 850.0, "jvm": 3_100.0}},
                "M": {BRONZE: {"driver": 810.0, "jvm": 3_900.0}, GOLD: {"driver": 860.0, "jvm": 4_000.0}},
                "L": {BRONZE: {"driver": 820.0, "jvm": 4_050.0}, GOLD: {"driver": 900.0, "jvm": 4_100.0}},
            },
            "event_path": [BRONZE, GOLD],
        },
        "backfill": {"window": "[a, b)", "gold_rows": 8_000_000, "tuples": 900, "seconds": seconds(6.0, 5.5, 7.0)},
        "backfill_small": {"window": "[c, d)", "gold_rows": 90_000, "tuples": 800, "seconds": seconds(5.0, 4.0, 6.0)},
        "wall_seconds": 1_500.0,
    }


def seconds(median: float, low: float, high: float) -> dict[str, float]:
    return {"median": median, "min": low, "max": high}


def test_an_l_report_shows_scale_by_size_and_the_fixed_costs_at_both_ends(tmp_path: Path) -> None:
    table = markdown(l_result())
    assert "| gold (stage 1 + 2) | 8,000 events | 8,000-8,000 | 250.00 | 900.00 / 4,100 |  |" in table
    assert "| stage | S (20,000 events) | M (200,000 events) | L (2,000,000 events) |" in table
    assert "| gold (stage 1 + 2) | 5.00 | 25.00 | 250.00 |" in table  # seconds
    assert "| files -> bronze (events) | 10,000 | 20,000 | 20,000 |" in table  # events/s
    assert "| gold (stage 1 + 2) | 850.00 / 3,100 | 860.00 / 4,000 | 900.00 / 4,100 |" in table  # RSS
    assert "| job | no-op at S | no-op at L | 1 event at S | 1 event at L | 1 event, L / S |" in table
    assert "| export | 0.25 | 0.30 | 2.00 | 2.40 | 1.20x |" in table
    assert "| S | 90,000 | [c, d) | 800 | 5.00 (4.00-6.00) | 1.00x |" in table  # a backfill's cost: its range's
    assert "| L | 8,000,000 | [a, b) | 900 | 6.00 (5.50-7.00) | 1.20x |" in table
    # Only M and S measure these.
    for absent in ("## Records per event", "## Page changes pruned", "## Page-change buffer", "## Freshness"):
        assert absent not in table
    paths = write(l_result(), tmp_path)
    assert [p.name for p in paths] == ["bench.md", "bench.json", "bench.png", "scaling.png"]
    assert all(p.read_bytes()[:8] == PNG for p in paths[2:])
