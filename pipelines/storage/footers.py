"""What Delta's log says of a Parquet file Spark wrote: its partition values, from its hive-style
folders, and its statistics (rows, least and greatest values, nulls), from its footer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from pipelines.errors import StorageError

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: Delta's default: string statistics keep a 32-character prefix (a max is kept only when whole).
STRING_STATS_PREFIX = 32
_STATS_TYPES = (IntegerType, LongType, ShortType, DoubleType, FloatType, StringType, TimestampType, DateType)


def partition_values(rel: str, partition_by: Sequence[str]) -> dict[str, str | None]:
    """``bucket=3/part-0.parquet`` -> ``{"bucket": "3"}``, with Hive's escapes and null undone."""
    found: dict[str, str | None] = {}
    for segment in rel.split("/")[:-1]:
        key, sep, value = segment.partition("=")
        if sep and key in partition_by:
            raw = unquote(value)
            found[key] = None if raw == HIVE_NULL else raw
    missing = [c for c in partition_by if c not in found]
    if missing:
        raise StorageError(f"file {rel} is not under a hive-style folder for {', '.join(missing)}")
    return {c: found[c] for c in partition_by}


def footer_stats(meta: pq.FileMetaData, schema: StructType, partition_by: Sequence[str]) -> dict[str, Any]:
    """Delta file statistics (numRecords, minValues, maxValues, nullCount) from a Parquet footer.

    A column gets a bound only where every row group has one; timestamps are truncated to
    milliseconds as Delta writes them, so a maximum is rounded up to stay an upper bound.
    """
    types = {f.name: f.dataType for f in schema.fields if f.name not in partition_by}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for col in range(meta.num_columns):
        name = meta.row_group(0).column(col).path_in_schema if meta.num_row_groups else None
        if name is None or name not in types:
            continue  # nested leaves: Delta's skipping does not need them here
        kind = types[name]
        lo: Any = None
        hi: Any = None
        n_null: int | None = 0
        bounded = isinstance(kind, _STATS_TYPES)
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(col).statistics
            if st is None:
                bounded, n_null = False, None
                break
            if n_null is not None:
                n_null = n_null + st.null_count if st.has_null_count else None
            if not bounded:
                continue
            if not st.has_min_max:
                if st.has_null_count and st.null_count == meta.row_group(rg).num_rows:
                    continue  # all null: no bound needed from this group
                bounded = False
                continue
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
        if n_null is not None:
            nulls[name] = n_null
        if bounded and lo is not None and hi is not None:
            low, high = _stat_value(lo, kind, upper=False), _stat_value(hi, kind, upper=True)
            if low is not None:
                mins[name] = low
            if high is not None:
                maxs[name] = high
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _stat_value(value: Any, kind: Any, upper: bool) -> Any:
    if isinstance(kind, TimestampType):
        ts = value if isinstance(value, datetime) else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value)
        ts = ts.astimezone(UTC) if ts.tzinfo else ts.replace(tzinfo=UTC)
        ms = ts.replace(microsecond=ts.microsecond - ts.microsecond % 1000)
        if upper and ms != ts:
            ms += timedelta(milliseconds=1)
        return ms.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms.microsecond // 1000:03d}Z"
    if isinstance(kind, DateType):
        return value.isoformat() if isinstance(value, date) else None
    if isinstance(kind, StringType):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if len(text) <= STRING_STATS_PREFIX:
            return text
        return None if upper else text[:STRING_STATS_PREFIX]
    if isinstance(kind, (DoubleType, FloatType)):
        return None if math.isnan(value) else float(value)
    if isinstance(kind, BooleanType):
        return None
    return int(value)
