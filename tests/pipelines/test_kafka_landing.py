"""A Kafka flush's messages -> bronze and quarantine rows, parsed in the ingest process or by Spark.

The two lanes must land the same events with the same fields and property documents, and
quarantine the same messages with the same reasons; the in-process lane
must take the events it can, and leave the rest to Spark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.demo.data import posthog_events
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.ingest_kafka import land_messages
from pipelines.runtime.runner import Context
from pipelines.storage import open_store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Record:
    value: bytes | None
    offset: int
    topic: str = "events"
    partition: int = 0
    timestamp: int | None = 1_700_000_000_000


def messages() -> list[Record]:
    good = [json.dumps(e, ensure_ascii=False).encode() for e in posthog_events()]
    odd = [
        b"not json",
        None,
        json.dumps({**json.loads(good[0]), "team_id": "7"}).encode(),  # mistyped: Spark's reason
        json.dumps({**json.loads(good[1]), "team_id": 0}).encode(),  # parses; the gate drops it
        json.dumps({**json.loads(good[2]), "timestamp": "2024-06-01 10:00:00"}).encode(),  # Spark reads it
        good[3].replace(b"{", b'{"event": "dup", ', 1),  # a key twice: the last one is kept
    ]
    return [Record(v, i) for i, v in enumerate(good + odd)]


def land(spark: SparkSession, tmp_path: Path, in_process: bool) -> tuple[pa.Table, pa.Table, RunRecord]:
    settings = load_settings(lake_root=str(tmp_path / f"lake-{in_process}"), kafka={"parse_in_process": in_process})
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)
    record = RunRecord("ingest.kafka")
    good, bad = land_messages(ctx, record, "events", messages(), "batch-1", NOW)
    return good, bad, record


def comparable(spark: SparkSession, rows: pa.Table) -> list[tuple]:
    kept = rows.drop_columns(["source", "source_file"])
    return sorted((tuple(r.values()) for r in kept.to_pylist()), key=repr)  # a hundred test rows


def quarantine(rows: pa.Table) -> list[tuple]:
    return sorted(
        zip(
            rows["offset"].to_pylist(),
            rows["reason"].to_pylist(),
            rows["expectation"].to_pylist(),
            rows["raw"].to_pylist(),
            strict=True,
        ),
        key=repr,
    )


def test_both_lanes_land_and_quarantine_the_same_and_most_events_skip_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    fast_good, fast_bad, fast = land(spark, tmp_path, in_process=True)
    slow_good, slow_bad, slow = land(spark, tmp_path, in_process=False)
    assert comparable(spark, fast_good) == comparable(spark, slow_good)
    assert quarantine(fast_bad) == quarantine(slow_bad)
    n = len(messages())
    # The 6 odd ones but the space-separated time, which Spark reads, and the repeated key.
    assert fast_good.num_rows == n - 4
    (dup,) = [r for r in fast_good.to_pylist() if r["offset"] == n - 1]
    assert dup["event"] == json.loads(messages()[3].value)["event"] != "dup"  # the last occurrence
    assert fast.metrics["duplicate_keys"] == slow.metrics["duplicate_keys"] == 1
    reasons = {r for _, r, _, _ in quarantine(fast_bad)}
    assert "expectation team_id_positive failed" in reasons and "not valid JSON" in reasons
    # Only the 5 odd messages the in-process parser is unsure of went to Spark (the zero team id
    # parses, and the gate drops it; a repeated key is left to Spark), and both lanes recorded the
    # same gate results.
    assert (fast.metrics["parsed_in_process"], fast.metrics["parsed_by_spark"]) == (n - 5, 5)
    assert "parsed_in_process" not in slow.metrics

    def results(record: RunRecord) -> list[tuple]:
        return [(q["expectation"], q["rows_checked"], q["rows_failed"], q["outcome"]) for q in record.quality]

    assert results(fast) == results(slow) and results(fast)
