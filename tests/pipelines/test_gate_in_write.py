"""A gate checked by the write itself (silver.events and the export's outbox: row-level checks,
no drop): one pass over the batch counts the failing rows, and a row failing a ``fail`` check stops
the write before its commit, on both engines. A check on a total (gold's partials: their sum against
the tuples the same pass fanned out) is judged between the write's files and its commit on delta-rs,
and from one cached pass on Delta on Spark, whose writes commit inside them. Gold's MERGE source is
checked as delta-rs stages it for the MERGE, before the MERGE changes gold; Delta on Spark validates
it from a cache first. Expected results are written by hand from the three rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config.settings import Settings
from pipelines.flows import flow
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.flow_types import FlowRecord
from pipelines.runtime.incremental import gated_write
from pipelines.runtime.quality import ExpectationFailed, gate_in_write
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import EXPORT_OUTBOX, GOLD_PARTIALS, GOLD_PROPERTY_VALUES, SILVER_EVENTS
from pipelines.storage import AppTxn, open_store
from tests.helpers import counting_reads

TXN = AppTxn("medallion/silver.events<-bronze/events", 1)
T = datetime(2024, 6, 1)


def silver_rows(spark: SparkSession, buckets: list[int]) -> DataFrame:
    return spark.createDataFrame(
        [(f"u{b}", "e", 1, "d", T, b, f"b{b}", T, "{}") for b in buckets],
        SILVER_EVENTS.schema,
    )


def context(spark: SparkSession, engine_settings: Callable[..., Settings], lake: Path, **policies: str) -> Context:
    settings = engine_settings(lake, quality={"policies": policies})
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark))
    ctx.store.ensure(SILVER_EVENTS)
    return ctx


def gated_append(
    ctx: Context,
    record: RunRecord,
    rows: DataFrame,
    name: str = "silver.events",
    least: object = None,
    **params: object,
) -> int:
    return gated_write(ctx, record, flow(name), rows, TXN, None, params, FlowRecord(record, lambda _: None), least)


def outcomes(record: RunRecord) -> dict[str, tuple[str, int, int]]:
    return {r["expectation"]: (r["outcome"], r["rows_checked"], r["rows_failed"]) for r in record.quality}


PASSED_ON_3 = {
    "uuid_not_null": ("passed", 3, 0),
    "team_id_not_null": ("passed", 3, 0),
    "event_time_not_null": ("passed", 3, 0),
    "bucket_not_null": ("passed", 3, 0),
    "bucket_in_range": ("passed", 3, 0),
}


def test_a_passing_batch_is_written_and_counted_in_the_same_pass(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    ctx = context(spark, engine_settings, tmp_path / "lake")
    record = RunRecord("silver.events")
    version = gated_append(ctx, record, silver_rows(spark, [0, 7, 3]))
    assert sorted(r["bucket"] for r in ctx.store.read(SILVER_EVENTS).collect()) == [0, 3, 7]
    assert ctx.store.txn_version(SILVER_EVENTS, TXN.app_id) == 1 and version == ctx.store.version(SILVER_EVENTS)
    assert outcomes(record) == PASSED_ON_3
    assert record.metrics["quality.silver/events.rows"] == 3  # the figure gold's stages read for their rows


def test_the_gate_and_the_write_read_the_batch_once(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Each row's bucket comes from a Python function that counts its calls: a gate with a pass of
    # its own before the write would make 6 calls for these 3 rows.
    bucket, calls = counting_reads(spark, F.col("bucket"), "int")
    rows = silver_rows(spark, [0, 7, 3]).withColumn("bucket", bucket)
    ctx = context(spark, engine_settings, tmp_path / "lake")
    record = RunRecord("silver.events")
    gated_append(ctx, record, rows)
    assert calls.value == 3
    assert outcomes(record) == PASSED_ON_3


def test_a_row_failing_a_fail_check_stops_the_write_before_its_commit(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    ctx = context(spark, engine_settings, tmp_path / "lake")
    before = ctx.store.version(SILVER_EVENTS)
    record = RunRecord("silver.events")
    with pytest.raises(ExpectationFailed, match=r"bucket_in_range .* failed: 1 of 3 rows"):
        gated_append(ctx, record, silver_rows(spark, [0, 9, 3]))
    assert ctx.store.version(SILVER_EVENTS) == before and ctx.store.read(SILVER_EVENTS).count() == 0
    assert ctx.store.txn_version(SILVER_EVENTS, TXN.app_id) is None
    assert outcomes(record) == {**PASSED_ON_3, "bucket_in_range": ("failed", 3, 1)}


def test_a_warn_check_writes_every_row_and_counts_the_failing_one(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    ctx = context(spark, engine_settings, tmp_path / "lake", **{"silver/events:bucket_in_range": "warn"})
    record = RunRecord("silver.events")
    gated_append(ctx, record, silver_rows(spark, [0, 9, 3]))
    assert sorted(r["bucket"] for r in ctx.store.read(SILVER_EVENTS).collect()) == [0, 3, 9]
    assert outcomes(record) == {**PASSED_ON_3, "bucket_in_range": ("warned", 3, 1)}


def test_a_batch_spark_knows_is_empty_is_counted_without_the_write_s_figures(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # An increment of commits that added no file reads as an empty local relation: Spark writes it
    # without running the observed plan, so the write gives no figures (Spark raises on asking).
    ctx = context(spark, engine_settings, tmp_path / "lake")
    record = RunRecord("silver.events")
    empty = spark.createDataFrame([], SILVER_EVENTS.schema)
    gated_append(ctx, record, empty)
    assert ctx.store.read(SILVER_EVENTS).count() == 0 and ctx.store.txn_version(SILVER_EVENTS, TXN.app_id) == 1
    assert outcomes(record) == {name: ("passed", 0, 0) for name in PASSED_ON_3}


# -- a check on a total: gold's partials against the tuples fanned out --------------------------------
def partial_rows(spark: SparkSession, counts: list[int]) -> DataFrame:
    return spark.createDataFrame(
        [(1, 0, "event", "k", f"v{i}", T, n, T, "b1", T) for i, n in enumerate(counts)], GOLD_PARTIALS.schema
    )


@pytest.mark.parametrize(("tuples", "outcome"), [(6, "passed"), (7, "failed")])
def test_a_check_on_the_batch_s_sum_is_judged_before_the_commit_from_one_pass(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path, tuples: int, outcome: str
) -> None:
    # The parameter is a figure the write itself would observe (a callable, read once it has run):
    # the sum of counts 1 + 2 + 3 against 6 tuples holds, against 7 it does not.
    ctx = context(spark, engine_settings, tmp_path / "lake")
    ctx.store.ensure(GOLD_PARTIALS)
    before = ctx.store.version(GOLD_PARTIALS)
    count, calls = counting_reads(spark, F.col("count"), "long")
    rows = partial_rows(spark, [1, 2, 3]).withColumn("count", count)
    record = RunRecord("gold.partials")
    if outcome == "failed":
        with pytest.raises(ExpectationFailed, match=r"count_sum_equals_tuples .* failed: observed 6"):
            gated_append(ctx, record, rows, "gold.partials", tuples=lambda: tuples)
        assert ctx.store.version(GOLD_PARTIALS) == before and ctx.store.read(GOLD_PARTIALS).count() == 0
        table = Path(ctx.store.path(GOLD_PARTIALS))
        assert not [f for f in table.rglob("*.parquet") if "_delta_log" not in f.parts]  # nothing left behind
    else:
        gated_append(ctx, record, rows, "gold.partials", tuples=lambda: tuples)
        assert sorted(r["count"] for r in ctx.store.read(GOLD_PARTIALS).collect()) == [1, 2, 3]
    assert calls.value == 3  # the batch read once: by the write, or by the pass that fills the gate's cache
    assert outcomes(record)["count_sum_equals_tuples"] == (outcome, 3, None)


#: The checks a tuple's row passes in gold's suite and in the export's, on the three rows.
TUPLE_PASSED_ON_3 = {
    "team_id_not_null": ("passed", 3, 0),
    "property_type_not_null": ("passed", 3, 0),
    "property_key_not_null": ("passed", 3, 0),
    "window_start_not_null": ("passed", 3, 0),
    "count_positive": ("passed", 3, 0),
}


# -- gold's MERGE: its source checked as the MERGE reads it -----------------------------------------
MERGE_PASSED_ON_3 = {
    **TUPLE_PASSED_ON_3,
    "property_type_known": ("passed", 3, 0),
    "last_seen_not_before_first_seen": ("passed", 3, 0),
}


def gold_rows(spark: SparkSession, counts: list[int]) -> DataFrame:
    return spark.createDataFrame(
        [(1, 0, "event", "k", f"v{i}", T, n, T, T, T) for i, n in enumerate(counts)], GOLD_PROPERTY_VALUES.schema
    )


def gold_holding_v0(spark: SparkSession, ctx: Context) -> int:
    """Gold holding (k, v0) in the window T, counted 5: a source in the same window is MERGEd."""
    ctx.store.ensure(GOLD_PROPERTY_VALUES)
    return ctx.store.append(GOLD_PROPERTY_VALUES, gold_rows(spark, [5]), [AppTxn("seed", 1)])


def test_a_merge_source_is_checked_as_the_merge_reads_it(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = context(spark, engine_settings, tmp_path / "lake")
    gold_holding_v0(spark, ctx)
    count, calls = counting_reads(spark, F.col("count"), "long")
    cached: list[DataFrame] = []
    monkeypatch.setattr(FlowRecord, "cache", lambda self, df: cached.append(df) or df.persist())
    record = RunRecord("gold.merge")
    # The least window, as stage 2 has it from its partials' statistics (no pass to ask it).
    gated_append(ctx, record, gold_rows(spark, [1, 2, 3]).withColumn("count", count), "gold.merge", least=T)
    got = {r["property_value"]: r["count"] for r in ctx.store.read(GOLD_PROPERTY_VALUES).collect()}
    assert got == {"v0": 6, "v1": 2, "v2": 3}
    assert ctx.store.txn_version(GOLD_PROPERTY_VALUES, TXN.app_id) == 1
    assert calls.value == 3  # read once: by the MERGE's staging, or by the pass that fills the gate's cache
    # delta-rs checks the source as it stages it for the MERGE; Delta on Spark validates it from a cache.
    assert len(cached) == (0 if ctx.settings.delta_engine == "delta-rs" else 1)
    assert outcomes(record) == MERGE_PASSED_ON_3


def test_a_merge_source_row_failing_a_fail_check_leaves_gold_as_it_was(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    ctx = context(spark, engine_settings, tmp_path / "lake")
    before = gold_holding_v0(spark, ctx)
    record = RunRecord("gold.merge")
    with pytest.raises(ExpectationFailed, match=r"count_positive .* failed: 1 of 3 rows"):
        gated_append(ctx, record, gold_rows(spark, [1, 0, 3]), "gold.merge", least=T)
    assert ctx.store.version(GOLD_PROPERTY_VALUES) == before
    assert [(r["property_value"], r["count"]) for r in ctx.store.read(GOLD_PROPERTY_VALUES).collect()] == [("v0", 5)]
    assert ctx.store.txn_version(GOLD_PROPERTY_VALUES, TXN.app_id) is None
    assert outcomes(record) == {**MERGE_PASSED_ON_3, "count_positive": ("failed", 3, 1)}


# -- the export's gate, checked by its outbox write --------------------------------------------------
EXPORT_TXN = AppTxn("medallion/export.clickhouse<-gold/property_values", 1)
EXPORT_PASSED_ON_3 = {
    **{k: v for k, v in TUPLE_PASSED_ON_3.items() if k != "count_positive"},  # ClickHouse's rows only
    "count_changes": ("passed", 3, 0),
    "total_not_negative": ("passed", 3, 0),
}


def outbox_rows(spark: SparkSession, counts: list[int]) -> DataFrame:
    return spark.createDataFrame(
        [(1, 2, "event", "k", f"v{i}", T, n, n, False, 5, T, T) for i, n in enumerate(counts)], EXPORT_OUTBOX.schema
    )


#: How the export writes its outbox: a frame Spark writes, or a small batch collected into the
#: driver (the gate's checks run as it is collected) and written from there.
OUTBOX_WRITES: dict[str, Callable[[DataFrame], DataFrame | pa.Table]] = {
    "by Spark": lambda rows: rows,
    "from the driver": lambda rows: rows.toArrow(),
}


@pytest.mark.parametrize("written", list(OUTBOX_WRITES))
def test_the_export_outbox_write_checks_its_gate_in_the_same_pass(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path, written: str
) -> None:
    # The suite's two checks on figures (ClickHouse against the exported state) are table checks,
    # run by `medallion validate`: a batch gate has no figures, and they do not keep it from the write.
    count, calls = counting_reads(spark, F.col("count"), "long")
    rows = outbox_rows(spark, [1, 4, 2]).withColumn("count", count)
    ctx = context(spark, engine_settings, tmp_path / "lake")
    ctx.store.ensure(EXPORT_OUTBOX)
    record = RunRecord("export.clickhouse")
    gate = gate_in_write(ctx, record, "clickhouse/property_values", rows, EXPORT_TXN)
    gate.write(lambda rows: ctx.store.append(EXPORT_OUTBOX, OUTBOX_WRITES[written](rows), [EXPORT_TXN]))
    assert sorted(r["count"] for r in ctx.store.read(EXPORT_OUTBOX).collect()) == [1, 2, 4]
    assert calls.value == 3 and gate.kept_all
    assert outcomes(record) == EXPORT_PASSED_ON_3


@pytest.mark.parametrize("written", list(OUTBOX_WRITES))
def test_an_export_row_failing_a_fail_check_stops_the_outbox_write_before_its_commit(
    spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path, written: str
) -> None:
    ctx = context(spark, engine_settings, tmp_path / "lake")
    ctx.store.ensure(EXPORT_OUTBOX)
    record = RunRecord("export.clickhouse")
    gate = gate_in_write(ctx, record, "clickhouse/property_values", outbox_rows(spark, [1, 0, 2]), EXPORT_TXN)
    with pytest.raises(ExpectationFailed, match=r"count_changes .* failed: 1 of 3 rows"):
        gate.write(lambda rows: ctx.store.append(EXPORT_OUTBOX, OUTBOX_WRITES[written](rows), [EXPORT_TXN]))
    assert (
        ctx.store.read(EXPORT_OUTBOX).count() == 0 and ctx.store.txn_version(EXPORT_OUTBOX, EXPORT_TXN.app_id) is None
    )
    # A count of 0 changes nothing; its total (0) is a gold count ClickHouse may be brought to.
    assert outcomes(record) == {**EXPORT_PASSED_ON_3, "count_changes": ("failed", 3, 1)}
