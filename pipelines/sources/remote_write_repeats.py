"""The samples the remote-write receivers of one log have landed, by (series, timestamp), so that a
resent sample lands once.

Remote write is at-least-once: a sender resends every request it got no 2xx for, and a receiver
killed after logging a request but before answering lands it from its log, then again from the
resend. Prometheus's TSDB keeps one sample per (series, timestamp), the first it took in; so does
bronze/samples, within a horizon:

- The flusher claims each sample's key before it commits the sample: a 64-bit fingerprint of its
  series id and timestamp, in a table every receiver process of the log shares (memory-mapped
  files in a folder beside the write-ahead logs, claimed under a file lock). A key claimed before
  is a repeat and is dropped, as a ``duplicate`` (the same value) or a ``conflicting_value`` (the
  first value wins).
- A claim is tagged with the receiver and the log segment that made it. A flusher killed between
  its claim and its commit replays the same segments when it starts again and finds its own
  tags: it lands those samples (``replayed``). Another receiver that finds them drops its copy:
  the owner's log still holds the samples and lands them.
- Keys are kept for ``horizon``: the table has two generations, keys are claimed in the current
  one, which becomes the previous one after ``horizon`` (the previous one is then forgotten), so a
  key is remembered for at least ``horizon`` after its claim. A generation holds ``keys`` keys;
  one that fills first turns over early, which shortens the horizon: that is logged, and
  ``/metrics`` shows the horizon in force.

Everything is vectorized (numpy over the batch's keys): a linear-probing hash table of
``[fingerprint, value bits, tag]`` slots at most half full, probed a round at a time for every
key still looking.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np

log = logging.getLogger("medallion.remote_write")

#: Why a sample was not landed: its key was claimed before with the same value, or another one.
DUPLICATE, CONFLICTING_VALUE = "duplicate", "conflicting_value"
REASONS = (DUPLICATE, CONFLICTING_VALUE)

_KEY, _VALUE, _TAG = 0, 1, 2
_STATE = "state.json"
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of ``x`` spread over the result (uint64, wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def keys(series_ids: np.ndarray, timestamps: np.ndarray, slot_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Each (series id, timestamp) pair's key (64 bits, never 0: an empty slot) and the slot its
    probe starts at, in a table of ``2**slot_bits`` slots."""
    with np.errstate(over="ignore"):
        series = series_ids.astype(np.int64, copy=False).view(np.uint64)
        fp = _mix(series ^ _mix(timestamps.astype(np.int64).view(np.uint64)))
    fp[fp == 0] = 1
    return fp, (fp & np.uint64((1 << slot_bits) - 1)).astype(np.int64)


def owner_tag(receiver_id: str) -> int:
    """The high 32 bits of a claim's tag for ``receiver_id`` (never 0: an untagged slot)."""
    return (zlib.crc32(receiver_id.encode()) | 1) << 32


@dataclass(frozen=True)
class Claimed:
    """What a batch's claim decided: which samples to land (``keep``), and why the others were not."""

    keep: np.ndarray  # bool, per sample
    duplicate: int
    conflicting_value: int
    replayed: int  # claimed by this receiver's own segment before (a replay): landed

    @property
    def repeated(self) -> int:
        return self.duplicate + self.conflicting_value

    def by_reason(self) -> dict[str, int]:
        return {DUPLICATE: self.duplicate, CONFLICTING_VALUE: self.conflicting_value}


class _Generation:
    """One generation's slots, mapped from its file: ``[key, value bits, tag]`` each, so a key's
    probe and its claim touch one cache line (or two)."""

    #: Which key of a claim takes an empty slot, by the slot's low bits: small enough to stay in
    #: the processor's cache. Keys for two slots that share the bits may both lose a round; they
    #: look again the next one.
    TAKERS = 1 << 16

    def __init__(self, path: Path, slots: int, create: bool) -> None:
        if create:
            with open(path, "wb") as f:  # sparse: pages are taken as slots are written
                f.truncate(slots * 3 * 8)
        self.path = path
        self.slots = slots
        self.mask = slots - 1
        self.table = np.memmap(path, dtype=np.uint64, mode="r+", shape=(slots, 3))
        self.taker = np.empty(self.TAKERS, np.int32)

    def held(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The value bits and the tag of ``slots``."""
        rows = self.table[slots]
        return rows[:, _VALUE], rows[:, _TAG]

    def find(self, fp: np.ndarray, home: np.ndarray) -> np.ndarray:
        """The slot holding each key (probed from ``home``), or -1."""
        found = np.full(len(fp), -1, np.int64)
        slot = home.copy()
        looking = np.arange(len(fp))
        while looking.size:
            s = slot[looking]
            held = self.table[s, _KEY]
            hit = held == fp[looking]
            found[looking[hit]] = s[hit]
            on = (~hit) & (held != 0)
            looking = looking[on]
            slot[looking] = (s[on] + 1) & self.mask
        return found

    def claim(
        self, fp: np.ndarray, home: np.ndarray, values: np.ndarray, tags: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Claim each key (probed from ``home``): (its slot, whether this call took the slot for
        it). A key whose slot another key of this call took first (the same key twice) found it,
        as any claimed key."""
        n = len(fp)
        at = np.empty(n, np.int64)
        took = np.zeros(n, bool)
        slot = home.copy()
        looking = np.arange(n, dtype=np.int32)
        t, taker, low = self.table, self.taker, self.TAKERS - 1
        while looking.size:
            s = slot[looking]
            held = t[s, _KEY]
            hit = held == fp[looking]
            at[looking[hit]] = s[hit]
            empty = held == 0
            if empty.any():
                who, where = looking[empty], s[empty]
                # The first key to reach an empty slot takes it: numpy's assignment keeps the last
                # write of a repeated index, so the keys are written last to first.
                taker[where[::-1] & low] = who[::-1]
                won = taker[where & low] == who
                who, where = who[won], where[won]
                # Value and tag before the key: a slot is claimed once its key is written, so a
                # process killed in between leaves it empty.
                t[where, _VALUE] = values[who]
                t[where, _TAG] = tags[who]
                t[where, _KEY] = fp[who]
                at[who], took[who] = where, True
                # The keys that lost an empty slot look at it again: it holds their key, another
                # one, or nothing yet.
                empty[empty] = ~won
            moving = (~hit) & (held != 0)
            slot[looking[moving]] = (s[moving] + 1) & self.mask
            looking = looking[moving | empty]
        return at, took


class LandedKeys:
    """The claims of the receivers that share ``folder`` (see the module's docstring); ``owner``:
    the receiver's id, which tags its claims."""

    def __init__(self, folder: Path, owner: str, horizon: timedelta, keys: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.horizon = horizon.total_seconds()
        self.slots = 1 << max(10, int(2 * keys - 1).bit_length())  # at most half full
        self.keys = self.slots // 2
        self.owner = owner_tag(owner)
        #: The horizon the last turnover left: the previous generation's age when it turned over
        #: early, else ``horizon``.
        self.horizon_in_force = self.horizon
        self._mapped: dict[int, _Generation] = {}
        self._lock = open(self.folder / "lock", "a+")

    def close(self) -> None:
        self._lock.close()
        self._mapped.clear()

    @contextmanager
    def _locked(self) -> Iterator[dict]:
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            yield self._state()
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _state(self) -> dict:
        try:
            state = json.loads((self.folder / _STATE).read_text())
        except (FileNotFoundError, ValueError):
            state = None
        if not state or state.get("slots") != self.slots:  # new, or resized: start afresh
            state = self._turn({"current": 0, "slots": self.slots}, fresh=True)
        return state

    def _save(self, state: dict) -> None:
        """Replace the state file whole (under the lock): a reader never sees half of one."""
        tmp = self.folder / f"{_STATE}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.folder / _STATE)

    def _generation(self, number: int | None) -> _Generation | None:
        if number is None:
            return None
        if number not in self._mapped:
            path = self.folder / f"gen-{number}.keys"
            if not path.exists():
                return None
            self._mapped[number] = _Generation(path, self.slots, create=False)
        return self._mapped[number]

    def _turn(self, state: dict, fresh: bool = False) -> dict:
        """A new current generation; the current one becomes the previous one (none if ``fresh``)."""
        number = state["current"] + 1
        _Generation(self.folder / f"gen-{number}.keys", self.slots, create=True)
        now = time.time()
        if not fresh:
            age = now - state["started"]
            self.horizon_in_force = min(self.horizon, age)
            if age < self.horizon:
                log.warning(
                    "remote-write repeats: %d keys claimed in %.0f s, so keys are now remembered for %.0f s, "
                    "not %.0f s: raise remote_write.repeat_keys",
                    self.keys,
                    age,
                    age,
                    self.horizon,
                )
        new = {"current": number, "previous": None if fresh else state["current"], "started": now, "used": 0}
        new["kept_for"] = self.horizon_in_force
        new["slots"] = self.slots
        self._save(new)
        for path in self.folder.glob("gen-*.keys"):
            if int(path.stem.split("-")[1]) not in (new["current"], new["previous"]):
                path.unlink(missing_ok=True)
        self._mapped = {k: v for k, v in self._mapped.items() if k in (new["current"], new["previous"])}
        return new

    def claim(self, series_ids: np.ndarray, timestamps: np.ndarray, values: np.ndarray, seqs: np.ndarray) -> Claimed:
        """Claim a batch's samples, in order (the first of a key in the batch wins): ``seqs`` is the
        log segment each came from."""
        n = len(series_ids)
        if not n:
            return Claimed(np.ones(0, bool), 0, 0, 0)
        if n > self.keys:
            raise ValueError(f"a batch of {n:,} samples is more than a generation of {self.keys:,} keys holds")
        fp, home = keys(series_ids, timestamps, self.slots.bit_length() - 1)
        bits = np.ascontiguousarray(values, np.float64).view(np.uint64)
        tags = np.uint64(self.owner) | (seqs.astype(np.int64) & 0xFFFFFFFF).astype(np.uint64)
        with self._locked() as state:
            if time.time() - state["started"] >= self.horizon or state["used"] + n > self.keys:
                state = self._turn(state)
            self.horizon_in_force = state.get("kept_for", self.horizon)  # another process may have turned it
            current = self._generation(state["current"])
            assert current is not None, f"{self.folder}: generation {state['current']} is missing"
            previous = self._generation(state.get("previous"))
            slot = np.full(n, -1, np.int64)
            older = np.zeros(n, bool)
            if previous is not None:
                slot = previous.find(fp, home)
                older = slot >= 0
            rest = np.flatnonzero(~older)
            at, took = current.claim(fp[rest], home[rest], bits[rest], tags[rest])
            slot[rest] = at
            state["used"] += int(took.sum())
            self._save(state)
            new = np.zeros(n, bool)
            new[rest[took]] = True
            found = ~new
            fi = np.flatnonzero(found)
            held_value, held_tag = np.empty(len(fi), np.uint64), np.empty(len(fi), np.uint64)
            if len(fi):
                from_previous = older[fi]
                if previous is not None and from_previous.any():
                    held_value[from_previous], held_tag[from_previous] = previous.held(slot[fi[from_previous]])
                held_value[~from_previous], held_tag[~from_previous] = current.held(slot[fi[~from_previous]])
        keep = new.copy()
        replayed = duplicate = conflicting = 0
        if len(fi):
            # A claim of this receiver's own segment, made by a flush that did not commit (a
            # replay): landed, once per key. A key this call claimed for an earlier sample is a
            # repeat whatever its tag.
            own = (held_tag == tags[fi]) & ~np.isin(slot[fi], slot[new])
            if own.any():
                _, first = np.unique(slot[fi[own]], return_index=True)
                mine = fi[own][first]
                keep[mine] = True
                replayed = len(mine)
                own = np.isin(fi, mine)
            again = ~own
            same = held_value[again] == bits[fi[again]]
            duplicate, conflicting = int(same.sum()), int((~same).sum())
        return Claimed(keep, duplicate, conflicting, replayed)
