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
and its store's calls over Connect are the contract's. For the same reason, the job tests that
``NOT_OVER_CONNECT`` names run classic only (about a third of the child's time).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CATALOG_ENV, REMOTE_ENV
from tests.suites import run_child_suite

SUITES = ["tests/pipelines/test_jobs.py", "tests/pipelines/test_storage_contract.py"]
#: Job tests the child leaves to the classic run: a split over buckets (silver's filter on the
#: bucket column, the call a run over every bucket makes, and the runner's look at the other
#: splits' app transactions, the contract's calls), a twin that differs only in a Python-side
#: branch (figures counted after the write; an increment one row over the small limit), and how
#: many commits a landing makes (the engine's, the same over Connect as in process).
NOT_OVER_CONNECT = (
    "test_buckets_run_as_separate_tasks",
    "test_a_run_over_buckets_overlapping",
    "test_bucket_figures and after",
    "test_a_small_increment and 9",
    "test_files_land_in_as_few_commits",
)


@pytest.mark.slow(seconds=400)  # a child pytest with a Connect server: one JVM
@pytest.mark.integration
def test_the_job_suite_and_storage_contract_pass_over_spark_connect_with_tables_by_name(
    delta_jars: str, tmp_path: Path
) -> None:
    env = {REMOTE_ENV: "local[2]", CATALOG_ENV: "spark_catalog", "MEDALLION_DELTA_JARS": delta_jars}
    # The contract on both engines, the jobs by name, less those whose Spark calls over Connect the
    # others make (see the module's docstring).
    only = "-k", f"test_storage_contract or (delta-spark and not ({' or '.join(f'({t})' for t in NOT_OVER_CONNECT)}))"
    counts = run_child_suite(env, SUITES, tmp_path / "connect.xml", *only)
    assert counts["tests"] >= 30, counts


#: In a process of its own: a Connect session on a local master, then where its server listens.
LOCAL_SERVER = """
import json, sys
from pipelines.config.settings import load_settings
from pipelines.config.spark import build_spark, connect_server_port
spark = build_spark(load_settings(lake_root=sys.argv[1], delta_engine="delta-rs", spark={"remote": "local[1]"}))
port = connect_server_port()
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, at = local.rsplit(":", 1)
        if state == "0A" and int(at, 16) == port:  # LISTEN
            listening.add(address)
print(json.dumps({"rows": spark.range(3).count(), "port": port, "listening": sorted(listening)}))
"""


@pytest.mark.slow(seconds=40)  # a process with a JVM and its Connect server
@pytest.mark.integration
def test_a_local_connect_server_listens_on_a_free_loopback_port(tmp_path: Path) -> None:
    """Starts one ``medallion`` Spark session on a local Connect remote while Spark's default port
    (15002) is held, as by a second such process: the server takes a free port on loopback only."""
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", 15002))
            held.listen()
        except OSError:
            pass  # another process holds it: the same case
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDALLION_", "PYSPARK_GATEWAY"))}
        done = subprocess.run(
            [sys.executable, "-c", LOCAL_SERVER, str(tmp_path / "lake")],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,  # a hang guard
        )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["rows"] == 3 and found["port"] != 15002
    assert found["listening"] in (["0100007F"], ["0000000000000000FFFF00000100007F"]), found  # 127.0.0.1
