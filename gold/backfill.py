"""Backfills of gold: the windows of a range counted again from silver under the rules in force.

A backfill replaces what gold's two stages hold for the windows that start in a range: the
partials (one row per tuple, window and source batch, as stage 1 counts them, their batch marked
as a backfill's so stage 2 never adds them a second time) and gold's rows (their sums, as stage 2
makes them). What it reads, writes and in which order is the edge's
(:mod:`pipelines.runtime.backfill`); this module says which rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from gold.property_values import GOLD_KEY, WINDOW_START

#: The mark of a partial a backfill wrote: its batch id starts with it (the source batch follows).
BACKFILL_BATCH = "backfill:"


@dataclass(frozen=True)
class WindowRange:
    """The windows of ``width`` that start in [``first``, ``end``): ``first`` is a window's start,
    ``end`` the start of the first window past the range."""

    first: datetime
    end: datetime
    width: timedelta

    @property
    def windows(self) -> int:
        return int((self.end - self.first) / self.width)

    def holds(self, column: str = WINDOW_START) -> str:
        """SQL text true for a row whose ``column`` (a window start, or an event time: the events
        of those windows) falls in the range, written on the column alone so that the files'
        statistics can skip files."""
        return f"{column} >= {_instant(self.first)} AND {column} < {_instant(self.end)}"

    def bounds(self) -> dict[str, str]:
        """The range as the event log records it: ``from`` and ``to``, in UTC."""
        return {"from": iso(self.first), "to": iso(self.end)}

    def __str__(self) -> str:
        return f"[{iso(self.first)}, {iso(self.end)})"


def iso(at: datetime) -> str:
    """A window start (UTC) as the command line takes and prints one."""
    return f"{at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def _instant(at: datetime) -> str:
    """An instant as SQL text both engines compare a timestamp column with: a string in UTC, said
    so (Spark and DataFusion cast it to the column's type; DataFusion's TIMESTAMP literal has no
    zone, which delta-rs does not compare with a column that has one)."""
    return f"'{at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}Z'"


def window_range(start: datetime, end: datetime, width: timedelta) -> WindowRange:
    """The windows of ``width`` (aligned to the epoch, as gold's) that start in [``start``, ``end``);
    naive times are UTC. Empty where no window starts there (``first == end``)."""
    start, end = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (start, end))
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def ceil(t: datetime) -> datetime:
        steps = -((epoch - t) // width)  # whole windows from the epoch, rounded up
        return epoch + steps * width

    first, past = ceil(start.astimezone(UTC)), ceil(end.astimezone(UTC))
    return WindowRange(first, max(first, past), width)


def earliest_window(least_event: datetime | None, width: timedelta) -> datetime | None:
    """The first window start a backfill can recount: that of the earliest event silver holds
    (a naive time is local, as pyspark collects one)."""
    if least_event is None:
        return None
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + ((least_event.astimezone(UTC) - epoch) // width) * width


def marked(partials: DataFrame) -> DataFrame:
    """Partials counted by a backfill: their batch ids marked (:data:`BACKFILL_BATCH`)."""
    return partials.withColumn("batch_id", F.concat(F.lit(BACKFILL_BATCH), F.coalesce("batch_id", F.lit(""))))


def counted_by_stages(partials: DataFrame) -> DataFrame:
    """The partials stage 2 adds to gold: all but a backfill's, which the backfill put in gold
    itself."""
    return partials.where(~F.coalesce(F.col("batch_id").startswith(BACKFILL_BATCH), F.lit(False)))


def replaced_figures() -> Callable[[DataFrame], DataFrame]:
    """Gold's change feed of a backfill's commit -> one row: the tuples (per tuple, bucket and
    window) it added, removed, changed and kept as they were."""

    def transform(changes: DataFrame) -> DataFrame:
        before = F.sum(F.when(F.col("_change_type") == "delete", F.col("count")))
        after = F.sum(F.when(F.col("_change_type") == "insert", F.col("count")))
        per_key = changes.groupBy(*GOLD_KEY).agg(before.alias("before"), after.alias("after"))
        b, a = F.col("before"), F.col("after")

        def n(cond: Column) -> Column:
            return F.coalesce(F.sum(F.when(cond, 1)), F.lit(0)).cast("long")

        return per_key.agg(
            n(b.isNull()).alias("tuples_added"),
            n(a.isNull()).alias("tuples_removed"),
            n(a.isNotNull() & b.isNotNull() & (a != b)).alias("tuples_changed"),
            n(a == b).alias("tuples_unchanged"),
        )

    return transform
