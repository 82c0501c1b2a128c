"""The remote-write ingest stages of the benchmark: remote write -> bronze beside decoding alone and
a read-and-discard receiver, ``medallion serve remote-write`` with one process against two, and
beside VictoriaMetrics and Prometheus; the sender process they share."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from pipelines.dev.bench.measure import Bench, timed, warm_up_first
from pipelines.dev.bench.workloads import Workload
from pipelines.runtime.tables import BRONZE_QUARANTINE, BRONZE_SAMPLES

RW_SENDERS = 4


def remote_write_stage(b: Bench, w: Workload) -> None:
    """Remote write -> bronze beside its two peers: decoding alone, and a receiver that only reads.

    Decoding alone is the receiver's own decode into Arrow. Reading and discarding is the same
    HTTP server answering 204 to bodies it drops, so it is what the senders can deliver (line
    rate). The senders run in a process of their own, as Prometheus or vmagent would.
    """
    import pickle

    from pipelines.config.settings import RemoteWriteSettings
    from pipelines.sources.remote_write import SNAPPY, decode
    from pipelines.sources.remote_write_receiver import Metrics, Receiver, Response

    decode_fig = b.figure("remote write: decode only", "samples")
    for attempt in range(b.repeats + 1):
        target = warm_up_first(decode_fig, attempt)
        with timed(target, w.samples):
            for body in w.remote_write_bodies:
                decode(body, SNAPPY, 1 << 30)

    class Discard:
        """Reads each body and answers 204: the HTTP server and the senders, nothing else."""

        metrics = Metrics()
        settings = RemoteWriteSettings()

        def preflight(self, query: Any, headers: Any) -> Response | None:
            return None

        def accept(self, body: bytes, headers: Any) -> Response:
            return Response(204)

        def flush_loop(self, stop: Any) -> None:
            stop.wait()

        def close(self) -> None:
            pass

    bodies = b.out / "work" / "remote-write-bodies.pickle"
    bodies.parent.mkdir(parents=True, exist_ok=True)
    bodies.write_bytes(pickle.dumps(w.remote_write_bodies))

    line_fig = b.figure("peer: remote write read and discard", "samples")
    for attempt in range(b.repeats + 1):
        target = warm_up_first(line_fig, attempt)
        with sending(Discard(), bodies) as send, timed(target, w.samples):
            statuses = send()
        if set(statuses) != {204}:
            raise AssertionError(f"the discarding receiver answered {statuses}")
    line_fig.note = f"{RW_SENDERS} senders (another process) into the same HTTP server, bodies dropped"

    fig = b.figure("remote write -> bronze", "samples")
    fig.peers["decode only"] = decode_fig.stage
    fig.peers["read and discard"] = line_fig.stage
    for attempt in range(b.repeats + 1):
        ctx = b.context("remote-write")
        lake = Path(ctx.settings.lake_root)
        cfg = RemoteWriteSettings(flush_interval=timedelta(seconds=0.5))
        receiver = Receiver(cfg, ctx.store, BRONZE_SAMPLES, BRONZE_QUARANTINE, lake / "_wal")
        target = warm_up_first(fig, attempt)
        with sending(receiver, bodies) as send, timed(target, w.samples):
            statuses = send()  # returns once serve() has flushed what it acknowledged
        if set(statuses) != {204}:
            raise AssertionError(f"remote write answered {statuses}")
        landed = ctx.store.read(BRONZE_SAMPLES).count()
        if landed != w.samples:
            raise AssertionError(f"remote write landed {landed} of {w.samples} samples")
    fig.note = (
        f"{RW_SENDERS} senders (another process), 500 series x 4 samples per request; time until flushed to "
        "Delta; fsync: each request's log segment and the log folder before its 204"
    )


@contextmanager
def sending(receiver: Any, bodies: Path) -> Iterator[Callable[[], dict[int, int]]]:
    """Serve ``receiver`` on loopback with a sender process ready; the callable sends every body,
    stops the server (which flushes) and returns the count of each status."""
    import threading

    from pipelines.sources.remote_write_server import serve

    stop, bound = threading.Event(), list[int]()
    thread = threading.Thread(
        target=serve, args=(receiver, "127.0.0.1", 0, RW_SENDERS, stop, bound.append), name="rw-bench", daemon=True
    )
    thread.start()
    while not bound and thread.is_alive():
        time.sleep(0.01)
    try:
        with senders_ready(bound[0], bodies) as send:

            def send_and_stop() -> dict[int, int]:
                statuses = send()
                stop.set()
                thread.join(timeout=300)  # serve() flushes what is left before it returns
                return statuses

            yield send_and_stop
    finally:
        stop.set()
        thread.join(timeout=300)


@contextmanager
def senders_ready(port: int, bodies: Path) -> Iterator[Callable[[], dict[int, int]]]:
    """A sender process loaded with ``bodies``; the callable sends them all to ``port`` and returns
    the count of each final status."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "pipelines.dev.bench.senders", str(port), str(bodies), str(RW_SENDERS)]
    senders = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert senders.stdin and senders.stdout
    try:
        if senders.stdout.readline().strip() != "ready":
            raise RuntimeError("the remote-write senders did not start")

        def send() -> dict[int, int]:
            assert senders.stdin and senders.stdout
            senders.stdin.write("go\n")
            senders.stdin.flush()
            line = senders.stdout.readline()
            if not line:
                raise RuntimeError(f"the remote-write senders exited with {senders.wait(30)}")
            return {int(code): n for code, n in json.loads(line).items()}

        yield send
    finally:
        senders.kill()
        senders.wait(30)


RW_PROCESSES = "remote write -> bronze, {n} receiver process{es}"


def remote_write_processes_stage(b: Bench, w: Workload) -> None:
    """``medallion serve remote-write`` with one process against two sharing the port.

    Each run starts the command afresh and waits until it listens. The time runs from the first
    body sent until the last sample landed: the command is stopped once the senders are done
    (which flushes what is left), and the end is the table's last commit, read once it exited.
    """
    from pipelines.dev.bench.measure import MemorySampler
    from pipelines.dev.bench.receivers import ReceiverCommand

    bodies = b.out / "work" / "remote-write-bodies.pickle"
    one = b.figure(RW_PROCESSES.format(n=1, es=""), "samples")
    two = b.figure(RW_PROCESSES.format(n=2, es="es"), "samples")
    two.peers["1 process"] = one.stage
    for attempt in range(b.repeats + 1):
        for processes, fig in ((1, one), (2, two)):
            ctx = b.context("remote-write-processes")
            target = warm_up_first(fig, attempt)
            with ReceiverCommand(ctx.settings, ctx.store, processes, RW_SENDERS) as receiver:
                with senders_ready(receiver.port, bodies) as send, MemorySampler() as mem:
                    started = time.time()  # wall clock, as the commit times are
                    statuses = send()
                    landed = receiver.stop_and_wait_landed(w.samples)
            if set(statuses) != {204}:
                raise AssertionError(f"remote write answered {statuses}")
            target.record(landed - started, w.samples, mem.peak)
            fig.note = f"{RW_SENDERS} senders (another process); flush every 0.5 s; time until the last sample's commit"


RW_OURS = "remote write -> bronze, serve ({how})"
RW_PEER = "peer: {name} (remote write)"


def remote_write_peers_stage(b: Bench, w: Workload) -> None:
    """``medallion serve remote-write`` beside the stores a user would send remote write to instead.

    The same sender process sends the same bodies to each, in turn within each run: our receiver
    with each request fsynced before its 204 and with the log fsynced every second (the durability
    the peers offer), single-node VictoriaMetrics and Prometheus' remote-write receiver. Ours ends
    at the last sample's commit in bronze/samples; a peer once its query API counts every sample.
    A peer whose binary is missing is skipped, with how to install it.
    """
    from pipelines.dev.bench.measure import MemorySampler
    from pipelines.dev.bench.peers import PEERS, Peer
    from pipelines.dev.bench.receivers import ReceiverCommand
    from pipelines.dev.bench.workloads import RW_METRICS, remote_write_end_ms

    bodies = b.out / "work" / "remote-write-bodies.pickle"
    ours = {
        "request": b.figure(RW_OURS.format(how="fsync per request"), "samples"),
        "interval": b.figure(RW_OURS.format(how="fsync every 1 s"), "samples"),
    }
    peers = {kind: b.figure(RW_PEER.format(name=kind.name), "samples") for kind in PEERS}
    for kind, fig in peers.items():
        why = kind.missing()
        if why:
            fig.note = f"skipped: {why}"
            continue
        fig.note = (
            f"{RW_SENDERS} senders (another process); time until its query API counts every sample; {kind.promise}"
        )
        for our in ours.values():
            our.peers[kind.name] = fig.stage
    at_ms = remote_write_end_ms(w.size)
    for attempt in range(b.repeats + 1):
        for fsync, fig in ours.items():
            ctx = b.context("remote-write-peers")
            target = warm_up_first(fig, attempt)
            with ReceiverCommand(ctx.settings, ctx.store, 1, RW_SENDERS, remote_write={"fsync": fsync}) as receiver:
                with (
                    senders_ready(receiver.port, bodies) as send,
                    MemorySampler({"receiver": receiver.proc.pid}) as mem,
                ):
                    started = time.time()
                    statuses = send()
                    landed = receiver.stop_and_wait_landed(w.samples)
            if set(statuses) != {204}:
                raise AssertionError(f"remote write answered {statuses}")
            target.record(landed - started, w.samples, mem.peak)
        for kind, fig in peers.items():
            if kind.missing():
                continue
            target = warm_up_first(fig, attempt)
            with Peer(kind, b.out / "work" / "peers" / kind.binary) as peer:
                with senders_ready(peer.port, bodies) as send, MemorySampler({kind.binary: peer.proc.pid}) as mem:
                    started = time.time()
                    statuses = send()
                    if set(statuses) != {204}:
                        raise AssertionError(f"{kind.name} answered {statuses}")
                    counted = peer.wait_counted(RW_METRICS, at_ms, w.samples)
            target.record(counted - started, w.samples, mem.peak)
    ours["request"].note = (
        f"{RW_SENDERS} senders (another process); the command, one process; time until the last sample's commit; "
        "2xx: each request's log segment and the log folder fsynced"
    )
    ours["interval"].note = (
        f"{RW_SENDERS} senders (another process); the command, one process, remote_write.fsync: interval; time "
        "until the last sample's commit; 2xx: in the page cache, the log fsynced every 1 s"
    )
