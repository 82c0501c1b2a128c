"""Shared fixtures: one local Spark session for the whole test run, and the storage engine under test."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.config.settings import Settings, load_settings
from pipelines.config.spark import build_spark, has_delta_classes
from pipelines.storage import TableStore, open_store

# Real servers for integration tests: kafka_broker (tests/infra/broker.py); node_exporter,
# prometheus_factory and vmagent_factory (tests/infra/metrics_servers.py); spark_cluster
# (tests/infra/spark_cluster.py); and the small demo lake that several modules read (demo_lake).
pytest_plugins = [
    "tests.infra.broker",
    "tests.infra.metrics_servers",
    "tests.infra.spark_cluster",
    "tests.demo_lake",
]
# tests.infra's modules are imported here too (for require_or_skip) and by test modules, so register
# the package (every module under it) for assert rewriting before that import.
pytest.register_assert_rewrite("tests.infra")
from tests.infra.common import require_or_skip  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

ENGINES = ("delta-rs", "delta-spark")
DELTA_JARS_ENV = "MEDALLION_DELTA_JARS"
NO_DELTA_JARS = (
    "delta-spark engine: the Delta Lake JVM classes are not on the test Spark session's classpath; "
    f"set {DELTA_JARS_ENV} to the comma-separated Delta jars, e.g. "
    f"{DELTA_JARS_ENV}=$(ls ../shared/delta-jars/*.jar | paste -sd, -)"
)


#: Workers for ``-n auto`` (pyproject's addopts); unset, one per core while memory allows.
WORKERS_ENV = "MEDALLION_TEST_WORKERS"
#: What one worker may hold at its peak: its own Spark session (a 2 GiB heap) and the JVMs a test
#: starts beside it (a demo, a Connect server, a cluster's master, worker and executor).
WORKER_MEMORY_GIB = 6
#: Cores per worker. One test process alone leaves a third of 2 cores idle over a whole run (its
#: services' own pace, sleeps, JVM start-up); two workers on 2 cores fill it: 35:04 of tests
#: against 46:04 with one (docs/testing.md).
CORES_PER_WORKER = 1


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: ``MEDALLION_TEST_WORKERS``, else one worker per core while memory allows."""
    if os.environ.get(WORKERS_ENV):
        return max(0, int(os.environ[WORKERS_ENV]))
    cores = len(os.sched_getaffinity(0))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cores // CORES_PER_WORKER, int(memory_gib // WORKER_MEMORY_GIB)))


def _group(item: pytest.Item) -> str:
    """The unit the scheduler hands to one worker: an ``xdist_group``, else the test alone."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow work first, never deselected: a group with a ``slow`` test goes ahead of the rest, the
    longest declared first (``slow(seconds=N)``), so the last test to finish is a short one. A group's
    tests stay together and in file order, so a module's fixtures are built once per worker."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return  # one worker, or none: file order, and the last test to finish is the last one
    weight: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        group = _group(item)
        first.setdefault(group, index)
        mark = item.get_closest_marker("slow")
        if mark is not None:
            weight[group] = weight.get(group, 0.0) + float(mark.kwargs.get("seconds", 60))
    items.sort(key=lambda item: (-weight.get(_group(item), 0.0), first[_group(item)]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a worker of ``--dist loadgroup``, every grouped test's id must carry its group, else the
    scheduler splits a group across workers and its shared fixtures are built twice."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    split = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if split:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(split)} tests (e.g. {split[0]}): this pytest keeps node ids "
            "where xdist's loadgroup cannot add the group; install the versions in .ci/constraints.txt"
        )


#: Set (e.g. to ``local[2]``), the test session is a Spark Connect session on that remote:
#: ``tests/pipelines/test_connect.py`` runs the job suite this way in a child pytest (with ``CATALOG_ENV``).
REMOTE_ENV = "MEDALLION_TEST_SPARK_REMOTE"
#: Set to a catalog (e.g. ``spark_catalog``), the delta-spark engine under test names its tables
#: ``<catalog>.medallion_<lake>.<layer>_<name>``: ``tests/pipelines/test_connect.py`` runs the job
#: suite this way in a child pytest, over Spark Connect.
CATALOG_ENV = "MEDALLION_TEST_CATALOG"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    remote = os.environ.get(REMOTE_ENV) or None
    settings = load_settings(
        lake_root=str(tmp_path_factory.mktemp("spark-lake")),
        spark={
            "shuffle_partitions": 2,
            "master": "local[2]",
            "driver_memory": "2g",
            "remote": remote,
            # The tests' batches are a few rows, planned anew each run: compiling generated code for
            # each query cost more than running it interpreted (14-19% of the in-process Spark
            # tests' time, measured in docs/testing.md). The tests that run `medallion` in a process
            # of its own (the demo, the bench, the cluster) keep Spark's default, as users do.
            "generated_code": False,
        },
        # With jars given, the session gets the Delta extension so the delta-spark engine can run.
        delta_engine="delta-spark" if os.environ.get(DELTA_JARS_ENV) else "delta-rs",
    )
    session = build_spark(settings)
    if os.environ.get(CATALOG_ENV):
        from tests.infra.no_log_paths import forbid_delta_log_paths

        forbid_delta_log_paths()  # tables by name: through the catalog, never at _delta_log
    if remote:
        from pyspark.sql.utils import is_remote

        assert is_remote(), f"{REMOTE_ENV}={remote} but the test session is not a Spark Connect session"
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted at a fresh lake folder, no config file or env leaking in."""
    return load_settings(lake_root=str(tmp_path / "lake"))


@pytest.fixture(scope="session")
def delta_spark(spark: SparkSession) -> SparkSession:
    """The session, once it is known to run Delta on Spark: the Delta jars are on its classpath.

    Without them the tests that need it skip with how to provide them (and fail under
    ``MEDALLION_TEST_REQUIRE_REAL=1``, as CI runs them).
    """
    if not has_delta_classes(spark):
        require_or_skip(NO_DELTA_JARS)
    return spark


@pytest.fixture(scope="session")
def delta_jars() -> str:
    """``MEDALLION_DELTA_JARS`` for a subprocess that runs the delta-spark engine (skip as ``delta_spark``)."""
    jars = [j.strip() for j in os.environ.get(DELTA_JARS_ENV, "").split(",") if j.strip()]
    missing = [j for j in jars if not Path(j).is_file()]
    if not jars or missing:
        require_or_skip(NO_DELTA_JARS + (f" (these do not exist: {', '.join(missing)})" if missing else ""))
    return ",".join(jars)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The storage engine under test; a test using it runs once per engine.

    The delta-spark run needs the Delta jars (see ``delta_spark``); subprocesses a test starts
    inherit ``MEDALLION_DELTA_JARS`` from this environment.
    """
    name = str(request.param)
    if name == "delta-spark":
        request.getfixturevalue("delta_spark")
    return name


@pytest.fixture
def engine_settings(engine: str) -> Callable[..., Settings]:
    """``engine_settings(lake_root, **overrides)``: settings for a lake on the engine under test."""

    def build(lake_root: Path | str, **overrides: object) -> Settings:
        catalog = os.environ.get(CATALOG_ENV)
        if catalog and engine == "delta-spark":
            # One schema per lake: tests share the session's catalog, never its tables.
            digest = hashlib.sha1(str(lake_root).encode()).hexdigest()[:12]
            overrides = {"catalog": catalog, "schema": f"medallion_{digest}", **overrides}
        return load_settings(lake_root=str(lake_root), delta_engine=engine, **overrides)

    return build


@pytest.fixture
def store_for(engine_settings: Callable[..., Settings], spark: SparkSession) -> Callable[[Path | str], TableStore]:
    """``store_for(lake_root)``: the engine under test's store for a lake, as the pipeline opens it."""

    def build(lake_root: Path | str) -> TableStore:
        return open_store(engine_settings(lake_root), spark)

    return build
