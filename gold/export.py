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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType, TimestampType

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


def latest_changes(width: timedelta, through: datetime | None) -> Callable[[DataFrame], DataFrame]:
    """Change-feed rows of gold -> the newest image of each changed tuple and window whose window
    ends by ``through`` (every window with None): the rows a late count changed."""

    def transform(changes: DataFrame) -> DataFrame:
        images = changes.where(F.col("_change_type").isin("insert", "update_postimage")).where(
            window_closed(width, None, through)
        )
        newest = Window.partitionBy(*EXPORT_KEY).orderBy(F.col("_commit_version").desc())
        return (
            images.withColumn("_n", F.row_number().over(newest))
            .where("_n = 1")
            .select(*EXPORT_KEY, "count", "max_event_time")
        )

    return transform


def differences(exported: DataFrame, min_count: int) -> Callable[[DataFrame], DataFrame]:
    """Gold rows of closed windows -> rows to send: the count not exported yet, minus gated ones;
    with a ``_gated`` flag kept for metrics."""

    def transform(rows: DataFrame) -> DataFrame:
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


def export_batch(
    exported: DataFrame, width: timedelta, closed_before: datetime | None, min_count: int
) -> Callable[[DataFrame], DataFrame]:
    """All of gold -> rows to send: closed windows (all with ``closed_before`` None) whose count
    differs from what was exported (the first export, and the reference the incremental one
    must equal)."""

    def transform(gold: DataFrame) -> DataFrame:
        return gold.where(window_closed(width, None, closed_before)).transform(differences(exported, min_count))

    return transform
