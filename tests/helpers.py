"""Helpers shared by tests: landing frames from raw records, fixture files."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark import Accumulator
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bronze.landing import LANDING_SCHEMA
from pipelines.config.settings import RemoteWriteSettings, env_name
from pipelines.demo.data import PAGE_CHANGE_FILES
from pipelines.runtime.tables import BRONZE_QUARANTINE, BRONZE_SAMPLES
from pipelines.sources.files import file_digests, landing_rows
from pipelines.sources.remote_write_receiver import Receiver
from pipelines.sources.remote_write_server import serve
from pipelines.storage.conform import conform_df
from pipelines.storage.deltars import DeltaRsStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def once_per_identity(events: list[dict]) -> list[dict]:
    """``events`` as an event sent twice is counted: the first of each (team_id, uuid). (The
    shipped PostHog fixture holds six events twice, with the same content.)"""
    seen: set[tuple] = set()
    first = []
    for e in events:
        if (e["team_id"], e["uuid"]) not in seen:
            seen.add((e["team_id"], e["uuid"]))
            first.append(e)
    return first


def landing(spark: SparkSession, records: list[bytes], name: str = "/tmp/input.jsonl") -> DataFrame:
    """A landing DataFrame (bronze parser input) holding ``records`` as the records of one file."""
    n = len(records)
    table = pa.table(
        {
            "value": pa.array(records, pa.binary()),
            "source": pa.array(["file"] * n, pa.string()),
            "offset": pa.array(range(n), pa.int64()),
            "source_file": pa.array([name] * n, pa.string()),
            "ingest_time": pa.array([NOW] * n, pa.timestamp("us", tz="UTC")),
            "batch_id": pa.array([f"file:{'0' * 16}"] * n, pa.string()),
        }
    )
    return conform_df(spark.createDataFrame(table), LANDING_SCHEMA)


def fixture_page_changes(spark: SparkSession) -> DataFrame:
    return landing_rows(spark, file_digests(PAGE_CHANGE_FILES), NOW)


PROM_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


@dataclass
class RunningReceiver:
    receiver: Receiver
    port: int
    lake: Path

    def post(self, body: bytes, headers: dict[str, str], path: str = "/api/v1/write") -> tuple[int, bytes, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read(), dict(resp.getheaders())
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``/metrics`` parsed: (sample name, sorted labels) -> value."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.get("/metrics")
        assert status == 200
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (0 when absent). Answers are counted as they are logged, just
        after they are sent: a count asked for right after an answer waits for it briefly."""
        key = (name, tuple(sorted(labels.items())))
        deadline = time.monotonic() + 2
        value = self.scrape().get(key, 0.0)
        while not value and time.monotonic() < deadline:
            time.sleep(0.05)
            value = self.scrape().get(key, 0.0)
        return value

    def samples(self) -> pa.Table:
        self.receiver.flush()
        return DeltaTable(str(self.lake / "bronze" / "samples")).to_pyarrow_table()


def start_receiver(lake: Path, **overrides: object) -> tuple[RunningReceiver, threading.Event, threading.Thread]:
    cfg = RemoteWriteSettings(flush_interval=timedelta(seconds=3600), **overrides)  # type: ignore[arg-type]
    store = DeltaRsStore(None, str(lake))
    receiver = Receiver(cfg, store, BRONZE_SAMPLES, BRONZE_QUARANTINE, lake / "_wal")
    stop = threading.Event()
    bound: list[int] = []
    ready = threading.Event()

    def on_ready(port: int) -> None:
        bound.append(port)
        ready.set()

    thread = threading.Thread(target=serve, args=(receiver, "127.0.0.1", 0, 4, stop, on_ready), daemon=True)
    thread.start()
    assert ready.wait(10)
    return RunningReceiver(receiver, bound[0], lake), stop, thread


@pytest.fixture(name="engine")
def delta_rs_only() -> str:
    """The ``engine`` fixture for a module whose tests run on the default engine only for now.

    Their delta-spark runs (a JVM Delta commit per step, several runs per test) cost CI more than
    its budget holds; the contract suite, the job and crash tests of tests/pipelines/test_jobs.py,
    the interop test and a demo run cover that engine. Import it into the module to use it.
    """
    return "delta-rs"


class ReceiverCommand:
    """``medallion serve remote-write`` as a subprocess in its own session, on a free loopback port.

    ``settings`` are remote-write settings by key (``{"idle_timeout": "2s"}``).
    """

    def __init__(
        self,
        lake: Path,
        processes: int,
        flush_interval: str = "1h",
        host: str = "127.0.0.1",
        settings: dict[str, str] | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
        env |= {"MEDALLION_LAKE_ROOT": str(lake), "MEDALLION_REMOTE_WRITE__FLUSH_INTERVAL": flush_interval}
        env |= {env_name(("remote_write", key)): value for key, value in (settings or {}).items()}
        cmd = [sys.executable, "-m", "pipelines.app.cli", "serve", "remote-write", "--host", host, "--port", "0"]
        self.proc = subprocess.Popen(
            [*cmd, "--processes", str(processes)], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 90
        self.port = 0
        while not self.port and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"http://.*:(\d+)/api/v1/write", line)
            self.port = int(m.group(1)) if m else 0
        assert self.port, "the receiver did not say where it listens"
        self.host = host

    def post(self, data: bytes) -> int:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)  # a connection per body
        try:
            conn.request("POST", "/api/v1/write", body=data, headers=PROM_HEADERS)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, err

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the parent and every receiver process at once
        self.proc.communicate(timeout=30)

    def __del__(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


def run_medallion(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``medallion ARGS`` in a process of its own, with no MEDALLION_* variable but ``env``'s, and
    this checkout's code (whatever the working folder)."""
    repo = Path(__file__).resolve().parents[1]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")} | (env or {})
    full_env["PYTHONPATH"] = os.pathsep.join([str(repo), full_env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=180,
    )


def counting_reads(spark: SparkSession, column: Column, kind: str) -> tuple[Column, Accumulator[int]]:
    """``column`` through a Python function that counts its calls: how many rows the queries that
    read it computed (a second pass over the rows doubles the count)."""
    calls = spark.sparkContext.accumulator(0)

    def same(value: object) -> object:
        calls.add(1)
        return value

    return F.udf(same, kind)(column), calls
