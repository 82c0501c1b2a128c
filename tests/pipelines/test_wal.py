"""The remote-write receiver's write-ahead log: batches for the flusher, and appends that fail."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from pipelines.sources.wal import WriteAheadLog


def rows(n: int) -> pa.Table:
    return pa.table({"x": list(range(n))})


def test_a_batch_not_yet_full_waits_for_more_and_takes_what_arrived_meanwhile(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, 1 << 30, fsync_each=False)
    wal.append("k", rows(2))
    arriving = [2, 2]  # one segment of 2 rows arrives during each of the first two waits
    waits = []

    def wait_for_more() -> bool:
        waits.append(len(arriving))
        if arriving:
            wal.append("k", rows(arriving.pop(0)))
            return True
        return False

    got = [
        ([s.seq for s in segments], t.num_rows) for segments, t, _ in wal.batches("k", 5, wait_for_more=wait_for_more)
    ]
    # 1 alone is not full: wait, take 2 (4 rows); wait, 3 would make 6 > 5: the batch is full.
    # Then 3 alone, nothing more arrives, and the log is empty.
    assert got == [([1, 2], 4), ([3], 2)]
    assert waits == [2, 1, 0, 0]
    wal.close()


def test_a_segment_whose_folder_fsync_failed_is_not_left_to_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path, 1 << 30, fsync_each=True)
    wal.append("k", rows(1))

    def no_disk() -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(wal, "_fsync_dir", no_disk)
    with pytest.raises(OSError, match="I/O error"):
        wal.append("k", rows(1))  # the sender is told 503 and sends it again: it must not land twice
    assert [s.seq for s in wal.segments()] == [1]
    assert wal.pending_segments == 1
    wal.close()
