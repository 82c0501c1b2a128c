"""Stopping a long-running command on SIGTERM / SIGINT without a handler that can hang.

Python runs a signal handler in the main thread, between two bytecodes of whatever that thread is
doing. A handler that calls ``stop.set()`` deadlocks when the main thread is itself inside
``stop.wait(...)`` at that moment: ``Event.wait`` holds the event's (non-reentrant) lock for a
few bytecodes around its timed wait, so ``set`` waits for a lock its own thread holds, and the
process never stops (it ignored SIGTERM once in CI until the test killed it). Here the handler
only writes a byte to a pipe; a thread that reads it sets the event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def stop_on(*signals: signal.Signals) -> Iterator[threading.Event]:
    """An event that is set when one of ``signals`` arrives, for the block's length; the
    handlers in place before are put back after it."""
    stop = threading.Event()
    read, write = os.pipe()
    os.set_blocking(write, False)

    def handler(signum: int, frame: object) -> None:
        try:
            os.write(write, b"\0")  # no lock of the interrupted thread's: only a system call
        except BlockingIOError:
            pass  # the pipe is full of earlier signals: the event is being set already

    def watch() -> None:
        while os.read(read, 64):
            stop.set()
        os.close(read)

    threading.Thread(target=watch, name="stop-signal", daemon=True).start()
    before = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield stop
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)
        os.close(write)  # the watcher reads the end of the pipe and closes its end


def next_wait(started: float, interval: float, now: float) -> float:
    """Seconds to wait before the next run of a loop that starts one every ``interval`` seconds
    (``started``, ``now``: monotonic times of this run's start and of its end), as Spark's
    processing-time trigger does: a run that took longer than the interval is followed at once,
    so a pass's length is not added to the lag of the events that land while it runs."""
    return max(0.0, started + interval - now)
