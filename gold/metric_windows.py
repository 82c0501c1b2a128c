"""Panes -> windows: closed windows of every metric aggregation, and queries over them.

A window ``[start, start + window)`` (``start`` a multiple of ``slide``) is the merge of its
``window / slide`` panes. It closes, and is written to ``gold/metric_windows`` once as a
``window`` row, when the aggregation's watermark passes its end. A forwarded late pane of an
already-closed window becomes a ``late`` row for that window; raw aggregations give ``raw`` rows
(point windows, one per sample). Queries merge every row of a window (and, for windows not closed
yet, the final panes so far, as ``open``) by the merge rules of ``silver.metric_panes``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import reduce
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bronze.primitives import micros, plus
from silver.config import AggregationSettings

ACCUMULATOR_COLUMNS = [
    "count",
    "sum",
    "min",
    "max",
    "increase",
    "quantiles",
    "distinct",
    "frequency",
    "top_values",
]
METRIC_WINDOWS_SCHEMA = StructType(
    [
        StructField("aggregation", StringType()),
        StructField("key", StringType()),
        StructField("labels", MapType(StringType(), StringType())),
        StructField("window_start", TimestampType()),
        StructField("window_end", TimestampType()),
        StructField("kind", StringType()),  # window | late | raw
        StructField("count", LongType()),
        StructField("sum", DoubleType()),
        StructField("min", DoubleType()),
        StructField("max", DoubleType()),
        StructField("increase", DoubleType()),
        StructField("quantiles", BinaryType()),
        StructField("distinct", BinaryType()),
        StructField("frequency", BinaryType()),
        StructField("top_values", MapType(StringType(), LongType())),
        StructField("closed_through", TimestampType()),  # the watermark that closed the window
    ]
)
METRIC_WINDOW_COLUMNS = [f.name for f in METRIC_WINDOWS_SCHEMA.fields]
WINDOW_KEY = ["aggregation", "key", "window_start", "window_end"]


# -- count-min sketches ---------------------------------------------------------------------------
# Spark's CountMinSketchImpl.writeTo, big-endian: version (int 1), total count (long), depth (int),
# width (int), depth hash seeds (long), then depth * width counters (long).
_CMS_HEADER = struct.Struct(">iqii")


def merge_cms(blobs: Iterable[bytes | None]) -> bytes | None:
    """Add count-min sketches built with the same eps, confidence and seed."""
    total, seeds, table, shape = 0, b"", None, None
    for blob in blobs:
        if blob is None:
            continue
        version, count, depth, width = _CMS_HEADER.unpack_from(blob)
        if version != 1:
            raise ValueError(f"count-min sketch version {version} is not Spark's version 1")
        start = _CMS_HEADER.size + 8 * depth
        counters = np.frombuffer(blob, dtype=">i8", offset=start, count=depth * width)
        if table is None:
            shape, seeds, table = (depth, width), blob[_CMS_HEADER.size : start], counters.astype(np.int64)
        elif (depth, width) != shape or blob[_CMS_HEADER.size : start] != seeds:
            raise ValueError("count-min sketches of different shape or seeds cannot be merged")
        else:
            table += counters
        total += count
    if table is None or shape is None:
        return None
    return _CMS_HEADER.pack(1, total, *shape) + seeds + table.astype(">i8").tobytes()


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h1: int, k1: int) -> int:
    k1 = _rotl((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593 & _M32
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _signed(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


def spark_murmur3(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` (a signed 32-bit int): Murmur3 over the
    little-endian 4-byte words, then each trailing byte mixed in as a whole sign-extended word,
    where standard Murmur3 packs them into one."""
    h1 = seed & _M32
    aligned = len(data) - len(data) % 4
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix(h1, word)
    for byte in data[aligned:]:
        h1 = _mix(h1, (byte - 256 if byte > 127 else byte) & _M32)
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return _signed(h1)


def cms_estimate(blob: bytes, items: Sequence[str]) -> list[int]:
    """Estimated counts of ``items`` in a Spark count-min sketch, as Spark's ``CountMinSketchImpl``
    estimates a string: its UTF-8 bytes hashed twice (seed 0, then the first hash), row ``i``'s
    bucket ``|(h1 + i * h2) % width|`` in Java's 32-bit arithmetic, the least counter of the rows."""
    version, _, depth, width = _CMS_HEADER.unpack_from(blob)
    if version != 1:
        raise ValueError(f"count-min sketch version {version} is not Spark's version 1")
    start = _CMS_HEADER.size + 8 * depth
    table = np.frombuffer(blob, dtype=">i8", offset=start, count=depth * width).reshape(depth, width)
    out = []
    for item in items:
        data = item.encode("utf-8")
        h1 = spark_murmur3(data, 0)
        h2 = spark_murmur3(data, h1)
        buckets = [abs(int(np.fmod(_signed((h1 + i * h2) & _M32), width))) for i in range(depth)]
        out.append(int(min(table[i, b] for i, b in enumerate(buckets))))
    return out


# -- windows --------------------------------------------------------------------------------------
def windows_of(panes: DataFrame, agg: AggregationSettings) -> DataFrame:
    """Each pane row once per window that contains it (``window_start``, ``window_end`` added)."""
    slide = agg.slide or agg.window
    n = round(agg.window / slide)
    back = F.explode(F.sequence(F.lit(0), F.lit(n - 1))).alias("_i")
    starts = panes.select("*", back)
    start = F.timestamp_micros(F.unix_micros("pane_start") - F.col("_i") * F.lit(micros(slide)))
    return (
        starts.withColumn("window_start", start)
        .withColumn("window_end", plus(F.col("window_start"), agg.window))
        .drop("_i")
    )


def merged(rows: DataFrame, group: Sequence[str], top_k: int, *extra: Column) -> DataFrame:
    """Rows of the same group merged by the accumulators' rules; ``frequency`` (a sketch or a list
    of them) becomes a list of sketches, merged by :func:`finish` once the rows are in Arrow."""
    summed = F.aggregate(
        F.collect_list("top_values"),
        F.create_map().cast(MapType(StringType(), LongType())),
        lambda acc, m: F.map_zip_with(acc, m, lambda _k, a, b: F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0))),
    )
    ranked = F.array_sort(
        F.map_entries(summed),
        lambda left, right: (
            F.when(left["value"] > right["value"], -1)
            .when(left["value"] < right["value"], 1)
            .otherwise(F.when(left["key"] < right["key"], -1).when(left["key"] > right["key"], 1).otherwise(0))
        ),
    )
    return rows.groupBy(*group).agg(
        F.first("labels").alias("labels"),
        F.sum("count").alias("count"),
        F.sum("sum").alias("sum"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        F.sum("increase").alias("increase"),
        F.when(F.count("quantiles") > 0, F.kll_merge_agg_double("quantiles")).alias("quantiles"),
        F.when(F.count("distinct") > 0, F.hll_union_agg("distinct")).alias("distinct"),
        (
            F.flatten(F.collect_list("frequency"))
            if isinstance(rows.schema["frequency"].dataType, ArrayType)
            else F.collect_list("frequency")
        ).alias("frequency"),
        F.when(F.count("top_values") > 0, F.map_from_entries(F.slice(ranked, 1, top_k))).alias("top_values"),
        *extra,
    )


def finish(rows: DataFrame) -> DataFrame:
    """Merge the ``frequency`` lists into one sketch per row (Spark has no merge aggregate for
    count-min sketches; the merge runs on the executors, one small list of sketches per window)."""
    if "frequency" not in rows.columns:
        return rows
    merge = F.udf(lambda blobs: merge_cms(blobs or []), BinaryType(), useArrow=True)
    return rows.withColumn("frequency", merge(F.col("frequency")))


def close_windows(
    agg: AggregationSettings, new_panes: DataFrame, panes: DataFrame, closed: datetime | None, watermark: datetime
) -> DataFrame:
    """Window rows for windows ending in (``closed``, ``watermark``] from ``panes`` (every final pane
    of the aggregation so far), and late rows for the new late panes of windows ending by ``closed``.
    """
    out = []
    candidates = windows_of(panes, agg).where(F.col("window_end") <= F.lit(watermark))
    if closed is not None:
        candidates = candidates.where(F.col("window_end") > F.lit(closed))
    out.append(_as_rows(merged(candidates, WINDOW_KEY, agg.top_candidates), "window", watermark))
    if closed is not None:
        late = windows_of(new_panes.where("late"), agg).where(F.col("window_end") <= F.lit(closed))
        out.append(_as_rows(merged(late, WINDOW_KEY, agg.top_candidates), "late", watermark))
    return out[0] if len(out) == 1 else out[0].unionByName(out[1])


def raw_rows(panes: DataFrame) -> DataFrame:
    rows = panes.withColumn("window_start", F.col("pane_start")).withColumn("window_end", F.col("pane_end"))
    rows = rows.withColumn("frequency", F.array().cast("array<binary>"))
    return _as_rows(rows, "raw", None)


def _as_rows(df: DataFrame, kind: str, closed_through: datetime | None) -> DataFrame:
    return df.select(
        *(
            {
                "kind": F.lit(kind).alias("kind"),
                "closed_through": F.lit(closed_through).cast("timestamp").alias("closed_through"),
            }.get(c, F.col(c))
            for c in METRIC_WINDOW_COLUMNS
        )
    )


def closes_through(closed: datetime | None, watermark: datetime) -> datetime:
    """Where a run closes windows through: its panes' watermark, never before what is closed already."""
    return watermark if closed is None else max(closed, watermark)


def window_rows(parts: Sequence[DataFrame]) -> DataFrame:
    """Each aggregation's window, late and raw rows -> one frame of METRIC_WINDOW_COLUMNS."""
    return finish(reduce(DataFrame.unionByName, parts))


def panes_after(closed: datetime, agg: AggregationSettings) -> Column:
    """Panes some window ending after ``closed`` holds: those starting after ``closed - window``."""
    return F.col("pane_start") > F.lit(closed - agg.window)


# -- queries --------------------------------------------------------------------------------------
def answer(
    spark: SparkSession,
    agg: AggregationSettings,
    rows: DataFrame,
    group_by: Sequence[str] | None,
    quantiles: Sequence[float],
    top: int,
) -> list[dict[str, Any]]:
    """Merge the rows of each window (and group) and evaluate every accumulator."""
    if group_by is None:
        names = ["window_start", "window_end", "key"]
    else:
        names = ["window_start", "window_end", *group_by]
        rows = rows.select("*", *(F.coalesce(F.col("labels")[g], F.lit("")).alias(g) for g in group_by))
    m = merged(rows, names, agg.top_candidates, F.array_sort(F.collect_set("kind")).alias("kinds"))
    acc = set(agg.accumulators)
    seconds = agg.window.total_seconds()
    cols: list[Column] = [F.col(n) for n in names] + [F.col("kinds")]
    if agg.raw or acc & {"count", "sum", "min", "max"}:
        cols += [F.col("count"), F.col("sum"), F.col("min"), F.col("max")]
    if "increase" in acc:
        cols += [F.col("increase"), (F.col("increase") / F.lit(seconds)).alias("rate")]
    for q in quantiles if "quantiles" in acc else ():
        cols.append(F.kll_sketch_get_quantile_double("quantiles", F.lit(q)).alias(f"q{q:g}"))
    if "distinct" in acc:
        cols.append(F.round(F.hll_sketch_estimate("distinct")).cast("long").alias("distinct"))
    if "frequency" in acc:
        cols += [F.col("frequency"), F.col("top_values")]
    table = finish(m.select(*cols).orderBy(*names)).toArrow()  # a query answer: windows, not raw rows
    out = table.to_pylist()
    if "frequency" in acc:
        for row in out:
            blob, candidates = row.pop("frequency"), row.pop("top_values") or {}
            items = [k for k, _ in candidates] if isinstance(candidates, list) else list(candidates)
            counts = cms_estimate(blob, items) if blob and items else []
            ranked = sorted(zip(items, counts, strict=True), key=lambda kv: (-kv[1], kv[0]))[:top]
            row["top"] = ranked
            row["frequency_total"] = _cms_total(blob)
    return out


def _cms_total(blob: bytes | None) -> int:
    return 0 if not blob else _CMS_HEADER.unpack_from(blob)[1]
