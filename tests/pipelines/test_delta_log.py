"""The delta-spark engine's shortcuts through Delta's log in the JVM answer as the engine's other
routes do: a table's newest version as ``DESCRIBE HISTORY``, its app transactions as the reads of
``_delta_log`` (checkpoint and commits); and the engine falls back to those where the shortcut is
not there or is at another version."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.storage import AppTxn, TableSpec, open_store
from pipelines.storage.deltaspark import DeltaSparkStore
from tests.pipelines.test_storage_contract import SCHEMA, SPEC, T0, rows


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


def test_app_transactions_from_the_jvm_are_those_the_log_reads_give_across_checkpoints(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    settings = load_settings(lake_root=str(tmp_path), delta_engine="delta-spark")
    jvm, reads = (open_store(settings, delta_spark) for _ in range(2))
    assert isinstance(jvm, DeltaSparkStore) and isinstance(reads, DeltaSparkStore) and jvm._delta_log is not None
    reads._delta_log = None  # as over Spark Connect: the log's checkpoint and commits are read
    spec = TableSpec("test", "checkpointed", SCHEMA, properties={"delta.checkpointInterval": "2"})
    jvm.ensure(spec)
    expected: dict[str, int | None] = {"a": None, "b": None, "c": None}
    versions = []
    for i, app in enumerate(["a", "b", "a", "b", "a", "c", "b"]):
        versions.append(jvm.append(spec, rows(delta_spark, [(app, 1, i, T0)]), txns=[AppTxn(app, 10 * i)]))
        expected[app] = 10 * i
        assert jvm.txn_versions(spec, list(expected)) == expected == reads.txn_versions(spec, list(expected)), i
        # ...and the JVM's snapshot gave it, not a fallback to the reads
        assert jvm._delta_log.txn_versions_at(jvm.location(spec), versions[-1], list(expected)) == expected
    assert any((Path(jvm.path(spec)) / "_delta_log").glob("*.checkpoint*.parquet")), "checkpoints were asked for"
    # An older version than the JVM's newest snapshot: the log reads answer it, as of that version.
    then = {"a": 40, "b": 30, "c": None}
    assert jvm.txn_snapshot(spec, list(then)).table_version == versions[-1]
    assert jvm._delta_log.txn_versions_at(jvm.location(spec), versions[4], list(then)) is None
    fresh = open_store(settings, delta_spark)
    assert isinstance(fresh, DeltaSparkStore)
    assert fresh.txns.at(spec, versions[4], list(then)) == then
