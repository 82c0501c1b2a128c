"""Spark Connect: the exactly-once job suite and the storage contract, on a Connect session.

Serverless and standard-access Databricks compute give jobs a Connect session: no JVM, no py4j,
no ``sparkContext``. pyspark's Connect server started here (``remote("local[2]")``) speaks the
same protocol. One process holds one kind of session, so the suites run in a child pytest whose
``spark`` fixture is a Connect session (``MEDALLION_TEST_SPARK_REMOTE``, tests/conftest.py), on
both engines, the delta-spark one with the Delta jars.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REMOTE_ENV
from tests.suites import run_child_suite

SUITES = ["tests/pipelines/test_jobs.py", "tests/pipelines/test_storage_contract.py"]


@pytest.mark.slow
@pytest.mark.integration
def test_the_job_suite_and_storage_contract_pass_over_spark_connect(delta_jars: str, tmp_path: Path) -> None:
    env = {REMOTE_ENV: "local[2]", "MEDALLION_DELTA_JARS": delta_jars}
    counts = run_child_suite(env, SUITES, tmp_path / "connect.xml")
    assert counts["tests"] >= 30, counts  # both engines' runs of both modules
