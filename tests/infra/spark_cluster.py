"""A standalone Spark cluster for integration tests: master and worker JVMs from the pyspark wheel,
on loopback, and the ``spark_cluster`` fixture that starts and stops them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.dev.services import LOOPBACK, ServerProcess, ServerStartError, free_port
from tests.infra.common import http_get, require_or_skip


class SparkMaster(ServerProcess):
    """Spark's standalone master (``spark-class ...deploy.master.Master``) from the pyspark wheel,
    RPC on :attr:`port`, web UI (its ``/json`` state) on :attr:`ui_port`."""

    name = "spark-master"
    start_timeout_s = 90.0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ui_port = free_port()

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def state(self) -> dict[str, Any]:
        status, body = http_get(f"http://{LOOPBACK}:{self.ui_port}/json", timeout_s=5)
        assert status == 200, status
        return dict(json.loads(body))

    def _env(self) -> dict[str, str]:
        return spark_daemon_env(self.workdir)

    def _argv(self) -> list[str]:
        return [
            spark_class(),
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        ]

    def _ready(self) -> bool:
        return self.state().get("status") == "ALIVE"


class SparkWorker(ServerProcess):
    """One standalone worker registered with ``master``; executors are its child JVMs."""

    name = "spark-worker"
    start_timeout_s = 90.0

    def __init__(self, master: SparkMaster, *, cores: int = 2, memory: str = "3g", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.master, self.cores, self.memory = master, cores, memory

    def _env(self) -> dict[str, str]:
        return {**spark_daemon_env(self.workdir), "SPARK_WORKER_DIR": str(self.workdir / "work")}

    def _argv(self) -> list[str]:
        return [
            spark_class(),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--webui-port",
            str(free_port()),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            self.master.url,
        ]

    def _ready(self) -> bool:
        workers = self.master.state().get("workers", [])
        return any(w.get("state") == "ALIVE" and w.get("port") == self.port for w in workers)


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def spark_daemon_env(workdir: Path) -> dict[str, str]:
    import pyspark

    return {
        **os.environ,
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOG_DIR": str(workdir),
    }


@pytest.fixture
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkMaster]:
    """A standalone Spark cluster on 127.0.0.1: a master and one worker (2 cores), each its own
    JVM process; stopped (worker first, its executors with it) when the test ends."""
    master = SparkMaster(workdir=tmp_path_factory.mktemp("spark-master"))
    worker = SparkWorker(master, workdir=tmp_path_factory.mktemp("spark-worker"))
    try:
        master.start()
        worker.start()
    except ServerStartError as exc:
        worker.stop()
        master.stop()
        require_or_skip(f"the standalone Spark cluster would not start: {exc}")
    try:
        yield master
    finally:
        worker.stop()
        master.stop()
