"""Kafka ingest as separate ``medallion ingest kafka`` processes in one consumer group.

Used by the bench for throughput with one process against two sharing a topic's four partitions.
The messages are produced first (a producer running beside the group would compete with it for
the two cores); the rate is read from bronze over the time every process was landing, so JVM
start and the group's joins (Tansu holds each JoinGroup ~3 s) are left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.dev.bench.measure import stop_processes
from pipelines.runtime.tables import BRONZE_EVENTS, BRONZE_QUARANTINE

PARTITIONS = 4
#: Messages per flush: small enough that a window holds many flushes of every member.
BATCH = 5_000
#: The ``medallion`` command, run by this Python.
MEDALLION = [sys.executable, "-c", "from pipelines.app.cli import main; main()"]


class ShortOverlap(RuntimeError):
    """The group's processes landed together for under a second (one started late, on a busy
    machine): no steady state to measure in that run."""


class IngestGroup:
    """``processes`` ingest processes consuming ``topic`` into the lake of ``settings``."""

    def __init__(self, settings: Any, store: Any, bootstrap: str, topic: str, processes: int, logs: Path) -> None:
        self.settings, self.store = settings, store
        self.bootstrap, self.topic, self.count = bootstrap, topic, processes
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.produced = 0

    def env(self) -> dict[str, str]:
        """The environment of a ``medallion`` process on this group's lake and topic."""
        return {
            **os.environ,
            "MEDALLION_LAKE_ROOT": str(self.settings.lake_root),
            "MEDALLION_KAFKA__BOOTSTRAP_SERVERS": json.dumps([self.bootstrap]),
            "MEDALLION_KAFKA__GROUP_ID": f"group-{self.topic}",
            "MEDALLION_KAFKA__TOPICS__EVENTS": self.topic,
        }

    def start(self, options: list[str] | None = None) -> None:
        """Start the processes, each Spark on one core; ``options`` replace the bench's flush
        options (``--max-batch 5000 --max-wait 1``), so ``[]`` runs with the CLI's defaults."""
        env = {**self.env(), "MEDALLION_SPARK__MASTER": "local[1]"}
        self.logs.mkdir(parents=True, exist_ok=True)
        flush = ["--max-batch", str(BATCH), "--max-wait", "1"] if options is None else options
        for i in range(self.count):
            with open(self.logs / f"ingest-{i}.log", "wb") as log:
                argv = [*MEDALLION, "ingest", "kafka", "--topics", self.topic, *flush]
                self.procs.append(subprocess.Popen(argv, env=env, stderr=log))

    def steady_rate(self) -> tuple[float, int, tuple[float, float]]:
        """Messages/s while every member was landing, how many messages that window held, and the
        window (``time.time()`` values).

        Read from bronze itself: each flush's rows carry its ``batch_id`` (``<member>-<n>``) and the
        time the flush began. The window runs from the first flush of the last member to start to
        the last flush of the first member to finish; its rate is the rows of the flushes in it
        after its start over its length, so it leaves out start-up, the group's joins and a tail
        where one process is left alone. Measurement only: two columns of the bench's own topic are
        read, bounded by the messages it produced, and folded to a row per flush.
        """
        from deltalake import DeltaTable

        rows = DeltaTable(self.store.path(BRONZE_EVENTS)).to_pyarrow_table(columns=["batch_id", "ingest_time"])
        flushes = rows.group_by(["batch_id", "ingest_time"]).aggregate([([], "count_all")]).to_pylist()
        firsts: dict[str, float] = {}
        lasts: dict[str, float] = {}
        for f in flushes:
            member = f["batch_id"].rsplit("-", 1)[0]
            at = f["ingest_time"].timestamp()
            firsts[member] = min(firsts.get(member, at), at)
            lasts[member] = max(lasts.get(member, at), at)
        if len(firsts) < self.count:
            raise RuntimeError(f"only {len(firsts)} of {self.count} ingest processes landed anything")
        start, end = max(firsts.values()), min(lasts.values())
        counted = sum(f["count_all"] for f in flushes if start < f["ingest_time"].timestamp() <= end)
        if end - start < 1.0:
            raise ShortOverlap("the processes overlapped for under a second: produce more messages")
        return counted / (end - start), counted, (start, end)

    def landed(self) -> int:
        return sum(self.store.stats(spec).rows for spec in (BRONZE_EVENTS, BRONZE_QUARANTINE))

    def wait_landed(self, expected: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (got := self.landed()) < expected:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{got:,} of {expected:,} messages landed; see {self.logs}")
            time.sleep(0.2)

    def produce(self, messages: list[bytes]) -> None:
        with producer(self.bootstrap) as send:
            for i, message in enumerate(messages):
                send(self.topic, message, i % PARTITIONS)
        self.produced += len(messages)

    def stop(self) -> None:
        stop_processes(self.procs, timeout=120)
        failed = [p.returncode for p in self.procs if p.returncode]
        if failed:
            raise RuntimeError(f"ingest processes exited with {failed}; see {self.logs}")


@contextmanager
def producer(bootstrap: str) -> Iterator[Callable[[str, bytes, int], None]]:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    try:
        yield lambda topic, value, partition: p.send(topic, value, partition=partition) and None
        p.flush(timeout=120)
    finally:
        p.close()
