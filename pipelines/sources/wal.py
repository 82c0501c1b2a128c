"""A write-ahead log of Arrow segments: durable on local disk before a sender is told "done".

The remote-write receiver answers 204 only once samples are durable. Writing every request to
Delta would make each request a commit; instead each request becomes one segment file, written
to a temporary name, fsynced, renamed and the folder fsynced. A flusher moves segments to Delta in
batches and records the highest segment number as an app transaction in the same commit, so on
restart segments at or below it are deleted and the rest replayed: none is lost or landed twice.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from pipelines.errors import MedallionError

_SEGMENT = re.compile(r"^(\d{12})\.(\w+)\.arrow$")


class WalFullError(MedallionError):
    """More bytes wait for Delta than the log may hold; the sender should retry later."""


@dataclass(frozen=True)
class Segment:
    seq: int
    kind: str  # which table the rows go to, e.g. "samples" or "quarantine"
    path: Path
    size: int


class WriteAheadLog:
    """Segments ``<seq>.<kind>.arrow`` in one folder, owned by one process (an flock guards it)."""

    def __init__(self, directory: Path, max_pending_bytes: int, first_seq: int = 1, fsync_each: bool = True) -> None:
        """``fsync_each=False`` leaves each segment in the page cache when :meth:`append` returns
        (safe from a killed process, not from a power loss) until :meth:`sync` is called."""
        self.dir = Path(directory)
        self.fsync_each = fsync_each
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_pending_bytes = max_pending_bytes
        self._lock_file = open(self.dir / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise MedallionError(
                f"the write-ahead log {self.dir} is in use by another receiver: give each receiver its own "
                "MEDALLION_REMOTE_WRITE__RECEIVER_ID or wal_dir"
            ) from None
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()  # a write that never completed was never acknowledged
        segments = self.segments()
        self._seq = max([first_seq - 1, *(s.seq for s in segments)])
        self._pending = sum(s.size for s in segments)
        self._count = len(segments)
        self._mutex = threading.Lock()
        # Segments written since the last sync, for a log without fsync_each.
        self._unsynced: list[Path] = []
        # Numbers taken by appends still writing. Appends run concurrently and may finish out of
        # order, so the flusher takes only segments below the lowest of these: it records the
        # highest number it landed, and everything at or below that counts as landed on restart.
        self._writing: set[int] = set()

    def close(self) -> None:
        self._lock_file.close()

    @property
    def pending_bytes(self) -> int:
        return self._pending

    @property
    def pending_segments(self) -> int:
        """Segments not yet landed, counted as they come and go (no listing of the folder)."""
        return self._count

    def has_room(self, size: int) -> bool:
        """Whether a segment of ``size`` bytes may be appended now: an empty log takes one of any
        size, so no body waits forever; otherwise the pending bytes stay within the limit."""
        return not self._pending or self._pending + size <= self.max_pending_bytes

    def segments(self, kind: str | None = None) -> list[Segment]:
        out = []
        for path in self.dir.iterdir():
            m = _SEGMENT.match(path.name)
            if m and (kind is None or m.group(2) == kind):
                try:
                    size = path.stat().st_size
                except FileNotFoundError:  # landed and removed since the folder was listed
                    continue
                out.append(Segment(int(m.group(1)), m.group(2), path, size))
        return sorted(out, key=lambda s: s.seq)

    def append(self, kind: str, table: pa.Table) -> int:
        """Write ``table`` as the next segment, durably (with ``fsync_each``); return its sequence number."""
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue()
        with self._mutex:
            if not self.has_room(data.size):
                raise WalFullError(f"{self._pending:,} bytes wait for Delta (limit {self.max_pending_bytes:,})")
            self._seq += 1
            seq = self._seq
            self._pending += data.size
            self._count += 1
            self._writing.add(seq)
        final = self.dir / f"{seq:012d}.{kind}.arrow"
        tmp = final.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                if self.fsync_each:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
            if self.fsync_each:
                self._fsync_dir()
            else:
                with self._mutex:
                    self._unsynced.append(final)
        except BaseException:
            with self._mutex:
                self._pending -= data.size
                self._count -= 1
            tmp.unlink(missing_ok=True)
            # Renamed but not made durable (the folder's fsync failed): never acknowledged, so it
            # must not land; the flusher has not taken it, as its number is still being written.
            final.unlink(missing_ok=True)
            raise
        finally:
            with self._mutex:
                self._writing.discard(seq)
        return seq

    def complete(self, kind: str) -> list[Segment]:
        """Segments of ``kind`` that no unfinished append precedes: safe to land in order.

        The bound is read before the folder is listed: every number below it was either written
        (renamed into place) or failed (never acknowledged) by then, and any append started later
        takes a number at or above it.
        """
        with self._mutex:
            limit = min(self._writing, default=self._seq + 1)
        return [s for s in self.segments(kind) if s.seq < limit]

    def sync(self) -> None:
        """Make every segment written since the last sync durable (for a log without ``fsync_each``)."""
        with self._mutex:
            written, self._unsynced = self._unsynced, []
        if not written:
            return
        for path in written:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # landed and removed meanwhile
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def read(segment: Segment) -> pa.Table:
        # One read of the whole file: a segment is small (a request's worth), and mapping it would
        # cost more system calls (stat, open, mmap, madvise, munmap) and a page fault per page.
        with ipc.open_stream(pa.py_buffer(segment.path.read_bytes())) as reader:
            return reader.read_all()

    def remove(self, segments: list[Segment]) -> None:
        for s in segments:
            s.path.unlink(missing_ok=True)
        with self._mutex:
            self._pending = max(0, self._pending - sum(s.size for s in segments))
            self._count = max(0, self._count - len(segments))
        self._fsync_dir()

    def batches(
        self,
        kind: str,
        max_rows: int,
        rows_of: Callable[[pa.Table], int] = pa.Table.__len__,
        wait_for_more: Callable[[], bool] = lambda: False,
    ) -> Iterator[tuple[list[Segment], pa.Table, list[int]]]:
        """The segments of ``kind`` in order, as batches of up to about ``max_rows`` rows (as
        ``rows_of`` counts a segment's), concatenated, with each segment's count, until none is
        left. Each batch starts after the last one handed out, so a caller may still be landing
        that one while it reads the next.
        When the log runs out before a batch is full, ``wait_for_more()`` is asked whether to look
        again (the caller waits for its landing under way, during which more segments arrive)
        rather than hand out a small batch."""
        after = 0
        while True:
            chosen: list[Segment] = []
            tables: list[pa.Table] = []
            counts: list[int] = []
            rows = 0
            full = False
            while not full:
                for seg in self.complete(kind):
                    if seg.seq <= (chosen[-1].seq if chosen else after):
                        continue
                    table = self.read(seg)
                    count = rows_of(table)
                    if chosen and rows + count > max_rows:
                        full = True
                        break
                    chosen.append(seg)
                    tables.append(table)
                    counts.append(count)
                    rows += count
                if not full and not wait_for_more():
                    break
            if not chosen:
                return
            after = chosen[-1].seq
            yield chosen, pa.concat_tables(tables), counts
