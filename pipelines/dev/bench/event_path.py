"""``medallion bench --only chain``: the event path at a size, warm and cold, with the peers it
is held to and Spark's jobs per stage; the figures the speed issues are judged by, in a fraction
of the whole bench's time."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pipelines.dev.bench import plain
from pipelines.dev.bench.measure import Bench, as_dicts
from pipelines.dev.bench.run import event_path
from pipelines.dev.bench.workloads import SIZES, generate
from pipelines.runtime.tables import BRONZE_PAGE_CHANGES


def run_chain(
    size_name: str, out: Path, spark: SparkSession, repeats: int = 3, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Only the event path at a size, warm and cold, with the peers it is held to: the chain (a
    warm-up, then ``repeats`` runs, gates on), ClickHouse's fan-out and GROUP BY, the plain-Spark
    peers and their end to end, and the cold chain beside its one-process peer. The figures of
    issue 41 in a fraction of the whole bench's time; the same table, JSON, chart and Spark jobs.
    The whole bench runs the same ``event_path`` (its smoke test, tests/pipelines/test_bench.py,
    holds its figures and peers), with the gates-off runs and the other stages beside it."""
    from pipelines.dev.bench import report, sparklog

    size = SIZES[size_name]
    out = out.resolve()  # a relative folder would read as host/database in the chdb:// DSN
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "work", ignore_errors=True)
    b = Bench(size, out, spark, repeats, say)
    t0 = time.perf_counter()
    say(f"bench {size.name}, the event path: generating the workload")
    w = generate(size, out / "work" / f"data-{size.name}", remote_write=False)
    ctx = event_path(b, w, gates_off=False)
    spark_jobs = sparklog.figures_of(spark, {f.stage: f.windows for f in b.figures.values() if f.windows})
    result = {
        "size": size.name,
        "only": "chain",
        "workload": {
            "events": size.events,
            "page_changes_distinct": size.page_changes,
            "page_changes_landed": ctx.store.read(BRONZE_PAGE_CHANGES).count(),
            "remote_write_samples": 0,
            "remote_write_requests": 0,
            "kafka_messages": 0,
        },
        "repeats": repeats,
        "machine": report.machine(spark),
        "stages": sorted(as_dicts(b.figures), key=lambda s: s["stage"].startswith(plain.PREFIX)),
        "spark_jobs": spark_jobs,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    report.write(result, out)
    shutil.rmtree(out / "work", ignore_errors=True)
    return result
