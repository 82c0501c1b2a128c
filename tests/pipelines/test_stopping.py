"""``pipelines.runtime.stopping.stop_on``: a signal stops a main thread that waits on the event itself.

A handler that set the event directly would deadlock now and then: the main thread holds the
event's lock for a few bytecodes of each timed wait, and the handler runs between two of them.
"""

from __future__ import annotations

import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.runtime.stopping import next_wait, stop_on

WAITER = """
import signal
from pipelines.runtime.stopping import stop_on
while True:
    with stop_on(signal.SIGUSR1) as stop:
        print("waiting", flush=True)
        while not stop.wait(0.00001):
            pass
"""


def test_signals_always_stop_a_main_thread_waiting_on_the_event_in_a_tight_loop() -> None:
    """Starts a Python process (no JVM) and signals it 500 times, each awaited for at most 5 s.
    A handler calling ``stop.set()`` hung within the first 40 signals, three times out of three."""
    repo = Path(__file__).resolve().parents[2]
    rng = random.Random(5)
    waiter = subprocess.Popen([sys.executable, "-c", WAITER], cwd=repo, stdout=subprocess.PIPE)
    assert waiter.stdout is not None
    try:
        for trial in range(500):
            ready, _, _ = select.select([waiter.stdout], [], [], 5)
            assert ready, f"signal {trial} did not stop the wait"
            assert waiter.stdout.readline() == b"waiting\n"
            time.sleep(rng.uniform(0, 0.002))
            waiter.send_signal(signal.SIGUSR1)
    finally:
        waiter.kill()
        waiter.wait(30)


def test_the_handlers_before_are_put_back_and_the_event_is_set_once_signalled() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    with stop_on(signal.SIGUSR2) as stop:
        assert signal.getsignal(signal.SIGUSR2) is not before
        assert not stop.wait(0.05)
        signal.raise_signal(signal.SIGUSR2)
        assert stop.wait(5)
    assert signal.getsignal(signal.SIGUSR2) is before
    deadline = time.monotonic() + 5
    while any(t.name == "stop-signal" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "stop-signal" for t in threading.enumerate()), "the watcher outlived its block"


def test_a_run_starts_an_interval_after_the_last_one_started_or_at_once_after_a_longer_run() -> None:
    """A 30 s interval: a run of 10.7 s waits 19.3 s; one of 35.7 s (or exactly 30) not at all."""
    assert next_wait(100.0, 30.0, 110.7) == pytest.approx(19.3)
    assert next_wait(100.0, 30.0, 135.7) == 0.0
    assert next_wait(100.0, 30.0, 130.0) == 0.0
    assert next_wait(100.0, 0.0, 100.5) == 0.0
