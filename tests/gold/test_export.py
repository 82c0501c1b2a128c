from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from gold.export import (
    ExportBounds,
    ExportProgress,
    differences,
    export_bounds,
    exported_of,
    held_change_bounds,
    incremental_batch,
    progress_in,
    rechunk,
)

T = datetime(2024, 6, 1, 12, tzinfo=UTC)
WINDOW, GRACE = timedelta(seconds=30), timedelta(seconds=60)


def batches(*sizes: int) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        out.append(pa.record_batch({"i": list(range(start, start + n))}))
        start += n
    return out


@pytest.mark.parametrize("sizes", [(3, 5, 1), (9,), (1,) * 9, (4, 4, 1), (0, 9, 0)])
def test_chunks_are_cut_by_position_whatever_batches_the_rows_came_in(sizes: tuple[int, ...]) -> None:
    chunks = list(rechunk(batches(*sizes), 4))
    assert [c.num_rows for c in chunks] == [4, 4, 1]
    assert [c["i"].to_pylist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


def test_no_rows_make_no_chunk() -> None:
    assert list(rechunk(batches(0), 4)) == []


def test_the_watermark_closes_windows_a_grace_behind_the_newest_event() -> None:
    assert export_bounds(T, WINDOW, GRACE, drain=False, prev=None) == ExportBounds(T - GRACE, T - GRACE)


def test_a_drain_closes_every_window_through_the_newest_events_window() -> None:
    assert export_bounds(T, WINDOW, GRACE, drain=True, prev=None) == ExportBounds(None, T + WINDOW)


def test_the_recorded_end_never_moves_back() -> None:
    prev = ExportProgress(gold_version=3, newest_event=T, closed_through=T + WINDOW)
    assert export_bounds(T, WINDOW, GRACE, drain=False, prev=prev) == ExportBounds(T - GRACE, T + WINDOW)


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is New York's (EDT in June: UTC - 4 h) for one test."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("tz", ["UTC", None], ids=["stored in UTC", "naive"])
def test_a_batchs_progress_read_from_its_files_is_in_local_time_as_spark_collects_it(
    new_york: None, tz: str | None
) -> None:
    stamp = pa.timestamp("us", tz=tz)
    rows = pa.record_batch(
        {
            "gold_version": pa.array([7, 7], pa.int64()),
            "newest_event": pa.array([datetime(2024, 6, 1, 12, 0, 1, 500)] * 2, stamp),
            "closed_through": pa.array([datetime(2024, 6, 1, 11, 59)] * 2, stamp),
        }
    )
    assert progress_in(rows) == ExportProgress(7, datetime(2024, 6, 1, 8, 0, 1, 500), datetime(2024, 6, 1, 7, 59))


def test_no_row_or_a_batch_from_before_the_outbox_kept_progress_has_none() -> None:
    empty = pa.record_batch({"gold_version": pa.array([], pa.int64())})
    old = pa.record_batch({"gold_version": pa.array([None], pa.int64())})
    assert (progress_in(None), progress_in(empty), progress_in(old)) == (None, None, None)


def test_a_held_change_feed_gives_the_newest_event_and_the_late_keys_and_their_windows(new_york: None) -> None:
    # The last batch closed windows through T + WINDOW (window T is closed, T + WINDOW is open).
    # Window T gained ("a") in two buckets and changed ("b"); the open window gained ("c"), the
    # newest event; an older window lost ("d": a backfill removed it, so it is late too and its
    # exported count is taken back). New York is UTC - 4 h in June.
    stamp = pa.timestamp("us", tz="UTC")
    early, late_window, open_window = T - WINDOW, T, T + WINDOW
    rows = [  # value, window, newest event in it, change type
        ("a", late_window, T + timedelta(seconds=5), "insert"),
        ("a", late_window, T + timedelta(seconds=7), "insert"),
        ("b", late_window, T + timedelta(seconds=2), "update_preimage"),
        ("b", late_window, T + timedelta(seconds=9), "update_postimage"),
        ("c", open_window, T + timedelta(seconds=40), "insert"),
        ("d", early, T - timedelta(seconds=20), "delete"),
    ]
    changes = pa.table(
        {
            "team_id": pa.array([1] * len(rows), pa.int64()),
            "property_type": ["event"] * len(rows),
            "property_key": ["browser"] * len(rows),
            "property_value": [r[0] for r in rows],
            "window_start": pa.array([r[1] for r in rows], stamp),
            "max_event_time": pa.array([r[2] for r in rows], stamp),
            "_change_type": [r[3] for r in rows],
        }
    )
    prev = ExportProgress(3, newest_event=datetime(2024, 6, 1, 8, 0, 30), closed_through=datetime(2024, 6, 1, 8, 0, 30))
    newest, windows, keys = held_change_bounds(changes, WINDOW, prev)
    assert (newest, windows) == (
        datetime(2024, 6, 1, 8, 0, 40),
        [datetime(2024, 6, 1, 7, 59, 30), datetime(2024, 6, 1, 8)],
    )
    assert [(r["property_value"], r["window_start"]) for r in keys.to_pylist()] == [("a", T), ("b", T), ("d", early)]


def test_a_held_change_feed_with_nothing_newer_keeps_the_last_newest_event() -> None:
    stamp = pa.timestamp("us", tz="UTC")
    empty = pa.table(
        {
            "team_id": pa.array([], pa.int64()),
            "property_type": pa.array([], pa.string()),
            "property_key": pa.array([], pa.string()),
            "property_value": pa.array([], pa.string()),
            "window_start": pa.array([], stamp),
            "max_event_time": pa.array([], stamp),
            "_change_type": pa.array([], pa.string()),
        }
    )
    prev = ExportProgress(3, newest_event=datetime(2024, 6, 1, 12), closed_through=datetime(2024, 6, 1, 12, 1))
    newest, windows, keys = held_change_bounds(empty, WINDOW, prev)
    assert (newest, windows, keys.num_rows) == (prev.newest_event, [], 0)


def test_what_clickhouse_holds_is_the_outbox_counts_summed_per_tuple_and_window(spark: SparkSession) -> None:
    # Batch 1 sent Firefox and Chrome in window 0; batch 2 a correction of Firefox (+2) and
    # Firefox in window 1 for the first time. ClickHouse sums what it got: the outbox says it.
    w0, w1 = datetime(2024, 6, 1, 12), datetime(2024, 6, 1, 12, 0, 30)
    outbox = spark.createDataFrame(
        [
            (1, 1, "event", "browser", "Firefox", w0, 7, 7, False),
            (1, 1, "event", "browser", "Chrome", w0, 5, 5, False),
            (2, 1, "event", "browser", "Firefox", w0, 2, 9, True),
            (2, 1, "event", "browser", "Firefox", w1, 4, 4, False),
        ],
        "export_seq long, team_id long, property_type string, property_key string, property_value string, "
        "window_start timestamp, count long, total long, correction boolean",
    )
    got = {(r["property_value"], r["window_start"]): r["exported_count"] for r in exported_of(outbox).collect()}
    assert got == {("Firefox", w0): 9, ("Chrome", w0): 5, ("Firefox", w1): 4}


KEY_DDL = "team_id long, property_type string, property_key string, property_value string, window_start timestamp"
GOLD_DDL = "team_id long, property_type string, property_key string, property_value string, window_start timestamp, count long, bucket int"
EXPORTED_DDL = "team_id long, property_type string, property_key string, property_value string, window_start timestamp, exported_count long"


@pytest.mark.parametrize("closed_before", [T + WINDOW, T + WINDOW / 2], ids=["at the last end", "before it"])
def test_a_batch_with_no_window_newly_closed_sends_the_late_corrections_alone(
    spark: SparkSession, closed_before: datetime
) -> None:
    # Window T was exported (its end T + WINDOW is where the last batch closed through); the
    # watermark has not passed the end of window T + WINDOW. A late count raised ("event", "a")
    # in window T from 3 to 5; ("event", "b") in window T and the open window hold no change.
    w0, w1 = T.replace(tzinfo=None), (T + WINDOW).replace(tzinfo=None)
    gold = spark.createDataFrame(
        [
            (1, "event", "plan", "a", w0, 5, 0),
            (1, "event", "plan", "b", w0, 7, 1),
            (1, "event", "plan", "a", w1, 4, 0),
        ],
        GOLD_DDL,
    )
    exported = spark.createDataFrame([(1, "event", "plan", "a", w0, 3), (1, "event", "plan", "b", w0, 7)], EXPORTED_DDL)
    late = spark.createDataFrame([(1, "event", "plan", "a", w0)], KEY_DDL)
    cut = gold.transform(incremental_batch(late, [T], exported, WINDOW, T + WINDOW, closed_before, min_count=1))
    assert [tuple(r) for r in cut.collect()] == [(1, "event", "plan", "a", w0, 2, 5, True, False, False)]


def test_a_tuple_taken_back_to_zero_is_gated_and_placed_as_one_never_sent(spark: SparkSession) -> None:
    # ClickHouse was sent "a" (then taken back to 0 by a backfill) and "b" (3) in window T. Gold now
    # holds "a" once (below the gate of 2), "b" still at 3 and a new "c" at 4; one value per key
    # and window may be sent. "a" holds nothing in ClickHouse: it is gated as one never sent, and
    # holds no place; "b" holds the one place, so "c" is dropped.
    w0 = T.replace(tzinfo=None)
    gold = spark.createDataFrame(
        [(1, "event", "plan", "a", w0, 1, 0), (1, "event", "plan", "b", w0, 3, 0), (1, "event", "plan", "c", w0, 4, 0)],
        GOLD_DDL,
    ).drop("bucket")
    exported = spark.createDataFrame([(1, "event", "plan", "a", w0, 0), (1, "event", "plan", "b", w0, 3)], EXPORTED_DDL)
    cut = gold.transform(differences(exported, min_count=2, top_values=1))
    rows = {r["property_value"]: (r["count"], r["correction"], r["_gated"], r["_dropped"]) for r in cut.collect()}
    assert rows == {"a": (1, False, True, False), "c": (4, False, False, True)}  # "b" has no change
    # With two places, "c" takes the second: "a"'s taken-back row holds none.
    cut = gold.transform(differences(exported, min_count=2, top_values=2))
    rows = {r["property_value"]: (r["count"], r["_gated"], r["_dropped"]) for r in cut.collect()}
    assert rows == {"a": (1, True, False), "c": (4, False, False)}
