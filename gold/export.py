"""What to send to ClickHouse: per tuple and closed window, the count not exported yet.

ClickHouse's ``property_values`` is a SummingMergeTree, so each export sends the *difference*
between the gold count and what was exported before: the first time the whole count, and a
correction row carrying only the difference when late data changed a window already exported.
``sum(count)`` per tuple and window in ClickHouse therefore always equals the gold count.

A window is closed once the watermark (newest event time counted minus ``gold.grace``) passes its
end; a drain treats every window as closed. Tuples whose window count is below the singleton gate
are held back (counted as gated) until their count reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType, TimestampType

from gold.property_values import KEY_FIELDS, TUPLE, WINDOW_START

EXPORT_KEY = (*TUPLE, WINDOW_START)
EXPORT_DATASET = "clickhouse/property_values"  # what the export's quality suite is named by
EXPORT_COLUMNS = (*EXPORT_KEY, "count")

#: A tuple in a window, as ClickHouse keys it (no bucket).
_TUPLE_WINDOW = [f for f in KEY_FIELDS if f.name != "bucket"]

#: One export batch, written before anything is sent so a retry sends exactly the same rows.
OUTBOX_SCHEMA = StructType(
    [
        StructField("export_seq", LongType()),
        *_TUPLE_WINDOW,
        StructField("count", LongType()),  # what this batch adds in ClickHouse
        StructField("total", LongType()),  # the gold count it brings ClickHouse to
        StructField("correction", BooleanType()),  # the window was exported before
        # Where the batch left the export (the same on every row of a batch): the gold version
        # read, the newest event time counted, and the end through which windows are closed. The
        # next batch reads only gold's changes after that version and the windows closed since.
        StructField("gold_version", LongType()),
        StructField("newest_event", TimestampType()),
        StructField("closed_through", TimestampType()),
    ]
)


def window_closed(width: timedelta, after: datetime | None, through: datetime | None) -> Column:
    """True for rows whose window ends in (``after``, ``through``] (an open side: no bound).

    Written on ``window_start`` alone so that Parquet statistics can skip files."""
    cond = F.lit(True)
    if after is not None:
        cond = cond & (F.col(WINDOW_START) > F.lit(after - width))
    if through is not None:
        cond = cond & (F.col(WINDOW_START) <= F.lit(through - width))
    return cond


#: The change types of gold's change feed that say a tuple's count in a window changed: a row
#: gained (a first count), changed (a late count) or lost (a backfill's new rules no longer count
#: the tuple there).
CHANGED = ("insert", "update_postimage", "delete")


def changed_keys(width: timedelta, through: datetime | None) -> Callable[[DataFrame], DataFrame]:
    """Change-feed rows of gold -> the tuples and windows (EXPORT_KEY) that gained, changed or lost
    a row in a window ending by ``through`` (every window with None): the ones a late count or a
    backfill changed."""

    def transform(changes: DataFrame) -> DataFrame:
        images = changes.where(F.col("_change_type").isin(*CHANGED))
        return images.where(window_closed(width, None, through)).select(*EXPORT_KEY).distinct()

    return transform


def per_tuple_window() -> Callable[[DataFrame], DataFrame]:
    """Gold rows -> one row per tuple and window: the counts of every bucket that counted it,
    summed (a team the bucket mapping moved mid-window has a gold row in each bucket)."""

    def transform(rows: DataFrame) -> DataFrame:
        return rows.groupBy(*EXPORT_KEY).agg(F.sum("count").cast("long").alias("count"))

    return transform


def differences(
    exported: DataFrame, min_count: int, top_values: int | None = None, gone: DataFrame | None = None
) -> Callable[[DataFrame], DataFrame]:
    """Gold rows of closed windows -> rows to send: the count not exported yet, minus gated ones
    and, with ``top_values``, minus the values past the first N of their key and window; with
    ``_gated`` and ``_dropped`` flags kept for metrics.

    ``gone``: tuples and windows (EXPORT_KEY) the rows may no longer hold (a backfill removed them
    from gold). One that was exported and is not among the rows is sent as its exported count
    taken back (a ``total`` of 0), so ClickHouse's sum comes to 0 where gold holds nothing.

    Top values: per ``(team, type, key)`` and window at most ``top_values`` values are ever sent.
    A value already sent keeps getting its corrections (so ClickHouse still sums to gold for what
    it holds); a value not sent yet takes one of the places left, largest count first (ties by
    value), and is dropped when none is left.
    """

    def transform(rows: DataFrame) -> DataFrame:
        # What ClickHouse holds: a tuple whose count was taken back to 0 holds nothing, and is
        # gated and placed among the top values again as one never sent.
        holds = exported.where(F.col("exported_count") != 0)
        totals = rows.select(*EXPORT_KEY, F.col("count").alias("total"))
        if gone is not None:
            lost = holds.join(gone, list(EXPORT_KEY), "left_semi").join(totals, list(EXPORT_KEY), "left_anti")
            totals = totals.unionByName(lost.select(*EXPORT_KEY, F.lit(0).cast("long").alias("total")))
        joined = totals.join(holds.select(*EXPORT_KEY, "exported_count"), list(EXPORT_KEY), "left")
        before = F.coalesce(F.col("exported_count"), F.lit(0))
        gated = F.col("exported_count").isNull() & (F.col("total") < F.lit(min_count))
        out = joined.select(
            *EXPORT_KEY,
            (F.col("total") - before).alias("count"),
            F.col("total"),
            F.col("exported_count").isNotNull().alias("correction"),
            gated.alias("_gated"),
        )
        if not top_values:
            dropped = F.lit(False)
        else:
            key = [c for c in EXPORT_KEY if c != "property_value"]
            held = holds.groupBy(*key).agg(F.count(F.lit(1)).alias("_held"))
            out = out.withColumn("_new", ~F.col("correction") & ~F.col("_gated")).join(held, key, "left")
            order = Window.partitionBy(*key, "_new").orderBy(F.desc("total"), F.asc("property_value"))
            place = F.coalesce(F.col("_held"), F.lit(0)) + F.row_number().over(order)
            dropped = F.col("_new") & (place > F.lit(int(top_values)))
        return out.select(*EXPORT_KEY, "count", "total", "correction", "_gated", dropped.alias("_dropped")).where(
            (F.col("count") != 0) | F.col("_gated") | F.col("_dropped")
        )

    return transform


def export_batch(
    exported: DataFrame,
    width: timedelta,
    closed_before: datetime | None,
    min_count: int,
    top_values: int | None = None,
) -> Callable[[DataFrame], DataFrame]:
    """All of gold -> rows to send: closed windows (all with ``closed_before`` None) whose count
    differs from what was exported (the first export, and the reference the incremental one
    must equal)."""

    def transform(gold: DataFrame) -> DataFrame:
        closed = gold.where(window_closed(width, None, closed_before))
        # Every tuple ClickHouse was sent may have left gold (a backfill): its count is taken back.
        sent = exported.where(window_closed(width, None, closed_before)).select(*EXPORT_KEY)
        return closed.transform(per_tuple_window()).transform(differences(exported, min_count, top_values, sent))

    return transform


# -- incremental exports ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportProgress:
    """Where an export batch left the export (the progress columns of OUTBOX_SCHEMA)."""

    gold_version: int
    newest_event: datetime
    closed_through: datetime


#: The outbox columns that say where a batch left the export (the same on every row of a batch).
PROGRESS_COLUMNS = ("gold_version", "newest_event", "closed_through")


def progress_of(batch: DataFrame) -> ExportProgress | None:
    """The rows of one outbox batch -> where it left the export (None for a batch written before
    the outbox kept it): every row carries it, so one row is read."""
    row = batch.select(*PROGRESS_COLUMNS).limit(1).collect()
    if not row or row[0]["gold_version"] is None:
        return None
    return ExportProgress(int(row[0]["gold_version"]), row[0]["newest_event"], row[0]["closed_through"])


def progress_in(rows: pa.RecordBatch | None) -> ExportProgress | None:
    """Outbox rows of one batch in Arrow (at least PROGRESS_COLUMNS) -> where it left the export,
    as :func:`progress_of` gives it: times as Spark collects them, naive in the local time zone."""
    if rows is None or not rows.num_rows or not rows["gold_version"][0].is_valid:
        return None
    # As microseconds: a file Spark wrote with INT96 timestamps reads back in nanoseconds.
    first = {c: rows[c].cast(pa.timestamp("us", "UTC"))[0].as_py() for c in ("newest_event", "closed_through")}
    newest, through = as_collected(first["newest_event"]), as_collected(first["closed_through"])
    return ExportProgress(int(rows["gold_version"][0].as_py()), newest, through)


def as_collected(value: datetime) -> datetime:
    """A timestamp read from Parquet (stored in UTC; naive where the reader leaves it so) -> as
    pyspark collects it: naive, in the local time zone."""
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone().replace(tzinfo=None)


def as_stored(value: datetime) -> datetime:
    """A time as pyspark collects it (naive: local) -> in UTC, to compare with what Parquet stores."""
    return value.astimezone(UTC)


def newest_event(rows: DataFrame, before: datetime | None) -> datetime | None:
    """The newest event time counted: ``before`` or the newest in ``rows``, whichever is later."""
    found = rows.agg(F.max("max_event_time")).first()
    return _later(before, found[0] if found else None)


def _later(*times: datetime | None) -> datetime | None:
    return max((t for t in times if t is not None), default=None)


def change_bounds(changes: DataFrame, width: timedelta, prev: ExportProgress) -> tuple[datetime | None, list[datetime]]:
    """Gold's change feed since ``prev`` -> (the newest event time counted, as
    :func:`newest_event`; the window starts of the keys :func:`changed_keys` finds late), in one
    aggregation: one row, and a list bounded by the time the late data spans, not by its rows."""
    late = F.col("_change_type").isin(*CHANGED) & window_closed(width, None, prev.closed_through)
    found = changes.agg(F.max("max_event_time"), F.collect_set(F.when(late, F.col(WINDOW_START)))).first()
    newest, windows = (found[0], found[1]) if found else (None, [])
    return _later(prev.newest_event, newest), sorted(windows)


#: The columns of gold's change feed the export reads: the key, the newest event, the change type.
CHANGE_COLUMNS = (*EXPORT_KEY, "max_event_time", "_change_type")


def held_change_bounds(
    changes: pa.Table, width: timedelta, prev: ExportProgress
) -> tuple[datetime | None, list[datetime], pa.Table]:
    """Gold's change feed since ``prev`` held in Arrow (CHANGE_COLUMNS) -> :func:`change_bounds`
    (the newest event time counted; the window starts of the late keys) and the late keys
    themselves (:func:`changed_keys`, EXPORT_KEY, one row each), computed in the driver: for a
    feed small enough to hold, where the frame functions would each be a Spark job."""
    through = pa.scalar(as_stored(prev.closed_through - width), pa.timestamp("us", "UTC"))
    images = pc.is_in(changes["_change_type"], pa.array(CHANGED))
    stamps = changes[WINDOW_START].cast(pa.timestamp("us", "UTC"))
    late = changes.filter(pc.and_kleene(images, pc.less_equal(stamps, through)))
    keys = (
        late.select(list(EXPORT_KEY))
        .group_by(list(EXPORT_KEY))
        .aggregate([])
        .sort_by([(c, "ascending") for c in EXPORT_KEY])
    )
    found = pc.max(changes["max_event_time"]).as_py()
    windows = sorted({as_collected(w) for w in keys[WINDOW_START].to_pylist()})
    return _later(prev.newest_event, as_collected(found) if found else None), windows, keys


@dataclass(frozen=True)
class ExportBounds:
    """Which windows a batch sends, and what it records for the next."""

    closed_before: datetime | None  # windows ending by this are closed (None: every window, a drain)
    through: datetime  # the end through which windows count as closed after this batch


def export_bounds(
    newest: datetime, width: timedelta, grace: timedelta, drain: bool, prev: ExportProgress | None
) -> ExportBounds:
    """The watermark (``newest`` minus ``grace``) closes windows; a drain closes every one, through
    the window of the newest event. The recorded end never moves back."""
    closed_before = None if drain else newest - grace
    through = newest + width if drain else newest - grace
    if prev is not None:
        through = max(through, prev.closed_through)
    return ExportBounds(closed_before, through)


def incremental_batch(
    late: DataFrame | None,
    late_windows: Sequence[datetime],
    exported: DataFrame,
    width: timedelta,
    after: datetime | None,
    closed_before: datetime | None,
    min_count: int,
    top_values: int | None = None,
) -> Callable[[DataFrame], DataFrame]:
    """All of gold -> rows to send after an earlier batch: windows closed since (ending after
    ``after``) and the ``late`` keys (:func:`changed_keys`, in ``late_windows``) of windows closed
    before, each summed over buckets and set against ``exported`` (what was exported of them): a
    late key gold no longer holds (a backfill removed it) has its exported count taken back."""

    def transform(gold: DataFrame) -> DataFrame:
        # No window closed since the last batch (the watermark has not passed a window's end):
        # gold is not read for one.
        none_closed = after is not None and closed_before is not None and closed_before <= after
        fresh = gold.limit(0) if none_closed else gold.where(window_closed(width, after, closed_before))
        if late_windows and late is not None:
            # Only the late windows' files are read (a list of window starts Parquet statistics
            # can skip by), then only the changed tuples of those windows are kept.
            again = gold.where(F.col(WINDOW_START).isin(list(late_windows))).join(late, list(EXPORT_KEY), "left_semi")
            fresh = again if none_closed else fresh.unionByName(again)
        gone = late if late_windows and late is not None else None
        return fresh.transform(per_tuple_window()).transform(differences(exported, min_count, top_values, gone))

    return transform


def outbox_rows(
    seq: int, gold_version: int | None, newest: datetime, through: datetime
) -> Callable[[DataFrame], DataFrame]:
    """Rows to send -> outbox batch ``seq`` (OUTBOX_SCHEMA), each row carrying where the batch leaves the export."""

    def transform(rows: DataFrame) -> DataFrame:
        return rows.select(
            F.lit(seq).cast("long").alias("export_seq"),
            "*",
            F.lit(gold_version).cast("long").alias("gold_version"),
            F.lit(newest).alias("newest_event"),
            F.lit(through).alias("closed_through"),
        )

    return transform


def in_send_order(outbox: DataFrame, width: timedelta) -> DataFrame:
    """An outbox batch -> EXPORT_COLUMNS and ``last_seen`` (the end of the row's window: when the
    tuple was last counted, to a window's width) in a fixed order, so a resend chunks the same
    rows alike."""
    return outbox.select(*EXPORT_COLUMNS, last_seen(width)).orderBy(*EXPORT_COLUMNS[:-1])


def with_last_seen(rows: pa.Table, width: timedelta) -> pa.Table:
    """Outbox rows in Arrow (EXPORT_COLUMNS) -> the same with ``last_seen`` (as :func:`last_seen`)."""
    return rows.append_column("last_seen", pc.add(rows[WINDOW_START], pa.scalar(width, pa.duration("us"))))


def last_seen(width: timedelta) -> Column:
    """``last_seen`` of a ClickHouse row: the end of its window."""
    w = int(width.total_seconds() * 1_000_000)
    return F.timestamp_micros(F.unix_micros(F.col(WINDOW_START)) + F.lit(w)).alias("last_seen")


def exported_of(outbox: DataFrame) -> DataFrame:
    """Outbox rows (every batch ever sent, or those of some windows) -> what ClickHouse holds of each
    tuple and window: the counts sent for it, summed (EXPORT_KEY and ``exported_count``, the frame
    :func:`differences` sets gold against)."""
    return outbox.groupBy(*EXPORT_KEY).agg(F.sum("count").cast("long").alias("exported_count"))


@dataclass(frozen=True)
class BatchFigures:
    """What an outbox batch holds: its rows, the counts it adds and how many rows are corrections."""

    rows: int
    count_sum: int
    corrections: int


def batch_figures(batch: DataFrame) -> BatchFigures:
    """An outbox batch -> its figures, in one aggregation (one row: figures, not rows)."""
    return cut_figures(batch.withColumns({"_gated": F.lit(False), "_dropped": F.lit(False)})).sent


@dataclass(frozen=True)
class CutFigures:
    """What a cut (rows to send, with the ``_gated`` and ``_dropped`` flags of :func:`differences`)
    holds: its gated and dropped rows, and the figures of the rows it sends."""

    gated: int
    dropped: int
    sent: BatchFigures


def cut_figure_columns() -> dict[str, Column]:
    """Over a cut, its figures (:class:`CutFigures`) as aggregates: for a pass that writes the cut
    to count them as it goes (``DataFrame.observe``)."""
    send = ~F.col("_gated") & ~F.col("_dropped")

    def total(c: Column) -> Column:
        return F.coalesce(F.sum(c.cast("long")), F.lit(0))

    return {
        "gated": total(F.col("_gated")),
        "dropped": total(F.col("_dropped")),
        "rows": total(send),
        "count_sum": total(F.when(send, F.col("count"))),
        "corrections": total(send & F.col("correction")),
    }


def cut_figures_of(found: Mapping[str, Any] | None) -> CutFigures:
    """The figures :func:`cut_figure_columns` counted (none counted: a cut of no rows)."""
    got = {k: int((found or {}).get(k) or 0) for k in ("gated", "dropped", "rows", "count_sum", "corrections")}
    return CutFigures(got["gated"], got["dropped"], BatchFigures(got["rows"], got["count_sum"], got["corrections"]))


def cut_figures(cut: DataFrame) -> CutFigures:
    """A cut -> its figures, in one aggregation (one row: figures, not rows)."""
    found = cut.agg(*(c.alias(k) for k, c in cut_figure_columns().items())).first()
    return cut_figures_of(found.asDict() if found else None)


def rechunk(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Arrow batches -> tables of exactly ``rows`` rows (the last one fewer), in order.

    Chunks are cut by position, not by how the batches arrived, so a resend of the same ordered rows
    gives the same chunks (and the same insert tokens)."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - size, batch.num_rows)
            pending.append(batch.slice(0, take))
            batch, size = batch.slice(take), size + take
            if size == rows:
                yield pa.Table.from_batches(pending)
                pending, size = [], 0
    if size:
        yield pa.Table.from_batches(pending)
