"""``medallion serve remote-write --processes N``: several receivers on one port, each with its own log.

Every test runs the real command in its own session, posts over loopback, and stops it (SIGTERM,
or SIGKILL to the whole session for a crash) within a bounded time.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.sources import remote_write_series as codec
from tests.helpers import ReceiverCommand as Command

SAMPLES_PER_BODY = 6


def body(n: int) -> bytes:
    """A distinct body of 3 series x 2 samples (its batch id is its digest)."""
    return codec.encode(
        [
            codec.Series((("__name__", f"m{k}"), ("job", "t"), ("n", str(n))), [1_000 * n, 1_000 * n + 1], [n, k])
            for k in range(3)
        ]
    )


def landed(lake: Path) -> Counter[str]:
    """Samples in bronze per batch id."""
    table = DeltaTable(str(lake / "bronze" / "samples")).to_pyarrow_table(columns=["batch_id"])
    return Counter(table["batch_id"].to_pylist())


def batch_id(data: bytes, receiver: str) -> str:
    return f"{receiver}:{hashlib.sha256(data).hexdigest()[:16]}"


def test_two_processes_share_the_port_and_each_lands_what_it_took(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    command = Command(lake, processes=2)
    bodies = [body(n) for n in range(40)]
    assert [command.post(b) for b in bodies] == [204] * 40
    code, err = command.stop()
    assert code == 0, err
    got = landed(lake)
    # The flush interval is an hour: only each process's shutdown flush can have landed these.
    assert sum(got.values()) == 40 * SAMPLES_PER_BODY
    receivers = Counter(b.split(":")[0] for b in got)
    assert set(receivers) == {"default", "default.1"}  # 40 connections: both took some
    assert all(n == SAMPLES_PER_BODY for n in got.values())
    assert {b.split(":")[1] for b in got} == {batch_id(b, "x").split(":")[1] for b in bodies}


@pytest.mark.parametrize("processes", [1, 2])
def test_an_ipv6_address_is_served(tmp_path: Path, processes: int) -> None:
    lake = tmp_path / "lake"
    command = Command(lake, processes, host="::1")
    assert command.post(body(1)) == 204
    code, err = command.stop()
    assert code == 0, err
    assert sum(landed(lake).values()) == SAMPLES_PER_BODY


def receiver_pid(parent: int, log: Path) -> int:
    """The receiver process of ``parent`` that holds ``log``'s lock."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            if any(os.readlink(fd) == str(log / ".lock") for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:  # gone, or not ours to read
            continue
    raise AssertionError(f"no process of {parent} holds {log}")


def test_one_dead_process_stops_the_command_and_a_smaller_restart_lands_its_log(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    command = Command(lake, processes=2)
    bodies = [body(n) for n in range(30)]
    assert [command.post(b) for b in bodies] == [204] * 30
    os.kill(receiver_pid(command.proc.pid, lake / "_wal" / "remote_write-default.1"), signal.SIGKILL)
    code = command.proc.wait(timeout=120)  # the other process flushes and stops, and the command fails
    assert command.proc.stderr is not None
    err = command.proc.stderr.read()
    assert code != 0 and "remote-write-1" in err and "exited" in err
    flushed = landed(lake)
    assert flushed and {b.split(":")[0] for b in flushed} == {"default"}
    # One process now: the killed one's log is no process's own, and is flushed on start.
    again = Command(lake, processes=1)
    code, err = again.stop()
    assert code == 0, err
    got = landed(lake)
    assert sum(got.values()) == 30 * SAMPLES_PER_BODY and all(n == SAMPLES_PER_BODY for n in got.values())
    assert "default.1" in {b.split(":")[0] for b in got}


def test_receivers_of_a_killed_parent_flush_and_exit_so_a_restart_takes_over(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    command = Command(lake, processes=2)
    bodies = [body(n) for n in range(20)]
    assert [command.post(b) for b in bodies] == [204] * 20
    wal = lake / "_wal"
    children = [
        receiver_pid(command.proc.pid, wal / name) for name in ("remote_write-default", "remote_write-default.1")
    ]
    command.proc.kill()  # the parent alone
    command.proc.wait(30)
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in children), "receivers outlived their parent"
    assert sum(landed(lake).values()) == 20 * SAMPLES_PER_BODY  # each flushed what it acknowledged
    again = Command(lake, processes=2)  # the port and both logs are free again
    assert again.post(body(99)) == 204
    code, err = again.stop()
    assert code == 0, err
    assert sum(landed(lake).values()) == 21 * SAMPLES_PER_BODY


@pytest.mark.slow
def test_kill_9_at_random_moments_then_restart_lands_every_acknowledged_body_exactly_once(tmp_path: Path) -> None:
    """Senders keep posting while the whole command is SIGKILLed, three times over, with flushes
    every 0.2 s (so crashes fall between commits and log deletes too). Restarts alternate two
    processes and one. Every body answered 204 lands exactly once; any other at most once."""
    lake = tmp_path / "lake"
    rng = random.Random(7)
    acked: list[bytes] = []
    tried: list[bytes] = []
    numbers = itertools.count()
    for rounds, processes in enumerate((2, 1, 2)):
        command = Command(lake, processes, flush_interval="0.2s")
        stop = threading.Event()

        def send(command: Command = command, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                data = body(next(numbers))
                tried.append(data)
                try:
                    if command.post(data) == 204:
                        acked.append(data)
                except OSError:
                    return  # the receiver is gone mid-request: not acknowledged

        senders = [threading.Thread(target=send) for _ in range(3)]
        for t in senders:
            t.start()
        time.sleep(rng.uniform(0.5, 2.0))
        command.kill()
        stop.set()
        for t in senders:
            t.join(30)
        assert len(acked) > 10 * (rounds + 1)
    final = Command(lake, processes=1)
    code, err = final.stop()
    assert code == 0, err
    got = landed(lake)
    by_digest: Counter[str] = Counter()
    for batch, count in got.items():
        by_digest[batch.split(":")[1]] += count
    for data in acked:
        assert by_digest[batch_id(data, "x").split(":")[1]] == SAMPLES_PER_BODY
    assert all(count == SAMPLES_PER_BODY for count in by_digest.values())  # nothing landed twice
    assert set(by_digest) <= {batch_id(d, "x").split(":")[1] for d in tried}
