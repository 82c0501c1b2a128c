"""The storage contract: every engine behaves the same on the same operations."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType
from pyspark.testing import assertDataFrameEqual

from pipelines.errors import CommitConflictError
from pipelines.spark import has_delta_classes
from pipelines.storage import AppTxn, TableSpec, TableStore
from pipelines.storage.deltars import DeltaRsStore

SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("part", LongType()),
        StructField("n", LongType()),
        StructField("ts", TimestampType()),
    ]
)
SPEC = TableSpec("test", "things", SCHEMA, partition_by=("part",), description="contract table")
T0 = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["delta-rs", "delta-spark"])
def store(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> TableStore:
    if request.param == "delta-spark":
        if not has_delta_classes(spark):
            pytest.skip(
                "delta-spark engine: Delta Lake JVM classes are not on the classpath "
                "(set MEDALLION_DELTA_JARS to the delta-spark and delta-storage jars to run it)"
            )
        from pipelines.storage.deltaspark import DeltaSparkStore

        return DeltaSparkStore(spark, str(tmp_path))
    return DeltaRsStore(spark, str(tmp_path))


def rows(spark: SparkSession, data: list[tuple]):  # type: ignore[no-untyped-def]
    return spark.createDataFrame(data, SCHEMA)


def test_ensure_creates_once_with_cdf_and_partitioning(store: TableStore) -> None:
    assert store.version(SPEC) is None
    assert store.ensure(SPEC) is True
    assert store.ensure(SPEC) is False
    assert store.version(SPEC) == 0
    dt = DeltaTable(store.path(SPEC))
    assert dt.metadata().partition_columns == ["part"]
    assert dt.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert store.path(SPEC).endswith("/test/things")


def test_append_and_read_round_trip(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    data = [("a", 1, 10, T0), ("b", 2, 20, T0), ("c", 1, None, None)]
    v = store.append(SPEC, rows(spark, data))
    assert v == 1
    assertDataFrameEqual(store.read(SPEC), rows(spark, data))
    assertDataFrameEqual(store.read(SPEC, where="part = 1"), rows(spark, [data[0], data[2]]))


def test_append_accepts_arrow_and_fills_missing_nullable_columns(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, pa.table({"k": ["x"], "part": [3]}))
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("x", 3, None, None)]))


def test_app_transaction_is_recorded_in_the_same_commit(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    assert store.txn_version(SPEC, "job-a") is None
    v = store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=[AppTxn("job-a", 7)])
    assert store.txn_version(SPEC, "job-a") == 7
    assert store.txn_version(SPEC, "job-b") is None
    store.merge(SPEC, rows(spark, [("a", 1, 5, T0)]), on="t.k = s.k", txns=[AppTxn("job-a", 8)])
    assert store.txn_version(SPEC, "job-a") == 8
    assert store.version(SPEC) == v + 1


def test_several_app_transactions_in_one_commit(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaRsStore(spark, str(tmp_path))
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=[AppTxn("g/t/0", 41), AppTxn("g/t/1", 99)])
    assert store.version(SPEC) == 1
    assert (store.txn_version(SPEC, "g/t/0"), store.txn_version(SPEC, "g/t/1")) == (41, 99)


def test_merge_updates_matches_with_expressions_and_inserts_the_rest(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 10, T0), ("b", 1, 20, T0)]))
    store.merge(
        SPEC,
        rows(spark, [("a", 1, 5, T0), ("z", 2, 1, T0)]),
        on="t.k = s.k AND t.part = s.part",
        update={"n": "t.n + s.n"},
    )
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 15, T0), ("b", 1, 20, T0), ("z", 2, 1, T0)]))


def test_read_changes_returns_inserts_and_update_images_by_version(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    v1 = store.append(SPEC, rows(spark, [("a", 1, 10, T0)]))
    v2 = store.merge(SPEC, rows(spark, [("a", 1, 5, T0), ("b", 1, 1, T0)]), on="t.k = s.k", update={"n": "t.n + s.n"})
    changes = store.read_changes(SPEC, v2).select("k", "n", "_change_type", "_commit_version")
    assertDataFrameEqual(
        changes,
        spark.createDataFrame(
            [("a", 10, "update_preimage", v2), ("a", 15, "update_postimage", v2), ("b", 1, "insert", v2)],
            "k string, n long, _change_type string, _commit_version long",
        ),
    )
    inserted = store.read_inserted(SPEC, v1, v2).select("k", "n", "_commit_version")
    assertDataFrameEqual(
        inserted,
        spark.createDataFrame([("a", 10, v1), ("a", 15, v2), ("b", 1, v2)], "k string, n long, _commit_version long"),
    )


def test_delete_history_stats_and_maintenance(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]))
    store.append(SPEC, rows(spark, [("b", 2, 2, T0), ("c", 2, 3, T0)]))
    store.delete(SPEC, "k = 'b'")
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 1, T0), ("c", 2, 3, T0)]))
    stats = store.stats(SPEC)
    assert (stats.key, stats.version, stats.rows) == ("test/things", 3, 2)
    assert stats.last_write is not None
    assert [h["version"] for h in store.history(SPEC)][:2] == [3, 2]
    store.optimize(SPEC)
    store.vacuum(SPEC, retention_hours=168)
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 1, T0), ("c", 2, 3, T0)]))


def test_concurrent_appends_all_land(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaRsStore(spark, str(tmp_path))
    store.ensure(SPEC)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            store.append(SPEC, pa.table({"k": [f"w{i}-{j}" for j in range(5)], "part": [i % 2] * 5}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] or all(isinstance(e, CommitConflictError) for e in errors)
    assert store.stats(SPEC).rows == 5 * (6 - len(errors))
    assert errors == []


def test_append_through_a_snapshot_conflicts_with_a_later_commit_of_the_same_app(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = DeltaRsStore(spark, str(tmp_path))
    store.ensure(SPEC)
    snap = store.txn_snapshot(SPEC, ["kafka/g/t/0"])
    assert dict(snap.versions) == {"kafka/g/t/0": None}
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=[AppTxn("kafka/g/t/0", 10)])
    # Another app id committed since the snapshot does not conflict ...
    store.append(SPEC, rows(spark, [("b", 1, 1, T0)]), [AppTxn("kafka/g/t/1", 5)], read_version=snap.table_version)
    # ... the same one does: the check made at the snapshot no longer holds.
    with pytest.raises(CommitConflictError):
        store.append(SPEC, rows(spark, [("c", 1, 1, T0)]), [AppTxn("kafka/g/t/0", 20)], read_version=snap.table_version)
    assert store.txn_version(SPEC, "kafka/g/t/0") == 10
    assert store.stats(SPEC).rows == 2


def test_overwrite_replaces_every_row_and_records_the_txn(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0), ("b", 2, 2, T0)]))
    store.overwrite(SPEC, rows(spark, [("z", 3, 9, T0)]), txns=[AppTxn("state", 4)])
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("z", 3, 9, T0)]))
    assert store.txn_version(SPEC, "state") == 4
