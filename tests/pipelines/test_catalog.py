"""Tables by name: with ``catalog`` and ``schema`` set, every table is the external Delta table
``<catalog>.<schema>.<layer>_<name>`` over its lake folder, read, written and merged by name.

Locally the catalog is Spark's session catalog (warehouse under the lake); on Databricks it is
Unity Catalog. The session catalog here lives as long as the session, so a new process finds the
tables again by registering the lake's folders: that is what a second store does below.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from pipelines.config.settings import load_settings
from pipelines.storage import AppTxn, open_store
from tests.pipelines.test_storage_contract import SCHEMA, SPEC, T0, rows


def store_in(spark: SparkSession, lake: Path, schema: str):  # type: ignore[no-untyped-def]
    settings = load_settings(lake_root=str(lake), delta_engine="delta-spark", catalog="spark_catalog", schema=schema)
    return open_store(settings, spark)


def test_tables_are_external_catalog_tables_read_written_and_merged_by_name(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    store = store_in(spark, tmp_path / "lake", "medallion_names")
    assert store.ensure(SPEC) is True
    name = "spark_catalog.medallion_names.test_things"
    detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
    assert detail["location"].rstrip("/").endswith(f"{tmp_path}/lake/test/things")
    assert detail["partitionColumns"] == ["part"]
    table_type = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").where("col_name = 'Type'").first()
    assert table_type["data_type"] == "EXTERNAL"

    store.append(SPEC, rows(spark, [("a", 1, 10, T0), ("b", 2, 20, T0)]), txns=[AppTxn("job", 3)])
    store.merge(SPEC, rows(spark, [("a", 1, 5, T0), ("c", 1, 1, T0)]), on="t.k = s.k", update={"n": "t.n + s.n"})
    expected = rows(spark, [("a", 1, 15, T0), ("b", 2, 20, T0), ("c", 1, 1, T0)])
    # Ad-hoc SQL by name, and the engine's reads, and any Delta reader at the path, agree.
    assertDataFrameEqual(spark.sql(f"SELECT * FROM {name}"), expected)
    assertDataFrameEqual(store.read(SPEC), expected)
    assert sorted(DeltaTable(store.path(SPEC)).to_pyarrow_table()["k"].to_pylist()) == ["a", "b", "c"]
    assert store.txn_version(SPEC, "job") == 3
    changes = store.read_inserted(SPEC, 2).select("k", "n")
    assertDataFrameEqual(changes, spark.createDataFrame([("a", 15), ("c", 1)], "k string, n long"))
    operations = [h["operation"] for h in spark.sql(f"DESCRIBE HISTORY {name}").collect()]
    assert operations == ["MERGE", "WRITE", "CREATE TABLE"]


def test_a_new_session_finds_the_tables_again_by_registering_the_lake(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    lake = tmp_path / "lake"
    store_in(spark, lake, "medallion_first").ensure(SPEC)
    store_in(spark, lake, "medallion_first").append(SPEC, rows(spark, [("a", 1, 1, T0)]))
    # Another schema name stands for a catalog that has never seen the lake.
    again = store_in(spark, lake, "medallion_again")
    assert not spark.catalog.tableExists("spark_catalog.medallion_again.test_things")
    assert again.version(SPEC) == 1
    assert spark.catalog.tableExists("spark_catalog.medallion_again.test_things")
    assert again.ensure(SPEC) is False
    assertDataFrameEqual(spark.table("spark_catalog.medallion_again.test_things"), rows(spark, [("a", 1, 1, T0)]))
    assert SCHEMA == spark.table("spark_catalog.medallion_again.test_things").schema


def test_managed_tables_are_the_catalogs_own_files_and_keep_their_progress_by_name(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Unity Catalog's default table kind: created without a location, its files where the catalog
    keeps them (here the session's warehouse), nothing under lake_root; read, written, merged and
    its progress found by name only."""
    spark = delta_spark
    lake = tmp_path / "lake"
    settings = load_settings(
        lake_root=str(lake),
        delta_engine="delta-spark",
        catalog="spark_catalog",
        schema="medallion_managed",
        table_kind="managed",
    )
    name = "spark_catalog.medallion_managed.test_things"
    try:
        store = open_store(settings, spark)
        assert store.ensure(SPEC) is True
        table_type = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").where("col_name = 'Type'").first()
        assert table_type["data_type"] == "MANAGED"
        location = spark.sql(f"DESCRIBE DETAIL {name}").first()["location"]
        assert str(lake) not in location and "_spark_warehouse" in location

        store.append(SPEC, rows(spark, [("a", 1, 10, T0), ("b", 2, 20, T0)]), txns=[AppTxn("job", 3)])
        store.merge(SPEC, rows(spark, [("a", 1, 5, T0), ("c", 1, 1, T0)]), on="t.k = s.k", update={"n": "t.n + s.n"})
        store.append(SPEC, rows(spark, [("d", 1, 1, T0)]), txns=[AppTxn("other", 1)])
        expected = rows(spark, [("a", 1, 15, T0), ("b", 2, 20, T0), ("c", 1, 1, T0), ("d", 1, 1, T0)])
        assertDataFrameEqual(spark.sql(f"SELECT * FROM {name}"), expected)
        # A new store (a new job) finds each source's progress from the commits' info, by name.
        fresh = open_store(settings, spark)
        assert {a: fresh.txn_version(SPEC, a) for a in ("job", "other", "never")} == {
            "job": 3,
            "other": 1,
            "never": None,
        }
        # A batch sent twice is refused by Delta's own check of the app transaction.
        fresh.append(SPEC, rows(spark, [("z", 9, 9, T0)]), txns=[AppTxn("job", 3)])
        assertDataFrameEqual(fresh.read(SPEC), expected)
        assert not lake.exists() or not any(lake.rglob("_delta_log"))
    finally:
        spark.sql("DROP SCHEMA IF EXISTS spark_catalog.medallion_managed CASCADE")


def test_the_history_window_ends_at_the_version_asked_even_with_commits_after_it(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    store = store_in(spark, tmp_path / "lake", "medallion_window")
    store.ensure(SPEC)  # version 0
    for i in range(1, 6):  # versions 1..5, each recording job at i
        store.append(SPEC, rows(spark, [(f"k{i}", 1, i, T0)]), txns=[AppTxn("job", i)])
    # Asked for the 2 commits up to version 3 while 4 and 5 are newer: 3 and 2, not 3 alone.
    assert [v for v, _ in store.txns.history_commits(SPEC, 2, 3)] == [3, 2]
    assert [v for v, _ in store.txns.history_commits(SPEC, 10, 3)] == [3, 2, 1, 0]  # history ends


def test_catalog_names_need_both_parts_and_the_delta_spark_engine(tmp_path: Path) -> None:
    from pipelines.errors import SettingsError

    with pytest.raises(SettingsError, match="together"):
        load_settings(lake_root=str(tmp_path), delta_engine="delta-spark", catalog="main")
    with pytest.raises(SettingsError, match="delta-spark"):
        load_settings(lake_root=str(tmp_path), catalog="main", schema="medallion")
    with pytest.raises(SettingsError, match="managed"):
        load_settings(lake_root=str(tmp_path), delta_engine="delta-spark", table_kind="managed")
