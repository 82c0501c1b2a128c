"""The remote-write ingest stages of the benchmark: remote write -> bronze beside decoding alone and
a read-and-discard receiver; and ``medallion serve remote-write`` in a fleet's steady state, with one
process and two, beside VictoriaMetrics and Prometheus, each side timed by its own counter of what it
stored; the sender process they share."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from pipelines.dev.bench.measure import Bench, Figure, cpu_seconds, timed, warm_up_first
from pipelines.dev.bench.workloads import SAMPLES_PER_REQUEST_SERIES, SERIES_PER_REQUEST, Workload
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
    for attempt in b.attempts():
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
    for attempt in b.attempts():
        target = warm_up_first(line_fig, attempt)
        with sending(Discard(), bodies) as send, timed(target, w.samples):
            statuses = send()
        if set(statuses) != {204}:
            raise AssertionError(f"the discarding receiver answered {statuses}")
    line_fig.note = f"{RW_SENDERS} keep-alive senders (another process) into the same HTTP server, bodies dropped"

    fig = b.figure("remote write -> bronze", "samples")
    fig.peers["decode only"] = decode_fig.stage
    fig.peers["read and discard"] = line_fig.stage
    for attempt in b.attempts():
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
        f"{RW_SENDERS} keep-alive senders (another process), 500 series x 4 samples per request; time until flushed to "
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
def senders_ready(port: int, bodies: Path) -> Iterator[Callable[..., dict[int, int]]]:
    """A sender process loaded with ``bodies`` (:mod:`pipelines.dev.bench.senders`); the callable
    sends them all to ``port``, or rounds ``first`` to ``end - 1`` of them, and returns the count of
    each final status."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "pipelines.dev.bench.senders", str(port), str(bodies), str(RW_SENDERS)]
    senders = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert senders.stdin and senders.stdout
    try:
        if senders.stdout.readline().strip() != "ready":
            raise RuntimeError("the remote-write senders did not start")

        def send(first: int | None = None, end: int | None = None) -> dict[int, int]:
            assert senders.stdin and senders.stdout
            senders.stdin.write("go\n" if first is None else f"go {first} {end}\n")
            senders.stdin.flush()
            line = senders.stdout.readline()
            if not line:
                raise RuntimeError(f"the remote-write senders exited with {senders.wait(30)}")
            return {int(code): n for code, n in json.loads(line).items()}

        yield send
    finally:
        senders.kill()
        senders.wait(30)


RW_SERVE = "remote write -> bronze, serve ({how})"
RW_PEER = "peer: {name} (remote write)"
SERVE_VARIANTS = {
    # figure name -> (remote_write.fsync, processes)
    RW_SERVE.format(how="fsync every 1 s"): ("interval", 1),
    RW_SERVE.format(how="fsync every 1 s, 2 processes"): ("interval", 2),
    RW_SERVE.format(how="fsync per request"): ("request", 1),
}
#: What each side counts its stored samples by, on its /metrics page (summed). The peers count a
#: sample as they take it in, before their 2xx; ours counts it once committed to Delta, up to a
#: flush interval (0.5 s here) after its 2xx, and also counts rows it quarantines (none here).
OWN_COUNTERS = {
    "ours": ("medallion_remote_write_rows_flushed_total",),  # rows committed to bronze/samples
    "VictoriaMetrics": ("vm_rows_added_to_storage_total",),
    # Out-of-order samples included (they are also counted apart, in ..._out_of_order_...).
    "Prometheus": ("prometheus_tsdb_head_samples_appended_total",),
}


def remote_write_steady_stage(b: Bench, w: Workload) -> None:
    """``medallion serve remote-write`` beside the stores a user would send remote write to instead,
    in a fleet's steady state, each timed by its own counter.

    The workload (:func:`~pipelines.dev.bench.workloads.steady_bodies`): a fixed set of series; a
    first round of samples creates them (untimed: VictoriaMetrics and Prometheus index a series
    when they first see it), then the next rounds, each the series' next 4 samples, are sent back
    to back by 4 keep-alive senders in another process. The time runs from the first body of those
    rounds until the store's own counter counts every sample: ours, the rows its flusher committed
    to bronze/samples; VictoriaMetrics, ``vm_rows_added_to_storage_total``; Prometheus,
    ``prometheus_tsdb_head_samples_appended_total``; each read from its ``/metrics``, which costs
    it no query. Each side's CPU seconds (the server's processes) are reported per 400,000 samples.
    Ours runs with ``fsync: interval`` (the peers' durability) with one process and two, and with
    ``fsync: request`` on its own line. A peer whose binary is missing is skipped, with how to
    install it.
    """
    import pickle
    import statistics
    from collections import Counter

    from pipelines.dev.bench.measure import MachineLoad, MemorySampler, machine_busy
    from pipelines.dev.bench.peers import PEERS, Peer
    from pipelines.dev.bench.receivers import ReceiverCommand
    from pipelines.dev.bench.workloads import STEADY_ROUNDS, STEADY_SERIES, steady_bodies

    rounds = steady_bodies(w.size)
    per_round = STEADY_SERIES[w.size.name] * SAMPLES_PER_REQUEST_SERIES
    timed_samples = per_round * (STEADY_ROUNDS - 1)
    bodies = b.out / "work" / "remote-write-steady.pickle"
    bodies.parent.mkdir(parents=True, exist_ok=True)
    bodies.write_bytes(pickle.dumps(rounds))
    del rounds

    ours = {name: b.figure(name, "samples") for name in SERVE_VARIANTS}
    peers = {kind: b.figure(RW_PEER.format(name=kind.name), "samples") for kind in PEERS}
    ours[RW_SERVE.format(how="fsync every 1 s, 2 processes")].peers["1 process"] = RW_SERVE.format(
        how="fsync every 1 s"
    )
    for kind, fig in peers.items():
        if why := kind.missing():
            fig.note = f"skipped: {why}"
            continue
        for name, our in ours.items():
            if "2 processes" not in name:
                our.peers[kind.name] = fig.stage
    cpu: dict[str, list[float]] = {fig.stage: [] for fig in [*ours.values(), *peers.values()]}
    busy: dict[str, list[float | None]] = {stage: [] for stage in cpu}

    def run(fig: Figure, attempt: int, port: int, pid: int, metrics: str, counter: Sequence[str], name: str) -> None:
        target = warm_up_first(fig, attempt)
        with senders_ready(port, bodies) as send, MemorySampler({name: pid}) as mem, MachineLoad() as load:
            statuses = Counter(send(0, 1))  # creates the series
            base = wait_counted(metrics, counter, per_round, fig.stage)
            cpu0, started = cpu_seconds(pid), time.time()
            statuses += Counter(send(1, STEADY_ROUNDS))
            wait_counted(metrics, counter, base + timed_samples, fig.stage)
            ended = time.time()
            used = cpu_seconds(pid) - cpu0
            time.sleep(0.5)  # nothing counted twice after the count was reached
            if (after := counter_value(metrics, counter)) != base + timed_samples:
                raise RuntimeError(f"{fig.stage}: {counter} counts {after:,.0f}, {base + timed_samples:,.0f} were sent")
        if set(statuses) != {204}:
            raise AssertionError(f"{fig.stage} answered {statuses}")
        target.record(ended - started, timed_samples, mem.peak)
        if target is fig:
            cpu[fig.stage].append(used * 400_000 / timed_samples)
            busy[fig.stage].append(load.busy(started, ended))

    for attempt in b.attempts():
        for name, (fsync, processes) in SERVE_VARIANTS.items():
            ctx = b.context("remote-write-steady")
            remote_write = {"fsync": fsync}
            with ReceiverCommand(ctx.settings, processes, RW_SENDERS, remote_write=remote_write) as rc:
                url = f"http://127.0.0.1:{rc.port}/metrics"
                run(ours[name], attempt, rc.port, rc.proc.pid, url, OWN_COUNTERS["ours"], "receiver")
        for kind, fig in peers.items():
            if kind.missing():
                continue
            with Peer(kind, b.out / "work" / "peers" / kind.binary) as peer:
                run(fig, attempt, peer.port, peer.proc.pid, f"{peer.url}/metrics", OWN_COUNTERS[kind.name], kind.binary)
    workload = (
        f"steady state: {STEADY_SERIES[w.size.name]:,} series, a first round creates them, then "
        f"{STEADY_ROUNDS - 1} rounds of their next {SAMPLES_PER_REQUEST_SERIES} samples back to back, "
        f"{SERIES_PER_REQUEST} series to a request; {RW_SENDERS} keep-alive senders (another process)"
    )
    counted_when = {
        **{name: "committed to bronze/samples (up to a 0.5 s flush after its 2xx)" for name in SERVE_VARIANTS},
        **{fig.stage: "taken in (before its 2xx)" for fig in peers.values()},
    }
    promised = {name: PROMISES[fsync] for name, (fsync, _) in SERVE_VARIANTS.items()}
    counters = {name: OWN_COUNTERS["ours"] for name in SERVE_VARIANTS}
    for kind, fig in peers.items():
        promised[fig.stage], counters[fig.stage] = kind.promise, OWN_COUNTERS[kind.name]
    names = {stage: " + ".join(f"`{c}`" for c in counted) for stage, counted in counters.items()}
    for fig in [*ours.values(), *peers.values()]:
        if fig.note:  # skipped, and says why
            continue
        per = cpu[fig.stage]
        spent = f"{statistics.median(per):.2f} s ({min(per):.2f}-{max(per):.2f})" if per else "not measured"
        fig.note = (
            f"{workload}; time until {names[fig.stage]} counts every sample, a sample counted once "
            f"{counted_when[fig.stage]}; CPU per 400,000 samples "
            f"{spent}; {promised[fig.stage]}{machine_busy(busy[fig.stage])}"
        )


PROMISES = {
    "request": "2xx: each request's log segment and the log folder fsynced",
    "interval": "2xx: in the page cache, the log fsynced every 1 s",
}


def wait_counted(metrics: str, counter: Sequence[str], samples: float, what: str, timeout: float = 300.0) -> float:
    """Poll the sum of the ``counter`` metrics on the ``metrics`` page until it reaches ``samples``,
    and return it; a count past ``samples`` (a sample stored twice) fails."""
    deadline = time.monotonic() + timeout
    while True:
        got = counter_value(metrics, counter)
        if got > samples:
            raise RuntimeError(f"{what}: {counter} counts {got:,.0f}, {samples:,.0f} were sent")
        if got == samples:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {counter} counts {got:,.0f} of {samples:,.0f} after {timeout:.0f} s")
        time.sleep(0.05)


def counter_value(metrics: str, counter: Sequence[str]) -> float:
    """The sum of the samples named in ``counter`` (over all their labels) on a Prometheus text
    ``/metrics`` page."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in counter
    )
