"""The ingest stages of the benchmark in order, and a run of them alone (``medallion bench --only
ingest``): Kafka -> bronze beside the bare consumer and plain Spark, one and two ingest processes
(:mod:`pipelines.dev.bench.ingest_kafka`), and remote write beside decoding, a read-and-discard
receiver, one and two receiver processes, VictoriaMetrics and Prometheus
(:mod:`pipelines.dev.bench.ingest_remote_write`)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pipelines.dev.bench import plain
from pipelines.dev.bench.ingest_kafka import kafka_stage
from pipelines.dev.bench.ingest_remote_write import remote_write_stage, remote_write_steady_stage
from pipelines.dev.bench.measure import Bench, as_dicts
from pipelines.dev.bench.workloads import SIZES, Workload, remote_write_bodies


def ingest_stages(b: Bench, w: Workload) -> None:
    """Kafka and remote write into bronze, each beside its peers."""
    b.say("Kafka -> bronze")
    kafka_stage(b, w)
    b.say("remote write")
    remote_write_stage(b, w)
    b.say("remote write in a steady state: one and two receiver processes, VictoriaMetrics and Prometheus")
    remote_write_steady_stage(b, w)


def run_ingest(
    size_name: str, out: Path, spark: SparkSession, repeats: int = 3, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Only the ingest stages at a size: Kafka -> bronze beside the bare consumer and plain Spark,
    one and two ingest processes, and remote write beside decoding, reading and discarding, one and
    two receiver processes, VictoriaMetrics and Prometheus. Minutes where the whole bench takes most
    of an hour; the same table, JSON and chart."""
    from pipelines.dev.bench import report

    size = SIZES[size_name]
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "work", ignore_errors=True)
    b = Bench(size, out, spark, repeats, say)
    t0 = time.perf_counter()
    say(f"bench {size.name}, ingest stages: generating the remote-write bodies")
    bodies, samples = remote_write_bodies(size)
    w = Workload(size, out / "work" / "data", 0, [], [], bodies, samples)
    ingest_stages(b, w)
    result = {
        "size": size.name,
        "only": "ingest",
        "workload": {
            "events": 0,
            "page_changes_distinct": 0,
            "page_changes_landed": 0,
            "remote_write_samples": samples,
            "remote_write_requests": len(bodies),
            "kafka_messages": size.kafka_messages,
        },
        "repeats": repeats,
        "machine": report.machine(spark),
        "stages": sorted(as_dicts(b.figures), key=lambda s: s["stage"].startswith(plain.PREFIX)),
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    report.write(result, out)
    shutil.rmtree(out / "work", ignore_errors=True)
    return result
