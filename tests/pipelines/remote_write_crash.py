"""A remote-write receiver killed (SIGKILL) at one point of its request or flush path, for
``test_remote_write_repeats``: ``python -m tests.pipelines.remote_write_crash LAKE BODIES ACKS POINT``.

It takes the bodies of the pickled list BODIES in order, as the server would (:meth:`Receiver.accept`),
skipping those ACKS lists (one index a line: the sender's 2xx), and flushes every 5 bodies and at the
end. POINT (``none``: no crash) kills the process where it is reached the first time after being
armed; a sender resends, in the next run, every body it has no 2xx for:

- ``before-log``: the 4th body's log segment not written (never acknowledged);
- ``logged``: the 4th body logged, not answered;
- ``claimed``: the 2nd flush's samples claimed, not committed;
- ``half-claimed``: the 2nd flush's claim stopped halfway through its samples;
- ``committed``: the 2nd flush committed to Delta, its log segments not deleted;
- ``replay-claimed`` / ``replay-committed``: the first flush's claim or commit (after a restart:
  the replay of the log a killed run left).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

from pipelines.config.settings import load_settings
from pipelines.sources import remote_write_repeats, wal
from pipelines.sources.remote_write_processes import open_receiver
from pipelines.storage.deltars import DeltaRsStore
from tests.helpers import PROM_HEADERS


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, receiver: Any) -> None:
    calls: dict[str, int] = {}

    def nth(name: str, n: int) -> bool:
        calls[name] = calls.get(name, 0) + 1
        return calls[name] == n

    append, claim, commit = wal.WriteAheadLog.append, remote_write_repeats.LandedKeys.claim, receiver.store.append
    flush_n = 1 if point.startswith("replay-") else 2

    def logging(self: Any, kind: str, table: Any) -> int:
        if point == "before-log" and nth("log", 4):
            die()
        seq = append(self, kind, table)
        if point == "logged" and nth("log", 4):
            die()
        return seq

    def claiming(self: Any, series: Any, timestamps: Any, values: Any, seqs: Any) -> Any:
        if point == "half-claimed" and nth("claim", flush_n):
            half = len(series) // 2
            claim(self, series[:half], timestamps[:half], values[:half], seqs[:half])
            die()
        claimed = claim(self, series, timestamps, values, seqs)
        if point in ("claimed", "replay-claimed") and nth("claim", flush_n):
            die()
        return claimed

    def committing(spec: Any, table: Any, txns: Any = (), **kw: Any) -> int:
        version = commit(spec, table, txns, **kw)
        if point in ("committed", "replay-committed") and spec.name == "samples" and nth("commit", flush_n):
            die()
        return version

    wal.WriteAheadLog.append = logging  # type: ignore[method-assign]
    remote_write_repeats.LandedKeys.claim = claiming  # type: ignore[method-assign]
    receiver.store.append = committing


def main(lake: str, bodies_file: str, acks_file: str, point: str) -> None:
    bodies = pickle.loads(Path(bodies_file).read_bytes())
    acks = Path(acks_file)
    acked = {int(line) for line in acks.read_text().split()} if acks.exists() else set()
    settings = load_settings(lake_root=lake, remote_write={"flush_interval": "1h", "repeat_keys": 100_000})
    receiver = open_receiver(settings, DeltaRsStore(None, lake))
    if point != "none":
        arm(point, receiver)
    taken = 0
    with open(acks, "a") as out:
        for i, body in enumerate(bodies):
            if i in acked:
                continue
            if receiver.accept(body, PROM_HEADERS).status == 204:
                out.write(f"{i}\n")
                out.flush()
            taken += 1
            if taken % 5 == 0:
                receiver.flush()
    receiver.flush()
    receiver.close()


if __name__ == "__main__":
    main(*sys.argv[1:5])
