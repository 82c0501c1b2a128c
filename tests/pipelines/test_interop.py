"""Interop: a table one engine writes is read by the other side of Delta as it was written.

Tables written by the delta-rs engine through the store API (create, an append recording an app
transaction, a MERGE recording the next) are read by Delta on Spark: rows, change data feed,
``DESCRIBE HISTORY`` and the app transaction. Tables written the same way by the delta-spark engine
are read by the ``deltalake`` package. Every test needs the Delta jars (see ``delta_spark`` in
tests/conftest.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType
from pyspark.testing import assertDataFrameEqual

from pipelines.config.settings import load_settings
from pipelines.storage import CHANGE_TYPE, COMMIT_VERSION, AppTxn, TableSpec, TableStore, open_store

SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("part", LongType()),
        StructField("n", LongType()),
        StructField("ts", TimestampType()),
    ]
)
SPEC = TableSpec("interop", "things", SCHEMA, partition_by=("part",), description="interop table")
COLUMNS = [f.name for f in SCHEMA.fields]
CHANGE_COLUMNS = [*COLUMNS, CHANGE_TYPE, COMMIT_VERSION]
CHANGE_DDL = "k string, part long, n long, ts timestamp, _change_type string, _commit_version long"
APP = "medallion/interop<-test"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
T1 = datetime(2024, 1, 1, 0, 5, tzinfo=UTC)

APPENDED = [("a", 1, 10, T0), ("b", 2, 20, T0)]  # version 1, app transaction APP -> 1
MERGED = [("a", 1, 5, T1), ("c", 1, 1, T1)]  # version 2: a is updated (n added), c inserted; APP -> 2
FINAL = [("a", 1, 15, T1), ("b", 2, 20, T0), ("c", 1, 1, T1)]
CHANGES = [
    ("a", 1, 10, T0, "insert", 1),
    ("b", 2, 20, T0, "insert", 1),
    ("a", 1, 10, T0, "update_preimage", 2),
    ("a", 1, 15, T1, "update_postimage", 2),
    ("c", 1, 1, T1, "insert", 2),
]


def open_engine(engine: str, spark: SparkSession, lake: Path) -> TableStore:
    return open_store(load_settings(lake_root=str(lake), delta_engine=engine), spark)


def write_through_the_store(store: TableStore, spark: SparkSession) -> list[tuple[int, str]]:
    """Versions 0 (create), 1 (append) and 2 (MERGE); the (version, operation) pairs the writer logged."""
    assert store.ensure(SPEC) is True
    assert store.append(SPEC, spark.createDataFrame(APPENDED, SCHEMA), txns=[AppTxn(APP, 1)]) == 1
    version = store.merge(
        SPEC,
        spark.createDataFrame(MERGED, SCHEMA),
        on="t.k = s.k AND t.part = s.part",
        update={"n": "t.n + s.n", "ts": "s.ts"},
        txns=[AppTxn(APP, 2)],
    )
    assert version == 2
    assert store.txn_version(SPEC, APP) == 2
    return [(int(h["version"]), str(h["operation"])) for h in store.history(SPEC)]


def as_tuples(rows: list[dict[str, Any]], columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in rows)


# --------------------------------------------------------------------------------------------------
# delta-rs writes, Delta on Spark reads
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def by_delta_rs(delta_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """(lake root, the writer's history) of a table the delta-rs engine wrote."""
    lake = tmp_path_factory.mktemp("by-delta-rs")
    store = open_engine("delta-rs", delta_spark, lake)
    assert store.engine == "delta-rs"
    return lake, write_through_the_store(store, delta_spark)


def test_delta_on_spark_reads_the_rows_delta_rs_wrote(
    delta_spark: SparkSession, by_delta_rs: tuple[Path, list]
) -> None:
    lake, _ = by_delta_rs
    path = str(lake / SPEC.layer / SPEC.name)
    assertDataFrameEqual(delta_spark.read.format("delta").load(path), delta_spark.createDataFrame(FINAL, SCHEMA))


def test_delta_on_spark_reads_the_change_feed_delta_rs_wrote(
    delta_spark: SparkSession, by_delta_rs: tuple[Path, list]
) -> None:
    lake, _ = by_delta_rs
    changes = (
        delta_spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(str(lake / SPEC.layer / SPEC.name))
        .select(*CHANGE_COLUMNS)
    )
    assertDataFrameEqual(changes, delta_spark.createDataFrame(CHANGES, CHANGE_DDL))


def test_delta_on_spark_lists_the_commits_delta_rs_made(
    delta_spark: SparkSession, by_delta_rs: tuple[Path, list]
) -> None:
    lake, written = by_delta_rs
    history = delta_spark.sql(f"DESCRIBE HISTORY delta.`{lake / SPEC.layer / SPEC.name}`").select(
        "version", "operation"
    )
    assert [v for v, _ in written] == [2, 1, 0] and written[0][1] == "MERGE"
    assertDataFrameEqual(history, delta_spark.createDataFrame(written, "version long, operation string"))


def test_the_delta_spark_engine_reads_what_delta_rs_wrote_with_its_app_transaction(
    delta_spark: SparkSession, by_delta_rs: tuple[Path, list]
) -> None:
    lake, _ = by_delta_rs
    store = open_engine("delta-spark", delta_spark, lake)
    assert (store.version(SPEC), store.txn_version(SPEC, APP), store.txn_version(SPEC, "other")) == (2, 2, None)
    assertDataFrameEqual(store.read(SPEC), delta_spark.createDataFrame(FINAL, SCHEMA))
    assertDataFrameEqual(
        store.read_changes(SPEC, 1, 2).select(*CHANGE_COLUMNS), delta_spark.createDataFrame(CHANGES, CHANGE_DDL)
    )


# --------------------------------------------------------------------------------------------------
# delta-spark writes, the deltalake package reads
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def by_delta_spark(delta_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """(lake root, the writer's history) of a table the delta-spark engine wrote."""
    lake = tmp_path_factory.mktemp("by-delta-spark")
    store = open_engine("delta-spark", delta_spark, lake)
    assert store.engine == "delta-spark"
    return lake, write_through_the_store(store, delta_spark)


def deltalake_table(lake: Path) -> DeltaTable:
    return DeltaTable(str(lake / SPEC.layer / SPEC.name))


def test_deltalake_reads_the_rows_delta_spark_wrote(by_delta_spark: tuple[Path, list]) -> None:
    lake, _ = by_delta_spark
    assert as_tuples(deltalake_table(lake).to_pyarrow_table().to_pylist(), COLUMNS) == sorted(FINAL)


def test_deltalake_reads_the_change_feed_delta_spark_wrote(by_delta_spark: tuple[Path, list]) -> None:
    lake, _ = by_delta_spark
    changes = pa.RecordBatchReader.from_stream(deltalake_table(lake).load_cdf(starting_version=0)).read_all()
    assert as_tuples(changes.to_pylist(), CHANGE_COLUMNS) == sorted(CHANGES)


def test_deltalake_lists_the_commits_and_app_transaction_delta_spark_made(by_delta_spark: tuple[Path, list]) -> None:
    lake, written = by_delta_spark
    table = deltalake_table(lake)
    assert [v for v, _ in written] == [2, 1, 0] and written[0][1] == "MERGE"
    assert [(int(h["version"]), h["operation"]) for h in table.history()] == written
    assert (table.version(), table.transaction_version(APP), table.transaction_version("other")) == (2, 2, None)


def test_the_delta_rs_engine_reads_what_delta_spark_wrote_with_its_app_transaction(
    delta_spark: SparkSession, by_delta_spark: tuple[Path, list]
) -> None:
    lake, _ = by_delta_spark
    store = open_engine("delta-rs", delta_spark, lake)
    assert (store.version(SPEC), store.txn_version(SPEC, APP), store.txn_version(SPEC, "other")) == (2, 2, None)
    assertDataFrameEqual(store.read(SPEC), delta_spark.createDataFrame(FINAL, SCHEMA))
    assertDataFrameEqual(
        store.read_changes(SPEC, 1, 2).select(*CHANGE_COLUMNS), delta_spark.createDataFrame(CHANGES, CHANGE_DDL)
    )
