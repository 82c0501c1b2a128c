"""What a delta-rs table's log says of its data without opening a file: the add actions'
statistics (rows, sizes, a column's least and greatest values) and the newest commit."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipelines.storage.specs import Greatest, TableSpec, TableStats


def _holding_rows(actions: pa.Table) -> pa.Table:
    """The add actions of files that may hold rows (a file whose count is unknown may)."""
    if "num_records" not in actions.column_names:
        return actions
    rows = actions.column("num_records")
    return actions.filter(pc.or_kleene(pc.is_null(rows), pc.greater(rows, 0)))


def greatest(dt: DeltaTable, spec: TableSpec, column: str, buckets: Sequence[int] | None = None) -> Greatest | None:
    """The greatest ``column`` the table holds (in ``buckets``), from the add actions' statistics. A
    timestamp's statistics keep milliseconds, so its bound is the statistic plus 1 ms. None when a
    file that may hold rows (its row count unknown included) has no statistic for ``column``."""
    version = dt.version()
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return Greatest(None, version)
    name = f"max.{column}"
    if buckets and "bucket" in spec.partition_by:
        if "partition.bucket" not in actions.column_names:
            return None
        wanted = pa.array(sorted({str(int(b)) for b in buckets}), pa.string())
        actions = actions.filter(pc.is_in(actions.column("partition.bucket").cast(pa.string()), wanted))
    actions = _holding_rows(actions)
    if actions.num_rows == 0:
        return Greatest(None, version)
    if name not in actions.column_names or actions.column(name).null_count:
        return None
    value = pc.max(actions.column(name)).as_py()
    if isinstance(value, datetime):
        value += timedelta(milliseconds=1)
    return Greatest(value, version)


def least(dt: DeltaTable, column: str) -> tuple[bool, Any]:
    """(known, the least ``column`` the table holds: None for no rows), from the add actions'
    statistics; not known when a file that may hold rows has no statistic for it."""
    actions = _holding_rows(pa.table(dt.get_add_actions(flatten=True)))
    if actions.num_rows == 0:
        return True, None
    name = f"min.{column}"
    if name not in actions.column_names or actions.column(name).null_count:
        return False, None
    return True, pc.min(actions.column(name)).as_py()


def table_stats(dt: DeltaTable, spec: TableSpec) -> TableStats:
    """Rows, files and bytes of the current version, and its newest commit."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else []
    last = dt.history(1)
    ts = datetime.fromtimestamp(last[0]["timestamp"] / 1000, tz=UTC) if last else None
    return TableStats(
        spec.key,
        dt.version(),
        sum(r or 0 for r in rows),
        actions.num_rows,
        ts,
        last[0].get("operation") if last else None,
        sum(actions.column("size_bytes").to_pylist()) if "size_bytes" in actions.column_names else 0,
    )
