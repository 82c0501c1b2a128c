"""Remote-write peers for ``medallion bench``: the stores a user would send remote write to instead.

Each peer is Debian's binary, started by the bench on 127.0.0.1 with a data folder of its own and
stopped by it: single-node VictoriaMetrics (``victoria-metrics``, ``/api/v1/write``) and
Prometheus with ``--web.enable-remote-write-receiver``. A peer has stored a workload once its own
counter of stored samples, on its ``/metrics`` page, counts every sample (see
:data:`pipelines.dev.bench.ingest_remote_write.OWN_COUNTERS`). What each one's 2xx promises
differs, and the report says so:

- VictoriaMetrics: the samples are in memory, written to disk within about a second;
- Prometheus: in its head block and its write-ahead log, which is not fsynced per request.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pipelines.dev.services import free_port

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class PeerKind:
    name: str
    binary: str
    package: str
    ready_path: str
    promise: str

    def missing(self) -> str | None:
        """Why this peer cannot run here (with how to install it), or None."""
        if shutil.which(self.binary) is None:
            return f"`{self.binary}` is not installed (Debian: apt-get install {self.package})"
        return None


VICTORIA_METRICS = PeerKind(
    "VictoriaMetrics",
    "victoria-metrics",
    "victoria-metrics",
    "/health",
    "2xx: in memory, on disk within about 1 s",
)
PROMETHEUS = PeerKind(
    "Prometheus",
    "prometheus",
    "prometheus",
    "/-/ready",
    "2xx: in the head block and its WAL, not fsynced per request",
)
PEERS = (VICTORIA_METRICS, PROMETHEUS)


class Peer:
    """One running peer, fresh data folder, on a free loopback port; a context manager that stops it."""

    def __init__(self, kind: PeerKind, workdir: Path, timeout: float = 60.0) -> None:
        self.kind, self.port = kind, free_port()
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log = workdir / f"{kind.binary}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self._argv(workdir), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while self._get(kind.ready_path) != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{kind.name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def _argv(self, workdir: Path) -> list[str]:
        listen = f"{LOOPBACK}:{self.port}"
        if self.kind is VICTORIA_METRICS:
            return [
                self.kind.binary,
                f"-storageDataPath={workdir / 'data'}",
                f"-httpListenAddr={listen}",
                "-retentionPeriod=100y",  # the bench's samples carry fixed 2024 timestamps
                "-search.disableCache",
            ]
        config = workdir / "prometheus.yml"
        # Concurrent senders can deliver one series' samples out of order, as ours takes them;
        # Prometheus answers those 400 unless its out-of-order window admits them.
        config.write_text("global:\n  scrape_interval: 1m\nstorage:\n  tsdb:\n    out_of_order_time_window: 1h\n")
        return [
            self.kind.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={listen}",
            "--web.enable-remote-write-receiver",
            "--storage.tsdb.retention.time=100y",
        ]

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=2) as response:
                return int(response.status)
        except (urllib.error.URLError, OSError):
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
