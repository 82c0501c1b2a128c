"""The storage contract for backfills, on every engine: rows replaced where a condition holds (with
the change feed of both sides, and a guard against another writer's progress), a version read
back as it was, and a column's least value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from pipelines.errors import CommitConflictError
from pipelines.storage import AppTxn, TableStore
from tests.pipelines.test_storage_contract import SPEC, T0, rows


@pytest.fixture
def store(store_for: Callable[[Path | str], TableStore], tmp_path: Path) -> TableStore:
    """The store of the engine under test on a fresh lake."""
    return store_for(tmp_path)


def test_replace_swaps_the_rows_where_its_condition_holds_and_the_change_feed_shows_both_sides(
    store: TableStore, spark: SparkSession
) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0), ("b", 1, 2, T0), ("c", 2, 3, T0), ("d", 3, 4, T0)]))
    v = store.replace(SPEC, rows(spark, [("a", 1, 0, T0), ("e", 2, 3, T0)]), "n <= 3", [AppTxn("backfill", 1)])
    # Rows with n <= 3 (a, b, c) are gone, d (n = 4) stays, the new rows are in.
    expected = rows(spark, [("a", 1, 0, T0), ("d", 3, 4, T0), ("e", 2, 3, T0)])
    assertDataFrameEqual(store.read(SPEC), expected)
    assert store.txn_version(SPEC, "backfill") == 1
    changes = store.read_changes(SPEC, v, v).select("k", "n", "_change_type")
    assertDataFrameEqual(
        changes,
        spark.createDataFrame(
            [("a", 1, "delete"), ("b", 2, "delete"), ("c", 3, "delete"), ("a", 0, "insert"), ("e", 3, "insert")],
            "k string, n long, _change_type string",
        ),
    )


def test_a_replace_guarded_by_another_writers_progress_fails_when_that_writer_moved_on(
    store: TableStore, spark: SparkSession
) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), [AppTxn("stage", 3)])
    snap = store.txn_snapshot(SPEC, ["stage"])
    guard = AppTxn("stage", snap.versions["stage"] or 0)
    # Nobody moved: the guard holds, and the writer's progress stays where it was.
    store.replace(SPEC, rows(spark, [("a", 1, 2, T0)]), "k = 'a'", [AppTxn("backfill", 1), guard], snap.table_version)
    assert store.txn_version(SPEC, "stage") == 3
    snap = store.txn_snapshot(SPEC, ["stage"])
    store.append(SPEC, rows(spark, [("b", 1, 1, T0)]), [AppTxn("stage", 4)])  # the writer moves on
    with pytest.raises(CommitConflictError):
        store.replace(
            SPEC, rows(spark, [("a", 1, 9, T0)]), "k = 'a'", [AppTxn("backfill", 2), guard], snap.table_version
        )
    assert store.txn_version(SPEC, "stage") == 4
    # delta-rs checks it inside the commit (nothing written); delta-spark before and after its own.
    if store.engine == "delta-rs":
        assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 2, T0), ("b", 1, 1, T0)]))


def test_a_version_reads_back_as_it_was_and_the_least_value_is_the_tables(
    store: TableStore, spark: SparkSession
) -> None:
    store.ensure(SPEC)
    assert store.least(SPEC, "n") is None
    v1 = store.append(SPEC, rows(spark, [("a", 1, 5, T0)]))
    store.append(SPEC, rows(spark, [("b", 2, 3, T0)]))
    assertDataFrameEqual(store.read_at(SPEC, v1), rows(spark, [("a", 1, 5, T0)]))
    assert store.least(SPEC, "n") == 3
    assert store.least(SPEC, "ts") is not None


def test_rows_a_replace_put_in_did_not_arrive_so_a_read_of_what_arrived_leaves_them_out(
    store: TableStore, spark: SparkSession
) -> None:
    store.ensure(SPEC)
    first = store.append(SPEC, rows(spark, [("a", 1, 1, T0), ("b", 1, 2, T0)]))
    replaced = store.replace(SPEC, rows(spark, [("a", 1, 5, T0)]), "k = 'a'", [AppTxn("backfill", 1)])
    last = store.append(SPEC, rows(spark, [("c", 2, 3, T0)]))
    assert store.replaces(SPEC, first, last) == [replaced]
    # What arrived: both appends' rows, not the replace's (nor the rows it removed).
    arrived = store.read_inserted(SPEC, first, last).select("k", "n")
    assertDataFrameEqual(arrived, spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], "k string, n long"))
    assert store.replaces(SPEC, last, last) == []
