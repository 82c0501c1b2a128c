"""Which of a table's files may hold the rows a read asks for, by the statistics of the log's add
actions (``min.<column>``, ``max.<column>``), with no file opened: the delta-rs engine's data
skipping for reads by time and by window."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

#: (least, greatest) statistics of each file -> whether it may hold the rows asked for.
MayHold = Callable[[pa.ChunkedArray, pa.ChunkedArray], pa.ChunkedArray]


def kept_files(actions: pa.Table, column: str, may_hold: MayHold) -> list[str]:
    """The paths of :func:`kept_actions`."""
    return [str(p) for p in kept_actions(actions, column, may_hold)["path"].to_pylist()]


def kept_actions(actions: pa.Table, column: str, may_hold: MayHold) -> pa.Table:
    """The add actions (``DeltaTable.get_add_actions(flatten=True)``) whose statistics for
    ``column`` ``may_hold`` the rows asked for. A file without both statistics may hold anything,
    and is kept. A timestamp's statistics keep milliseconds: its greatest value is below the
    statistic plus 1 ms."""
    low, high = f"min.{column}", f"max.{column}"
    if low in actions.column_names and high in actions.column_names:
        least, greatest = actions[low], actions[high]
        if pa.types.is_timestamp(greatest.type):
            greatest = pc.add(greatest, pa.scalar(timedelta(milliseconds=1), pa.duration(greatest.type.unit)))
        known = pc.and_(pc.is_valid(least), pc.is_valid(greatest))
        actions = actions.filter(pc.or_kleene(pc.invert(known), may_hold(least, greatest)))
    return actions


def rows_since(table: pa.Table, column: str, since: datetime) -> pa.Table:
    """The rows of ``table`` whose ``column`` (a timestamp) is ``since`` or later."""
    return table.filter(pc.greater_equal(table[column], _scalar(since, table.schema.field(column).type)))


def from_time(since: datetime) -> MayHold:
    """Files that may hold a value at ``since`` or later."""
    return lambda least, greatest: pc.greater_equal(greatest, _scalar(since, greatest.type))


def in_windows(after: datetime | None, values: Sequence[datetime]) -> MayHold:
    """Files that may hold a value later than ``after`` (None: none) or one of ``values``."""

    def may_hold(least: pa.ChunkedArray, greatest: pa.ChunkedArray) -> pa.ChunkedArray:
        holds = [pc.greater(greatest, _scalar(after, greatest.type))] if after is not None else []
        for v in values:
            value = _scalar(v, greatest.type)
            holds.append(pc.and_(pc.less_equal(least, value), pc.greater_equal(greatest, value)))
        return functools.reduce(pc.or_, holds) if holds else pc.and_(pc.is_valid(least), pc.is_null(least))

    return may_hold


def _scalar(value: datetime, type_: pa.DataType) -> pa.Scalar:
    """A datetime as a statistic's type. A naive one is local time, as pyspark hands out the
    timestamps it collects (and reads them back in ``F.lit``)."""
    return pa.scalar(value.astimezone(UTC) if pa.types.is_timestamp(type_) else value, type_)
