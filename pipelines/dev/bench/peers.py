"""Remote-write peers for ``medallion bench``: the stores a user would send remote write to instead.

Each peer is Debian's binary, started by the bench on 127.0.0.1 with a data folder of its own and
stopped by it: single-node VictoriaMetrics (``victoria-metrics``, ``/api/v1/write``) and
Prometheus with ``--web.enable-remote-write-receiver``. A peer has received a workload once its
query API counts every sample. What each one's 2xx promises differs, and the report says so:

- VictoriaMetrics: the samples are in memory, written to disk within about a second;
- Prometheus: in its head block and its write-ahead log, which is not fsynced per request.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
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
        self.write_url = f"{self.url}/api/v1/write"
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

    def count(self, selectors: Sequence[str], at_ms: int) -> int:
        """Samples of ``selectors`` in the hour up to ``at_ms``, through the query API (a query each)."""
        total = 0
        for selector in selectors:
            query = urllib.parse.urlencode(
                {"query": f"sum(count_over_time({selector}[1h]))", "time": f"{at_ms / 1000:.3f}"}
            )
            try:
                with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=30) as response:
                    result = json.load(response)["data"]["result"]
            except urllib.error.HTTPError as exc:
                raise RuntimeError(f"{self.kind.name} refused the query {query}: {exc.read()[:500]!r}") from exc
            total += int(float(result[0]["value"][1])) if result else 0
        return total

    def wait_counted(self, selectors: Sequence[str], at_ms: int, samples: int, timeout: float = 120.0) -> float:
        """Poll until the query API counts ``samples``; return the epoch seconds it first did.

        VictoriaMetrics is asked to flush its in-memory buffers first (``/internal/force_flush``),
        as stopping ours flushes its log: left alone, it makes new samples searchable within
        seconds (10 s at the S size here), which would time its buffering rather than its work.
        """
        if self.kind is VICTORIA_METRICS and self._get("/internal/force_flush") != 200:
            raise RuntimeError(f"{self.kind.name} did not flush: {self.log.read_text()[-2000:]}")
        deadline = time.monotonic() + timeout
        while True:
            got = self.count(selectors, at_ms)
            if got >= samples:
                if got != samples:
                    raise RuntimeError(f"{self.kind.name} counts {got} samples, {samples} were sent")
                return time.time()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind.name} counts {got} of {samples} samples after {timeout:.0f} s")
            time.sleep(0.05)

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
