"""Spark Connect with tables by name: the exactly-once job suite and the storage contract, as
serverless and standard-access Databricks compute run them.

That compute gives jobs a Connect session (no JVM, no py4j, no ``sparkContext``) and Unity
Catalog tables. pyspark's Connect server started here (``remote("local[2]")``) speaks the same
protocol, and Spark's session catalog stands for the metastore. One process holds one kind of
session, so the suites run in a child pytest whose ``spark`` fixture is a Connect session
(``MEDALLION_TEST_SPARK_REMOTE``) and whose delta-spark lakes name their tables
(``MEDALLION_TEST_CATALOG``, tests/conftest.py), on both engines: delta-spark by name, delta-rs
(which has no catalog) by path.

One child run holds both modes: each is a configuration of the same suites, and together they are
the one Databricks runs. The parent process runs the suites classic and by path; a classic
session by name is ``tests/pipelines/test_catalog.py``'s.

The job suite runs on delta-spark by name, the configuration Databricks runs; the storage
contract runs on both engines. The job suite on delta-rs over Connect (about a fifth of the
child's time) proved nothing these two do not: its flows' Spark calls are the delta-spark run's,
and its store's calls over Connect are the contract's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CATALOG_ENV, REMOTE_ENV
from tests.suites import run_child_suite

SUITES = ["tests/pipelines/test_jobs.py", "tests/pipelines/test_storage_contract.py"]


@pytest.mark.slow(seconds=400)  # a child pytest with a Connect server: one JVM
@pytest.mark.integration
def test_the_job_suite_and_storage_contract_pass_over_spark_connect_with_tables_by_name(
    delta_jars: str, tmp_path: Path
) -> None:
    env = {REMOTE_ENV: "local[2]", CATALOG_ENV: "spark_catalog", "MEDALLION_DELTA_JARS": delta_jars}
    only = "-k", "test_storage_contract or delta-spark"  # the contract on both engines, the jobs by name
    counts = run_child_suite(env, SUITES, tmp_path / "connect.xml", *only)
    assert counts["tests"] >= 30, counts
