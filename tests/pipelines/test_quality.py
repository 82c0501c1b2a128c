"""Quality gates in the jobs: warn keeps, drop quarantines with the expectation's name, fail writes
nothing; results reach the event log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.errors import MedallionError
from pipelines.runtime import ingest, quality
from pipelines.runtime.eventlog import EXPECTATION_RESULTS, PIPELINE_EVENTS, RunRecord
from pipelines.runtime.quality import ExpectationFailed
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_EVENTS, BRONZE_QUARANTINE, SILVER_EVENTS
from pipelines.storage import AppTxn, open_store
from tests.helpers import delta_rs_only  # noqa: F401  (the engine fixture: delta-rs here)


def context(spark: SparkSession, tmp_path: Path, engine: str = "delta-rs", **policies: str) -> Context:
    settings = load_settings(lake_root=str(tmp_path / "lake"), delta_engine=engine, quality={"policies": policies})
    return Context(settings=settings, spark=spark, store=open_store(settings, spark))


def events_file(path: Path) -> Path:
    """Three events; the second has team 0, which passes parsing but not ``team_id_positive``."""
    lines = [
        {
            "uuid": f"00000000-0000-4000-8000-00000000000{i}",
            "event": "$pageview",
            "team_id": team,
            "distinct_id": "u",
            "timestamp": "2024-06-01T00:00:00Z",
            "properties": {"$browser": "Firefox"},
        }
        for i, team in enumerate([1, 0, 2])
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def table_rows(ctx: Context, spec) -> list[dict]:  # type: ignore[no-untyped-def]
    return ctx.store.read(spec).collect() if ctx.store.exists(spec) else []


def results(ctx: Context) -> dict[str, tuple[str, int]]:
    rows = ctx.store.read(EXPECTATION_RESULTS).where("expectation = 'team_id_positive'").collect()
    return {r["run_id"]: (r["outcome"], r["rows_failed"]) for r in rows}


def test_drop_quarantines_failing_rows_with_the_expectation_name(spark: SparkSession, tmp_path: Path) -> None:
    ctx = context(spark, tmp_path)  # team_id_positive is "drop" by default
    record = ingest.ingest_files(ctx, "events", [events_file(tmp_path / "e.jsonl")])
    assert sorted(r["team_id"] for r in table_rows(ctx, BRONZE_EVENTS)) == [1, 2]
    (bad,) = table_rows(ctx, BRONZE_QUARANTINE)
    assert (bad["kind"], bad["expectation"], bad["reason"]) == (
        "events",
        "team_id_positive",
        "expectation team_id_positive failed",
    )
    assert json.loads(bad["raw"])["team_id"] == 0
    assert results(ctx) == {ctx.run_id: ("dropped", 1)}
    assert record.metrics["quality.bronze/events.dropped_rows"] == 1


def test_warn_keeps_failing_rows_and_records_them(spark: SparkSession, tmp_path: Path) -> None:
    ctx = context(spark, tmp_path, **{"bronze/events:team_id_positive": "warn"})
    ingest.ingest_files(ctx, "events", [events_file(tmp_path / "e.jsonl")])
    assert sorted(r["team_id"] for r in table_rows(ctx, BRONZE_EVENTS)) == [0, 1, 2]
    assert table_rows(ctx, BRONZE_QUARANTINE) == []
    assert results(ctx) == {ctx.run_id: ("warned", 1)}


def test_fail_writes_nothing_and_logs_the_failed_run(spark: SparkSession, tmp_path: Path) -> None:
    ctx = context(spark, tmp_path, **{"bronze/events": "fail"})
    with pytest.raises(ExpectationFailed, match=r"team_id_positive .* failed: 1 of 3 rows") as failed:
        ingest.ingest_files(ctx, "events", [events_file(tmp_path / "e.jsonl")])
    assert isinstance(failed.value, MedallionError)  # the CLI reports it as one line
    assert table_rows(ctx, BRONZE_EVENTS) == [] and table_rows(ctx, BRONZE_QUARANTINE) == []
    (run,) = ctx.store.read(PIPELINE_EVENTS).collect()
    assert run["status"] == "failed" and "team_id_positive" in run["error"]
    assert results(ctx) == {ctx.run_id: ("failed", 1)}
    # With the policy relaxed the same file lands (the failed run recorded no progress).
    relaxed = context(spark, tmp_path, **{"bronze/events": "warn"})
    ingest.ingest_files(relaxed, "events", [events_file(tmp_path / "e.jsonl")])
    assert len(table_rows(relaxed, BRONZE_EVENTS)) == 3


def test_a_gate_quarantines_a_redone_batch_once(spark: SparkSession, engine: str, tmp_path: Path) -> None:
    ctx = context(spark, tmp_path, engine, **{"silver/events:bucket_in_range": "drop"})
    ctx.store.ensure(BRONZE_QUARANTINE)
    batch = ctx.store.to_spark(ctx.store.to_arrow(SILVER_EVENTS, _silver_rows(spark, [0, 9, 3])))
    txn = AppTxn("medallion/silver.events<-bronze/events", 4)
    for _ in range(2):  # a crash after the quarantine commit makes the next run redo the batch
        kept = quality.gate(ctx, RunRecord("silver.events"), SILVER_EVENTS.key, batch, txn)
        assert sorted(r["bucket"] for r in kept.collect()) == [0, 3]
    (bad,) = table_rows(ctx, BRONZE_QUARANTINE)
    assert (bad["kind"], bad["expectation"]) == ("silver/events", "bucket_in_range")
    assert json.loads(bad["raw"])["bucket"] == 9 and bad["batch_id"] == "b9"


def _silver_rows(spark: SparkSession, buckets: list[int]):  # type: ignore[no-untyped-def]
    from datetime import datetime

    t = datetime(2024, 6, 1)
    return spark.createDataFrame(
        [(f"u{b}", "e", 1, "d", t, b, f"b{b}", t, "{}") for b in buckets],
        SILVER_EVENTS.schema,
    )


def test_disabled_quality_skips_validation(spark: SparkSession, tmp_path: Path) -> None:
    settings = load_settings(lake_root=str(tmp_path / "lake"), quality={"enabled": False})
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark))
    record = ingest.ingest_files(ctx, "events", [events_file(tmp_path / "e.jsonl")])
    assert len(table_rows(ctx, BRONZE_EVENTS)) == 3 and not ctx.store.exists(EXPECTATION_RESULTS)
    assert not any(k.startswith("quality.") for k in record.metrics)


def test_bad_policy_settings_name_the_setting(spark: SparkSession, tmp_path: Path) -> None:
    from pipelines.errors import SettingsError

    ctx = context(spark, tmp_path, **{"gold/nope": "warn"})
    with pytest.raises(SettingsError, match="no suite for gold/nope"):
        quality.check_policies(ctx)
    unknown = context(spark, tmp_path, **{"bronze/events:nope": "warn"})
    with pytest.raises(SettingsError, match=r"MEDALLION_QUALITY__POLICIES\['bronze/events:nope'\]: .* no expectation"):
        quality.check_policies(unknown)
    with pytest.raises(SettingsError):
        load_settings(lake_root=str(tmp_path), quality={"policies": {"bronze/events": "ignore"}})
