"""A remote-write sample resent lands once: bronze/samples holds one row per (series, timestamp),
the first value sent, whatever the receiver survived.

The expected rows are the test's own: every (label set, timestamp) the bodies hold, with the value
it was first sent with, compared with bronze's labels and timestamps (not its series ids, which the
receiver computes). The crash tests start a receiver in a subprocess (no JVM, no server) for each
run, a few per crash point; the last test runs the real command with two processes.
"""

from __future__ import annotations

import pickle
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable

from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.sources.remote_write_receiver import REPEATS_JOB
from pipelines.sources.remote_write_repeats import LandedKeys
from pipelines.sources.remote_write_series import Series, encode
from tests.helpers import PROM_HEADERS, ReceiverCommand, start_receiver

T0 = 1_700_000_000_000
Key = tuple[frozenset[tuple[str, str]], int]


def request(n: int, series: int = 20, samples: int = 5, shift: float = 0.0) -> list[Series]:
    """Request ``n`` of a sender: each of ``series`` series' next ``samples`` samples, 15 s apart."""
    first = n * samples
    return [
        Series(
            (("__name__", "node_cpu"), ("cpu", str(k)), ("job", "node")),
            [T0 + (first + i) * 15_000 for i in range(samples)],
            [float(first + i) + k / 100 + shift for i in range(samples)],
        )
        for k in range(series)
    ]


def expected(requests: list[list[Series]]) -> dict[Key, float]:
    """Each (label set, timestamp) of ``requests`` and the value it was first sent with."""
    first: dict[Key, float] = {}
    for series in requests:
        for s in series:
            for t, v in zip(s.timestamps_ms, s.values, strict=True):
                first.setdefault((frozenset(s.labels), t), v)
    return first


def bronze(lake: Path) -> list[tuple[Key, float]]:
    table = DeltaTable(str(lake / "bronze" / "samples")).to_pyarrow_table(columns=["labels", "timestamp", "value"])
    return [
        ((frozenset(labels), int(ts.timestamp() * 1000)), value)
        for labels, ts, value in zip(*(table[c].to_pylist() for c in ("labels", "timestamp", "value")), strict=True)
    ]


def assert_once(lake: Path, want: dict[Key, float]) -> None:
    rows = bronze(lake)
    counts = Counter(k for k, _ in rows)
    assert [k for k, n in counts.items() if n > 1] == []  # nothing landed twice
    assert set(counts) == set(want)  # nothing lost
    assert {k: v for k, v in rows} == want  # the first value of each


def repeats_logged(lake: Path) -> dict[str, float]:
    """The event log's repeat figures, summed over its rows."""
    table = DeltaTable(str(lake / PIPELINE_EVENTS.layer / PIPELINE_EVENTS.name)).to_pyarrow_table()
    totals: Counter[str] = Counter()
    for job, metrics in zip(table["job"].to_pylist(), table["metrics"].to_pylist(), strict=True):
        if job == REPEATS_JOB:
            for name, value in metrics:
                totals[name] += value
    return dict(totals)


# -- the keys on their own, against a dict -----------------------------------------------------------------------
def test_claims_keep_the_first_of_each_key_across_receivers_and_a_replay_lands_its_own(tmp_path: Path) -> None:
    """Random batches from two receivers sharing the keys, against a dict of the first value of each
    key; a batch claimed again by its receiver (a flush killed before its commit) is kept as before."""
    hour = timedelta(hours=1)
    keys = {"r0": LandedKeys(tmp_path, "r0", hour, 5_000), "r1": LandedKeys(tmp_path, "r1", hour, 5_000)}
    rng = random.Random(3)
    first: dict[tuple[int, int], float] = {}
    seq = {"r0": 0, "r1": 0}
    for _ in range(300):
        who = rng.choice(["r0", "r1"])
        rows = []
        for i in range(rng.randint(1, 60)):
            seq[who] += 1 if i == 0 or rng.random() < 0.3 else 0
            rows.append((rng.randint(1, 30), rng.randint(1, 40), float(rng.randint(1, 3)), seq[who]))
        want, duplicate, conflicting = [], 0, 0
        for s, t, v, _ in rows:
            if (s, t) in first:
                want.append(False)
                duplicate += first[(s, t)] == v
                conflicting += first[(s, t)] != v
            else:
                first[(s, t)] = v
                want.append(True)
        columns = [np.array(c) for c in zip(*rows, strict=True)]
        got = keys[who].claim(*columns)
        assert (got.keep.tolist(), got.duplicate, got.conflicting_value, got.replayed) == (
            want,
            duplicate,
            conflicting,
            0,
        )
        if rng.random() < 0.2:
            again = keys[who].claim(*columns)
            assert (again.keep.tolist(), again.replayed) == (want, sum(want))


def test_keys_are_kept_for_the_horizon_and_a_full_generation_turns_over_early(tmp_path: Path) -> None:
    ids = np.arange(3_000, dtype=np.int64)
    ts, values = np.zeros(3_000, np.int64), np.ones(3_000)
    landed = LandedKeys(tmp_path, "r", timedelta(hours=1), keys=1_024)  # 2,048 slots: 1,024 keys a generation

    def kept(a: int, b: int, seq: int) -> list[bool]:
        return landed.claim(ids[a:b], ts[a:b], values[a:b], ts[a:b] + seq).keep.tolist()

    assert kept(0, 1_000, 1) == [True] * 1_000
    assert kept(1_000, 2_000, 2) == [True] * 1_000  # the generation is full: a new one, the first kept too
    assert landed.horizon_in_force < 60
    assert kept(0, 10, 3) == kept(1_000, 1_010, 3) == [False] * 10  # both remembered
    assert kept(2_000, 3_000, 4) == [True] * 1_000  # full again: the first generation is forgotten
    assert kept(0, 10, 5) == [True] * 10
    assert kept(1_010, 1_020, 6) == [False] * 10
    with pytest.raises(ValueError, match="more than a generation"):
        kept(0, 2_000, 7)

    short = LandedKeys(tmp_path / "short", "r", timedelta(seconds=0.2), keys=100_000)
    assert short.claim(ids, ts, values, ts).keep.all()
    time.sleep(0.25)
    assert not short.claim(ids, ts, values, ts + 1).keep.any()  # a generation later: still remembered
    time.sleep(0.25)
    assert short.claim(ids, ts, values, ts + 2).keep.all()  # two generations later: forgotten


def test_a_resent_request_lands_once_and_a_changed_value_keeps_the_first(tmp_path: Path) -> None:
    """Over HTTP: a request sent twice, and one with the same keys and other values; both counted
    per reason on /metrics and in the event log."""
    lake = tmp_path / "lake"
    running, stop, thread = start_receiver(lake, fsync="interval")
    try:
        for body in (request(0), request(1), request(0), request(1, shift=0.5)):
            assert running.post(encode(body), PROM_HEADERS)[0] == 204
        running.receiver.flush()
        metrics = running.receiver.metrics_text().decode()
    finally:
        stop.set()
        thread.join(30)
    assert_once(lake, expected([request(0), request(1)]))
    assert 'medallion_remote_write_samples_repeated_total{reason="duplicate"} 100.0' in metrics
    assert 'medallion_remote_write_samples_repeated_total{reason="conflicting_value"} 100.0' in metrics
    assert repeats_logged(lake) == {
        "samples_repeated_duplicate": 100,
        "samples_repeated_conflicting_value": 100,
        "samples_replayed": 0,
    }


# -- a crash at each point of the request and flush path, then the sender's resends ------------------------------
CRASHES = {
    # crash point -> the runs: each killed where it says, then a run that is not
    "before-log": ["before-log"],
    "logged": ["logged"],
    "claimed": ["claimed"],
    "half-claimed": ["half-claimed"],
    "committed": ["committed"],
    "killed again in the replay's claim": ["claimed", "replay-claimed"],
    "killed again in the replay's commit": ["half-claimed", "replay-committed"],
}


@pytest.mark.parametrize("crash", list(CRASHES))
def test_a_crash_then_the_sender_s_resends_land_every_sample_once(tmp_path: Path, crash: str) -> None:
    """SIGKILL at a point of the request or flush path (``remote_write_crash``), then the same
    receiver again, to which the sender resends every body it has no 2xx for; last, the sender
    posts a request again and another with its keys and new values. (Repeats a run found but was
    killed before it counted are in bronze's rows, not in the event log: only the last run's are
    asserted there.)"""
    lake = tmp_path / "lake"
    sent = [request(n) for n in range(12)]
    again = [request(2), request(3, shift=0.5)]

    def harness(name: str, requests: list[list[Series]]) -> list[str]:
        (tmp_path / f"{name}.pickle").write_bytes(pickle.dumps([encode(r) for r in requests]))
        files = [str(tmp_path / f"{name}.{what}") for what in ("pickle", "acks")]
        return [sys.executable, "-m", "tests.pipelines.remote_write_crash", str(lake), *files]

    for point in CRASHES[crash]:
        killed = subprocess.run([*harness("sent", sent), point], capture_output=True, text=True, timeout=120)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    for name, requests in (("sent", sent), ("again", again)):
        run = subprocess.run([*harness(name, requests), "none"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert sorted(int(n) for n in (tmp_path / f"{name}.acks").read_text().split()) == list(range(len(requests)))
    assert_once(lake, expected(sent))
    logged = repeats_logged(lake)
    assert logged["samples_repeated_conflicting_value"] == 100
    assert logged["samples_repeated_duplicate"] >= 100  # the request posted again, and any resend


# -- the real command: two processes, SIGKILLed twice while a sender keeps posting -----------------------------
@pytest.mark.slow
def test_kill_9_twice_with_two_processes_and_resends_lands_one_row_per_series_and_timestamp(tmp_path: Path) -> None:
    """Starts ``medallion serve remote-write --processes 2`` three times (a JVM-free subprocess
    each, stopped within the test). Four senders post 200-series requests of 5 samples; the whole
    process group is SIGKILLed twice while requests are in flight and restarted at once; each
    sender resends every request it has no 2xx for."""
    lake = tmp_path / "lake"
    sent = [request(n, series=200) for n in range(400)]
    bodies = [encode(r) for r in sent]
    todo = list(range(len(bodies)))
    lock = threading.Lock()
    for kill_after in (0.5, 0.5, None):
        command = ReceiverCommand(lake, processes=2, flush_interval="0.2s")
        failed: list[int] = []

        def send(command: ReceiverCommand = command, failed: list[int] = failed) -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    n = todo.pop(0)
                try:
                    ok = command.post(bodies[n]) == 204
                except OSError:  # the receiver is gone mid-request: not acknowledged
                    ok = False
                if not ok:
                    with lock:
                        failed.append(n)

        senders = [threading.Thread(target=send) for _ in range(4)]
        for t in senders:
            t.start()
        if kill_after is not None:
            time.sleep(kill_after)
            command.kill()
        for t in senders:
            t.join(60)
        if kill_after is None:
            code, err = command.stop()
            assert code == 0, err
        todo[:0] = sorted(failed)  # resent to the restarted receiver first
    assert todo == []
    assert_once(lake, expected(sent))
