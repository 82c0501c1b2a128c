"""Silver events unique by identity: an event sent twice is counted once.

An event's identity is ``(team_id, uuid)``. A repeat is an event whose identity was seen before
with an event time within the *horizon* (``silver.dedup_horizon``, 24 h by default):

- in the same batch, landed before it: in bronze's commit order, then by file, Kafka partition
  and offset; copies that tie on all of these (two lines of one file) are ordered by their
  content, so that a rerun keeps the same one;
- or already in silver.

The first copy is kept; repeats are dropped and counted. An identity seen again beyond the horizon
is a new event: the bound that keeps the check to the part of silver the horizon covers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from bronze.primitives import micros

IDENTITY = ("team_id", "uuid")
#: Bronze's columns (and its change feed's) that give the order events landed in, then the content
#: that breaks ties between copies landed together.
LANDING_ORDER = ("_commit_version", "source_file", "partition", "offset", "raw")
#: Where a bronze row landed: its commit, file, Kafka partition and offset (a file's line is its
#: offset). Two rows of a batch share it only where one place was landed twice.
LANDED_AT = LANDING_ORDER[:-1]
REPEAT = "_repeat"


def _within(a: Column, b: Column, horizon: timedelta) -> Column:
    return F.abs(F.unix_micros(a) - F.unix_micros(b)) <= F.lit(micros(horizon))


def recent_identities(silver: DataFrame, identity: Sequence[str] = IDENTITY) -> DataFrame:
    """Silver rows -> one row per identity with its earliest and latest event time (the table may
    hold an identity more than once: rows written before deduplication was on)."""
    return silver.groupBy(*identity).agg(F.min("event_time").alias("_first"), F.max("event_time").alias("_last"))


def mark_repeats(
    seen: DataFrame | None,
    horizon: timedelta,
    time: str = "event_time",
    order: Sequence[str] = LANDING_ORDER,
    identity: Sequence[str] = IDENTITY,
) -> Callable[[DataFrame], DataFrame]:
    """Rows of a batch -> the same rows with ``_repeat``: true for a repeat (see the module).

    ``seen`` is :func:`recent_identities` of what silver holds near the batch's event times (None:
    silver is not consulted). ``time`` is the batch's event-time column. A row missing part of its
    identity is never a repeat.
    """

    def transform(rows: DataFrame) -> DataFrame:
        landed = Window.partitionBy(*identity).orderBy(*(F.col(c).asc_nulls_last() for c in order))
        first_time = F.first(F.col(time)).over(landed.rowsBetween(Window.unboundedPreceding, Window.currentRow))
        known = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in identity])
        in_batch = known & (F.row_number().over(landed) > 1) & _within(F.col(time), first_time, horizon)
        marked = rows.withColumn(REPEAT, in_batch)
        if seen is None:
            return marked
        held = marked.join(seen, list(identity), "left")
        in_silver = F.col("_first").isNotNull() & (
            _within(F.col(time), F.col("_first"), horizon)
            | _within(F.col(time), F.col("_last"), horizon)
            | F.col(time).between(F.col("_first"), F.col("_last"))
        )
        return held.withColumn(REPEAT, F.col(REPEAT) | in_silver).drop("_first", "_last")

    return transform


def suspects(
    rows: DataFrame,
    held: DataFrame | None,
    time: str = "timestamp",
    identity: Sequence[str] = IDENTITY,
    few: bool = False,
) -> DataFrame:
    """The identities of a batch that may repeat, with what silver holds of each: one row per
    identity the batch holds more than once or silver holds at all (``held``: silver's rows near the
    batch's event times, None: silver is not consulted), with silver's earliest and latest event
    time of it (``_first``, ``_last``; null when silver holds none), as :func:`mark_repeats` takes
    them for ``seen``.

    As small as the repeats are (each repeat and what it repeats): the rows of every other identity
    are not repeats and skip :func:`mark_repeats`, whose window would otherwise sort the whole
    batch. One aggregation over the batch's and silver's identity columns. A row missing part of its
    identity is never a suspect. With ``few`` (a batch small enough to broadcast), silver's rows
    are first narrowed to the batch's identities by a broadcast semi-join, so the aggregation takes
    the batch's identities, not everything silver holds near the batch's times.
    """
    known = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in identity])
    ids = rows.where(known).select(*identity, F.lit(1).alias("_copies"), F.lit(None).cast("timestamp").alias("_held"))
    if held is not None:
        silver = held.where(known).select(*identity, F.lit(0).alias("_copies"), F.col("event_time").alias("_held"))
        if few:  # only silver's identities the batch holds can make a suspect
            silver = silver.join(F.broadcast(ids.select(*identity)), list(identity), "left_semi")
        ids = ids.unionByName(silver)
    grouped = ids.groupBy(*identity).agg(
        F.sum("_copies").alias("_copies"), F.min("_held").alias("_first"), F.max("_held").alias("_last")
    )
    twice = (F.col("_copies") > 1) | ((F.col("_copies") > 0) & F.col("_first").isNotNull())
    return grouped.where(twice).drop("_copies")


def held_suspects(ids: pa.Table, held: pa.Table | None, identity: Sequence[str] = IDENTITY) -> pa.Table:
    """:func:`suspects` of identities held in the driver (a batch and a part of silver known to be
    small): ``ids``, the batch's identity columns; ``held``, silver's identity columns and
    ``event_time`` near the batch's event times (None: silver is not consulted). The same rows,
    as an Arrow table (``_first`` and ``_last`` in ``held``'s time type, null where silver holds
    none): an aggregation in the driver where Spark would plan a shuffle and a job."""
    keys = list(identity)
    known = ids.select(keys).filter(reduce(pc.and_, [pc.is_valid(ids[c]) for c in keys]))
    copies = known.group_by(keys).aggregate([([], "count_all")])
    times = held.schema.field("event_time").type if held is not None else pa.timestamp("us", "UTC")
    if held is not None:
        held = held.filter(reduce(pc.and_, [pc.is_valid(held[c]) for c in keys]))
        held = held.join(copies.select(keys), keys, join_type="left semi")  # only the batch's
        seen = held.group_by(keys).aggregate([("event_time", "min"), ("event_time", "max")])
        seen = seen.rename_columns([*keys, "_first", "_last"])
    else:
        seen = pa.table({**{c: pa.array([], known.schema.field(c).type) for c in keys}, "_first": [], "_last": []})
        seen = seen.cast(pa.schema([*(known.schema.field(c) for c in keys), ("_first", times), ("_last", times)]))
    grouped = copies.join(seen, keys, join_type="left outer")
    twice = pc.or_(pc.greater(grouped["count_all"], 1), pc.is_valid(grouped["_first"]))
    return grouped.filter(twice).select([*keys, "_first", "_last"])


def held_repeats(
    rows: pa.Table, seen: pa.Table, horizon: timedelta, time: str = "timestamp", identity: Sequence[str] = IDENTITY
) -> pa.Table | None:
    """:func:`mark_repeats` decided in the driver, for a batch held there: ``rows``, the batch's
    identity, :data:`LANDED_AT` and ``time`` columns; ``seen``, its suspects (:func:`held_suspects`),
    the only identities that can repeat. The repeats, by identity and :data:`LANDED_AT` (which name
    a row of bronze); None where those do not decide them: two of a suspect's rows landed at one
    place (only their content orders them) or one has no event time."""
    keys, named = list(identity), [*identity, *LANDED_AT]
    mine = rows.select([*named, time]).join(seen, keys, join_type="inner")
    if not mine.num_rows:
        return mine.select(named)
    if mine[time].null_count:
        return None
    mine = mine.sort_by([(c, "ascending", "at_end") for c in named])
    again = reduce(np.logical_and, [_as_before(mine[c]) for c in keys])  # not its identity's first row
    if (again & reduce(np.logical_and, [_as_before(mine[c]) for c in LANDED_AT])).any():
        return None
    t, limit = _micros(mine[time]), micros(horizon)
    first_copy = np.maximum.accumulate(np.where(again, 0, np.arange(mine.num_rows)))
    in_batch = again & (np.abs(t - t[first_copy]) <= limit)
    held = pc.is_valid(mine["_first"]).to_numpy(zero_copy_only=False)
    first, last = _micros(mine["_first"]), _micros(mine["_last"])
    near = (np.abs(t - first) <= limit) | (np.abs(t - last) <= limit) | ((first <= t) & (t <= last))
    return mine.filter(pa.array(in_batch | (held & near))).select(named)


def _as_before(column: pa.ChunkedArray) -> np.ndarray:
    """Per row of a column: whether it holds what the row before holds (null as null)."""
    now, before = column[1:], column[:-1]
    same = pc.or_(pc.fill_null(pc.equal(now, before), False), pc.and_(pc.is_null(now), pc.is_null(before)))
    return np.concatenate([[False], same.to_numpy(zero_copy_only=False)]).astype(bool)


def _micros(times: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column as microseconds since the epoch (null as 0: masked by the caller)."""
    us = times.cast(pa.timestamp("us", getattr(times.type, "tz", None)))
    return pc.fill_null(us.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)


def mark_held_repeats(repeats: DataFrame, identity: Sequence[str] = IDENTITY) -> Callable[[DataFrame], DataFrame]:
    """Rows of a batch -> the same rows with ``_repeat`` (as :func:`mark_repeats` marks them):
    true for those ``repeats`` names by identity and :data:`LANDED_AT` (:func:`held_repeats`).
    One broadcast join, as small as the repeats: no window, no second read of the batch."""
    named = [*identity, *LANDED_AT]

    def transform(rows: DataFrame) -> DataFrame:
        found = repeats.select(*(F.col(c).alias(f"_at{i}") for i, c in enumerate(named)), F.lit(True).alias(REPEAT))
        at = reduce(lambda a, b: a & b, [rows[c].eqNullSafe(found[f"_at{i}"]) for i, c in enumerate(named)])
        joined = rows.join(F.broadcast(found), at, "left")
        return joined.select(*(rows[c] for c in rows.columns), F.coalesce(found[REPEAT], F.lit(False)).alias(REPEAT))

    return transform


def first_copies(rows: DataFrame) -> DataFrame:
    """Marked rows -> the rows that are not repeats, without the mark."""
    return rows.where(~F.col(REPEAT)).drop(REPEAT)
