from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config.settings import load_settings
from pipelines.config.spark import check_java, observed_as_read, spark_confs
from pipelines.errors import EngineUnavailableError, JavaNotFoundError
from tests.helpers import counting_reads


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="install a JDK/JRE 17"):
        check_java()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(JavaNotFoundError, match=r"JAVA_HOME=.*jdk has no bin/java"):
        check_java()


def test_local_session_defaults(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_delta_extension_only_for_the_delta_spark_engine(tmp_path: Path) -> None:
    rs = spark_confs(load_settings(lake_root=str(tmp_path)))
    assert "spark.sql.extensions" not in rs
    ds = spark_confs(load_settings(lake_root=str(tmp_path), delta_engine="delta-spark"))
    assert ds["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    user = spark_confs(load_settings(lake_root=str(tmp_path), spark={"conf": {"spark.sql.shuffle.partitions": "9"}}))
    assert user["spark.sql.shuffle.partitions"] == "9"


def test_local_delta_sessions_rebuild_table_state_in_few_tasks(tmp_path: Path) -> None:
    """Delta's defaults (50 tasks per table-state rebuild, a checkpoint every 10 commits) made a
    3,000-event demo take over 10 minutes on 2 cores; a user's own confs still win."""
    ds = spark_confs(
        load_settings(lake_root=str(tmp_path), delta_engine="delta-spark", spark={"shuffle_partitions": 3})
    )
    assert ds["spark.databricks.delta.snapshotPartitions"] == "3"
    assert ds["spark.databricks.delta.properties.defaults.checkpointInterval"] == "100"
    assert "spark.databricks.delta.snapshotPartitions" not in spark_confs(load_settings(lake_root=str(tmp_path)))
    mine = {"spark.databricks.delta.snapshotPartitions": "50"}
    user = spark_confs(load_settings(lake_root=str(tmp_path), delta_engine="delta-spark", spark={"conf": mine}))
    assert user["spark.databricks.delta.snapshotPartitions"] == "50"


def test_generated_code_is_sparks_default_and_can_be_turned_off(tmp_path: Path) -> None:
    default = spark_confs(load_settings(lake_root=str(tmp_path)))
    assert "spark.sql.codegen.wholeStage" not in default and "spark.sql.codegen.factoryMode" not in default
    off = spark_confs(load_settings(lake_root=str(tmp_path), spark={"generated_code": False}))
    assert off["spark.sql.codegen.wholeStage"] == "false"
    assert off["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    mine = {"spark.sql.codegen.wholeStage": "true"}
    user = spark_confs(load_settings(lake_root=str(tmp_path), spark={"generated_code": False, "conf": mine}))
    assert user["spark.sql.codegen.wholeStage"] == "true", "a user's own confs still win"


def test_dataframe_debugging_is_off_unless_asked_for(tmp_path: Path) -> None:
    key = "spark.python.sql.dataFrameDebugging.enabled"
    assert spark_confs(load_settings(lake_root=str(tmp_path)))[key] == "false"
    assert spark_confs(load_settings(lake_root=str(tmp_path), spark={"dataframe_debugging": True}))[key] == "true"
    user = spark_confs(load_settings(lake_root=str(tmp_path), spark={"conf": {key: "true"}}))
    assert user[key] == "true", "a user's own confs still win"


def test_a_session_the_pipeline_starts_captures_no_call_sites(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyspark's DataFrame debugging walks the Python stack on every function call and hands the
    call site to the JVM; a session built by the pipeline (this one: tests/conftest.py) has it off."""
    import pyspark.errors.utils as pyspark_errors

    captured: list[int] = []
    real = pyspark_errors._capture_call_site
    monkeypatch.setattr(pyspark_errors, "_capture_call_site", lambda depth: captured.append(depth) or real(depth))
    df = spark.range(3).select((F.col("id") + F.lit(1)).alias("n"))
    assert [r.n for r in df.collect()] == [1, 2, 3]
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert captured == []


def test_the_test_session_runs_queries_interpreted(spark: SparkSession) -> None:
    """tests/conftest.py's session: its batches are a few rows (docs/testing.md)."""
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"


def test_delta_jars_that_do_not_exist_are_named(tmp_path: Path) -> None:
    settings = load_settings(lake_root=str(tmp_path), delta_engine="delta-spark", delta_jars=["/nope/delta.jar"])
    with pytest.raises(EngineUnavailableError, match=r"/nope/delta\.jar"):
        spark_confs(settings)


def test_delta_spark_engine_without_jars_is_a_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    from pipelines.config.spark import has_delta_classes

    if has_delta_classes(spark):
        pytest.skip("Delta classes are on this classpath")
    from pipelines.storage.deltaspark import DeltaSparkStore

    with pytest.raises(EngineUnavailableError, match="MEDALLION_DELTA_JARS"):
        DeltaSparkStore(spark, str(tmp_path))


def test_python_workers_use_this_interpreter_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside an activated venv, `python3` on PATH lacks pandas/pyarrow that Python workers need."""
    import sys

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert spark_confs(load_settings())["spark.pyspark.python"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python/bin/python3")
    assert "spark.pyspark.python" not in spark_confs(load_settings())


def test_interpreted_sets_its_confs_for_a_block_and_puts_the_sessions_own_back(spark: SparkSession) -> None:
    from pipelines.config.spark import interpreted

    spark.conf.set("spark.sql.codegen.wholeStage", "true")
    spark.conf.unset("spark.sql.codegen.factoryMode")
    try:
        with interpreted(spark):
            assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
            assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
        assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
        assert spark.conf.get("spark.sql.codegen.factoryMode", None) in (None, "FALLBACK"), "unset again"
    finally:
        spark.conf.set("spark.sql.codegen.wholeStage", "false")
        spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")


def test_conf_blocks_that_overlap_on_a_session_leave_it_with_its_own_value(spark: SparkSession) -> None:
    # Threads sharing a session (one gold stage's buckets on delta-rs) end their blocks in any order:
    # here the first one in is the first one out, which left the second one's value on the session.
    from pipelines.config.spark import session_confs

    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    spark.conf.set(key, "7")
    try:
        first, second = session_confs(spark, {key: "3"}), session_confs(spark, {key: "2"})
        first.__enter__()
        second.__enter__()
        assert spark.conf.get(key) == "2"  # the value set last
        first.__exit__(None, None, None)
        assert spark.conf.get(key) == "2"  # the second block still holds the session
        second.__exit__(None, None, None)
        assert spark.conf.get(key) == "7"
        with session_confs(spark, {key: "3"}):  # a block alone, and one that fails, as before
            assert spark.conf.get(key) == "3"
        with pytest.raises(RuntimeError), session_confs(spark, {key: "3"}):
            raise RuntimeError("the flow failed")
        assert spark.conf.get(key) == "7"
    finally:
        spark.conf.set(key, before)


def test_a_conf_the_session_refuses_to_restore_leaves_the_others_restored_and_no_block_held() -> None:
    from pipelines.config.spark import session_confs

    class Conf:  # a session whose first key cannot be set back (a serverless cluster's refusal)
        def __init__(self) -> None:
            self.values: dict[str, str] = {"a": "1", "b": "1"}
            self.refuse = False

        def get(self, key: str, default: str | None = None) -> str | None:
            return self.values.get(key, default)

        def set(self, key: str, value: str) -> None:
            if self.refuse and key == "a":
                raise RuntimeError("CANNOT_MODIFY_CONFIG")
            self.values[key] = value

        def unset(self, key: str) -> None:
            self.values.pop(key, None)

    class Session:
        conf = Conf()

    session = Session()
    with pytest.raises(RuntimeError, match="CANNOT_MODIFY_CONFIG"), session_confs(session, {"a": "2", "b": "2"}):  # type: ignore[arg-type]
        session.conf.refuse = True
    assert session.conf.values == {"a": "2", "b": "1"}
    session.conf.refuse = False
    with session_confs(session, {"b": "3"}):  # type: ignore[arg-type]
        assert session.conf.values["b"] == "3"
    assert session.conf.values["b"] == "1"  # the failed block holds it no more


def test_a_small_increment_is_planned_whole_over_a_partition_per_core(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.config.spark import small_increment

    settings = load_settings(spark={"small_increment_rows": 100})
    cores = spark.sparkContext.defaultParallelism if hasattr(type(spark), "sparkContext") else None
    before = (spark.conf.get("spark.sql.adaptive.enabled"), spark.conf.get("spark.sql.shuffle.partitions"))
    spark.conf.set("spark.sql.shuffle.partitions", "64")
    try:
        with small_increment(spark, settings, 100):
            assert spark.conf.get("spark.sql.adaptive.enabled") == "false"
            assert spark.conf.get("spark.sql.shuffle.partitions") == str(cores or 64)
            grouped = spark.range(10).groupBy((F.col("id") % 3).alias("k")).count()
            assert grouped.count() == 3
            grouped.explain()
            assert "AdaptiveSparkPlan" not in capsys.readouterr().out
        assert (spark.conf.get("spark.sql.adaptive.enabled"), spark.conf.get("spark.sql.shuffle.partitions")) == (
            before[0],
            "64",
        )
        # Over the limit, not known, or the limit 0 (never): the session plans as it did.
        for rows, limit in ((101, 100), (None, 100), (1, 0)):
            with small_increment(spark, load_settings(spark={"small_increment_rows": limit}), rows):
                assert spark.conf.get("spark.sql.adaptive.enabled") == before[0]
                assert spark.conf.get("spark.sql.shuffle.partitions") == "64"
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before[0])
        spark.conf.set("spark.sql.shuffle.partitions", before[1])


def test_a_small_increment_of_a_flow_reading_its_new_rows_alone_also_runs_interpreted(spark: SparkSession) -> None:
    from pipelines.config.spark import small_increment

    settings = load_settings(spark={"small_increment_rows": 100})
    spark.conf.set("spark.sql.codegen.wholeStage", "true")
    try:
        with small_increment(spark, settings, 1, interpreted=True):
            assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
            assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
        assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
        with small_increment(spark, settings, 1):  # a flow that also reads tables as they are now
            assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
        with small_increment(spark, settings, 101, interpreted=True):  # not small
            assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
    finally:
        spark.conf.set("spark.sql.codegen.wholeStage", "false")
        spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")


def counted_as_read(df: DataFrame) -> tuple[DataFrame, Callable[[], int]]:
    counted, values = observed_as_read(df, rows=F.count(F.lit(1)))
    return counted, lambda: int(values()["rows"])


def test_rows_are_counted_by_the_action_that_reads_them_through_a_cache(spark: SparkSession) -> None:
    # A count of its own would read the 10 rows again (20 calls).
    k, calls = counting_reads(spark, F.col("id") % 3, "long")
    counted, n = counted_as_read(spark.range(10).withColumn("k", k))
    fanned = counted.withColumn("x", F.explode(F.array("k", "k"))).groupBy("x").count().cache()
    try:
        assert sorted(tuple(r) for r in fanned.collect()) == [(0, 8), (1, 6), (2, 6)]
        assert n() == 10 and calls.value == 10
    finally:
        fanned.unpersist()


def test_figures_no_action_gave_are_counted_from_the_cache_the_caller_filled(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.config.spark as spark_config

    k, calls = counting_reads(spark, F.col("id") % 3, "long")
    counted, values = observed_as_read(spark.range(10).withColumn("k", k), rows=F.count(F.lit(1)), total=F.sum("k"))
    cached = counted.persist()
    try:
        assert cached.where("k = 0").count() == 4 and calls.value == 10  # the pass that fills the cache
        monkeypatch.setattr(spark_config, "_given", lambda observed, wait=2.0: False)  # as if it gave none
        assert values() == {"rows": 10, "total": 9}  # 0 + 1 + 2 + 0 + ... (id % 3 for ids 0-9)
        assert calls.value == 10, "counted from the cache, not by computing the rows again"
    finally:
        cached.unpersist()


def test_rows_of_a_frame_spark_knows_is_empty_are_counted_by_a_query_of_their_own(spark: SparkSession) -> None:
    empty, n = counted_as_read(spark.createDataFrame([], "id long"))  # the action runs no observed plan
    assert empty.collect() == [] and n() == 0


def test_rows_no_action_read_are_counted_by_a_query_of_their_own_not_waited_for(spark: SparkSession) -> None:
    _, n = counted_as_read(spark.range(7))  # Spark's own get() would wait for an action without end
    assert n() == 7


def test_an_observation_answered_without_its_figures_is_counted_by_a_query(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark Connect can answer an observation with no figures and no error: as if it had run.
    from pyspark.sql import Observation

    import pipelines.config.spark as spark_config

    monkeypatch.setattr(spark_config, "_given", lambda observed: True)
    monkeypatch.setattr(Observation, "get", property(lambda self: {}))
    counted, n = counted_as_read(spark.range(5))
    assert counted.count() == 5 and n() == 5
