"""The delta-spark engine's shortcut for a table's newest version (Delta's log in the JVM) answers
as ``DESCRIBE HISTORY`` does, and the engine falls back to the SQL where the shortcut is not there."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.settings import load_settings
from pipelines.storage import open_store
from pipelines.storage.deltaspark import DeltaSparkStore
from tests.pipelines.test_storage_contract import SPEC, T0, rows


def history_version(spark: SparkSession, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])


def test_the_newest_version_from_the_log_is_the_newest_commit(delta_spark: SparkSession, tmp_path: Path) -> None:
    store = open_store(load_settings(lake_root=str(tmp_path), delta_engine="delta-spark"), delta_spark)
    assert isinstance(store, DeltaSparkStore) and store._delta_log is not None  # a classic session
    assert store.version(SPEC) is None and not store.exists(SPEC)
    store.ensure(SPEC)
    assert store.version(SPEC) == history_version(delta_spark, store.path(SPEC)) == 0
    for i in range(3):
        assert store.append(SPEC, rows(delta_spark, [("a", 1, i, T0)])) == i + 1
    # A commit by another writer (SQL straight to the table) is seen too: the log is listed again.
    delta_spark.sql(f"DELETE FROM delta.`{store.path(SPEC)}` WHERE n = 0")
    assert store.version(SPEC) == history_version(delta_spark, store.path(SPEC)) == 4


def test_without_the_shortcut_the_sql_answers_the_same(delta_spark: SparkSession, tmp_path: Path) -> None:
    store = open_store(load_settings(lake_root=str(tmp_path), delta_engine="delta-spark"), delta_spark)
    assert isinstance(store, DeltaSparkStore)
    store._delta_log = None  # as over Spark Connect, or with a Delta built under other names
    assert store.version(SPEC) is None
    store.ensure(SPEC)
    assert store.append(SPEC, rows(delta_spark, [("a", 1, 1, T0)])) == 1 == store.version(SPEC)
