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

from collections.abc import Callable
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from gold.property_values import KEY_FIELDS, TUPLE, WINDOW_START

EXPORT_KEY = (*TUPLE, WINDOW_START)
EXPORT_DATASET = "clickhouse/property_values"  # what the export's quality suite is named by
EXPORT_COLUMNS = (*EXPORT_KEY, "count")

#: What was exported so far, one row per tuple and window.
_TUPLE_WINDOW = [f for f in KEY_FIELDS if f.name != "bucket"]

EXPORTED_SCHEMA = StructType(
    [
        *_TUPLE_WINDOW,
        StructField("exported_count", LongType()),
        StructField("export_seq", LongType()),
    ]
)
#: One export batch, written before anything is sent so a retry sends exactly the same rows.
OUTBOX_SCHEMA = StructType(
    [
        StructField("export_seq", LongType()),
        *_TUPLE_WINDOW,
        StructField("count", LongType()),  # what this batch adds in ClickHouse
        StructField("total", LongType()),  # the gold count it brings ClickHouse to
        StructField("correction", BooleanType()),  # the window was exported before
    ]
)


def watermark(gold: DataFrame, grace: timedelta) -> datetime | None:
    """Newest event time counted in gold minus ``grace`` (None while gold is empty)."""
    newest = gold.agg(F.max("max_event_time")).first()
    return None if newest is None or newest[0] is None else newest[0] - grace


def export_batch(
    exported: DataFrame, width: timedelta, closed_before: datetime | None, min_count: int
) -> Callable[[DataFrame], DataFrame]:
    """Gold rows -> rows to send: closed windows (all with ``closed_before`` None) whose count
    differs from what was exported, minus gated ones; with a ``_gated`` flag kept for metrics."""
    w = int(width.total_seconds())

    def transform(gold: DataFrame) -> DataFrame:
        rows = gold
        if closed_before is not None:
            end = F.col(WINDOW_START) + F.make_interval(secs=F.lit(w))
            rows = rows.where(end <= F.lit(closed_before))
        joined = rows.select(*EXPORT_KEY, F.col("count").alias("total")).join(
            exported.select(*EXPORT_KEY, "exported_count"), list(EXPORT_KEY), "left"
        )
        before = F.coalesce(F.col("exported_count"), F.lit(0))
        gated = F.col("exported_count").isNull() & (F.col("total") < F.lit(min_count))
        return joined.select(
            *EXPORT_KEY,
            (F.col("total") - before).alias("count"),
            F.col("total"),
            F.col("exported_count").isNotNull().alias("correction"),
            gated.alias("_gated"),
        ).where((F.col("count") != 0) | F.col("_gated"))

    return transform
