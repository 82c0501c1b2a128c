"""``medallion serve remote-write --processes N``: N receivers sharing one port.

One Python process handles requests under one GIL, so it uses about one core however many
threads it has. With ``N > 1`` each process binds the same address with ``SO_REUSEPORT`` and the
kernel spreads connections across them. Each is a whole receiver: its own write-ahead log
(``<wal>.<i>`` beside the first one's) and its own app id (``<receiver_id>.<i>``), so each lands
its own segments exactly once and their Delta appends never conflict on an app transaction. The
samples they have landed are known to all (:mod:`~pipelines.sources.remote_write_repeats`, in
``<wal>.keys``), so a sample resent to another process than the one that logged it lands once.

Process 0 keeps the plain names, so one process and several share the first log. Logs of
processes that no longer run (``N`` was larger before) are flushed on start: what they
acknowledged is never stranded. If any process dies, the others are stopped (each flushing what
it acknowledged) and the command fails, for the service manager to restart it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.config.settings import Settings
from pipelines.errors import MedallionError
from pipelines.observability import multiprocess_dir
from pipelines.runtime.stopping import stop_on
from pipelines.runtime.tables import BRONZE_QUARANTINE, BRONZE_SAMPLES
from pipelines.sources.remote_write_receiver import Receiver
from pipelines.sources.remote_write_server import address_family, serve
from pipelines.storage import TableStore, open_store

log = logging.getLogger("medallion.remote_write")

STOP_SECONDS = 120


def wal_dir(settings: Settings, index: int = 0) -> Path:
    """The write-ahead log folder of receiver process ``index``."""
    rw = settings.remote_write
    first = rw.wal_dir or Path(settings.lake_root) / "_wal" / f"remote_write-{rw.receiver_id}"
    return Path(first) if index == 0 else Path(first).with_name(f"{Path(first).name}.{index}")


def open_receiver(settings: Settings, store: TableStore, index: int = 0) -> Receiver:
    """Receiver process ``index``'s receiver: its own log and app id."""
    rw = settings.remote_write
    if index:
        rw = rw.model_copy(update={"receiver_id": f"{rw.receiver_id}.{index}"})
    first = wal_dir(settings)
    keys = first.with_name(f"{first.name}.keys")  # shared: a sample resent to another process lands once
    return Receiver(rw, store, BRONZE_SAMPLES, BRONZE_QUARANTINE, wal_dir(settings, index), keys)


def retired_logs(settings: Settings, processes: int) -> list[int]:
    """Indexes of logs holding segments that no process of a run with ``processes`` owns."""
    first = wal_dir(settings)
    pattern = re.compile(rf"^{re.escape(first.name)}\.(\d+)$")
    found = []
    for folder in first.parent.iterdir() if first.parent.is_dir() else []:
        m = pattern.match(folder.name)
        if m and int(m.group(1)) >= processes and any(p.suffix == ".arrow" for p in folder.iterdir()):
            found.append(int(m.group(1)))
    return sorted(found)


def flush_retired(settings: Settings, store: TableStore, indexes: list[int]) -> int:
    """Flush the logs of receiver processes that no longer run (``N`` was larger before)."""
    flushed = 0
    for index in indexes:
        receiver = open_receiver(settings, store, index)
        try:
            rows = receiver.flush()
        finally:
            receiver.close()
        log.warning("flushed %d rows left in %s by an earlier run with more processes", rows, wal_dir(settings, index))
        flushed += rows
    return flushed


def _store(settings: Settings) -> TableStore:
    spark = None
    if settings.delta_engine == "delta-spark":
        from pipelines.config.spark import build_spark

        spark = build_spark(settings)
    return open_store(settings, spark)


def _serve_one(settings: Settings, host: str, port: int, index: int, ready: Any) -> None:
    """One receiver process (the target of a spawned child): serve until SIGTERM or SIGINT, or
    until the parent is gone (so a killed parent never leaves receivers holding the logs)."""
    with stop_on(signal.SIGTERM, signal.SIGINT) as stop:
        parent = multiprocessing.parent_process()
        if parent is not None:

            def watch_parent() -> None:
                parent.join()
                stop.set()

            threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
        receiver = open_receiver(settings, _store(settings), index)
        serve(receiver, host, port, settings.remote_write.workers, stop, lambda _: ready.put(index), reuse_port=True)


def serve_processes(
    settings: Settings, host: str, port: int, processes: int, stop: threading.Event, ready: Callable[[int], None]
) -> None:
    """Run ``processes`` receivers on one port until ``stop`` is set; each flushes what it took."""
    retired = retired_logs(settings, processes)
    if processes == 1 or retired:  # with more processes, the parent needs a store only for these
        store = _store(settings)
        flush_retired(settings, store, retired)
        if processes == 1:
            serve(open_receiver(settings, store), host, port, settings.remote_write.workers, stop, ready)
            return
    # Hold the port (bound, never listening, so it takes no connections) so that port 0 names one
    # free port for every child, and nobody else can take it between their binds.
    with socket.socket(address_family(host, port), socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host, port))
        _run_children(settings, host, holder.getsockname()[1], processes, stop, ready)


def _run_children(
    settings: Settings, host: str, port: int, processes: int, stop: threading.Event, ready: Callable[[int], None]
) -> None:
    spawn = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads or a JVM
    started = spawn.Queue()
    children: list[Any] = []
    stopped_early: list[str] = []
    # The children's metrics go to one folder, and each child's /metrics sums it, so a scrape sees
    # the whole receiver whichever process answers. Only the children see the folder's name.
    metrics = multiprocess_dir(Path(tempfile.gettempdir()) / "medallion-metrics")
    try:
        try:
            for i in range(processes):
                child = spawn.Process(
                    target=_serve_one, args=(settings, host, port, i, started), name=f"remote-write-{i}"
                )
                child.start()
                children.append(child)
        finally:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        waiting = set(range(processes))
        while waiting and all(c.is_alive() for c in children) and not stop.is_set():
            try:
                waiting.discard(started.get(timeout=0.5))
            except queue.Empty:  # keep checking on the children
                continue
        if not waiting:
            ready(port)
        while not stop.is_set() and all(c.is_alive() for c in children):
            stop.wait(0.5)
        # Any child that ended before we were asked to stop ended on its own: a failure, whatever its code.
        stopped_early = [c.name for c in children if not c.is_alive()] if not stop.is_set() else []
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()  # SIGTERM: it stops taking requests and flushes what it acknowledged
        for child in children:
            child.join(STOP_SECONDS)
            if child.is_alive():
                child.kill()
                child.join()
        started.close()
        shutil.rmtree(metrics, ignore_errors=True)
    failed = {c.name: c.exitcode for c in children if c.name in stopped_early or c.exitcode not in (0, -signal.SIGTERM)}
    for child in children:
        child.close()
    if failed:
        raise MedallionError(
            f"remote-write receiver processes exited: {failed}; the others stopped after flushing. "
            "Restart the command: each log replays what its process acknowledged."
        )
