"""Page-change reordering and dedup per ``(wiki_id, page_id)`` in event-time windows.

Windows:
- ``tumbling``: aligned to multiples of the width W.
- ``staggered``: a key's window opens at the event time of its first event not covered by an open
  window, and covers ``[open, open + W)``. Computed natively: per key, the sorted event times are
  folded with ``aggregate`` into the list of window openings.

Merge rules, applied to the events of one window of one key:
1. per ``rev_id`` keep only the event with the greatest event time; on a tie a delete wins;
2. order the survivors by ``(rev_id, event_time)``;
3. no delete among them: emit the last survivor only;
4. otherwise let ``d`` be the last delete: emit ``d``, then the last survivor if it comes after ``d``.

``merged_count`` says how many input events an emitted row stands for; the emitted rows of a window
sum to the window's events.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

KEY = ("wiki_id", "page_id")
WINDOW_START = "window_start"
WINDOW_END = "window_end"
DELETE = "delete"

SILVER_PAGE_CHANGES_SCHEMA = StructType(
    [
        StructField("wiki_id", StringType()),
        StructField("page_id", LongType()),
        StructField("rev_id", LongType()),
        StructField("event_time", TimestampType()),
        StructField("page_change_kind", StringType()),
        StructField("action", StringType()),  # delete | update
        StructField(WINDOW_START, TimestampType()),
        StructField(WINDOW_END, TimestampType()),
        StructField("merged_count", IntegerType()),
        StructField("meta_id", StringType()),
        StructField("raw", StringType()),
    ]
)
SILVER_PAGE_CHANGES_COLUMNS = [f.name for f in SILVER_PAGE_CHANGES_SCHEMA.fields]


def action_of(kind: Column) -> Column:
    """``delete`` for a delete, ``update`` for every other change kind."""
    return F.when(kind == DELETE, F.lit(DELETE)).otherwise(F.lit("update"))


def _micros(width: timedelta) -> int:
    return int(width.total_seconds() * 1_000_000)


def assign_windows(mode: str, width: timedelta) -> Callable[[DataFrame], DataFrame]:
    """Adds ``window_start``/``window_end`` per event, tumbling or staggered per key."""
    w = _micros(width)
    if w <= 0:
        raise ValueError("window width must be positive")

    def tumbling(df: DataFrame) -> DataFrame:
        t = F.unix_micros(F.col("event_time"))
        start = t - F.pmod(t, F.lit(w))
        return df.withColumn(WINDOW_START, F.timestamp_micros(start)).withColumn(
            WINDOW_END, F.timestamp_micros(start + F.lit(w))
        )

    def staggered(df: DataFrame) -> DataFrame:
        times = df.groupBy(*KEY).agg(F.array_sort(F.collect_set(F.unix_micros("event_time"))).alias("_ts"))
        opens = times.select(
            *KEY,
            F.aggregate(
                "_ts",
                F.array().cast("array<bigint>"),
                lambda acc, t: F.when(
                    (F.size(acc) == 0) | (t >= F.element_at(acc, -1) + F.lit(w)), F.array_append(acc, t)
                ).otherwise(acc),
            ).alias("_opens"),
        ).select(*KEY, F.explode("_opens").alias("_open"))
        # Each event belongs to the latest opening at or before it (always within W of it).
        joined = df.join(opens, list(KEY)).where(
            (F.unix_micros("event_time") >= F.col("_open"))
            & (F.unix_micros("event_time") < F.col("_open") + w)
        )
        return (
            joined.withColumn(WINDOW_START, F.timestamp_micros("_open"))
            .withColumn(WINDOW_END, F.timestamp_micros(F.col("_open") + F.lit(w)))
            .drop("_open")
        )

    if mode == "tumbling":
        return tumbling
    if mode == "staggered":
        return staggered
    raise ValueError(f"unknown window mode {mode!r}: use staggered or tumbling")


def apply_merge_rules() -> Callable[[DataFrame], DataFrame]:
    """Events with windows assigned -> the rows the merge rules emit, with ``merged_count``."""

    def transform(df: DataFrame) -> DataFrame:
        group = [*KEY, WINDOW_START]
        is_delete = (F.col("page_change_kind") == DELETE).cast("int")
        per_rev = Window.partitionBy(*group, "rev_id")
        ranked = (
            df.withColumn("_is_delete", is_delete)
            .withColumn(
                "_rank",
                F.row_number().over(per_rev.orderBy(F.col("event_time").desc(), F.col("_is_delete").desc())),
            )
            .withColumn("_rev_events", F.count(F.lit(1)).over(per_rev))
        )
        survivors = ranked.where(F.col("_rank") == 1)
        pos = F.struct(F.col("rev_id"), F.col("event_time"))
        in_window = Window.partitionBy(*group)
        marked = (
            survivors.withColumn("_pos", pos)
            .withColumn("_last", F.max("_pos").over(in_window))
            .withColumn(
                "_last_delete", F.max(F.when(F.col("_is_delete") == 1, F.col("_pos"))).over(in_window)
            )
            .withColumn("_total", F.sum("_rev_events").over(in_window))
            .withColumn(
                "_upto_delete",
                F.sum(F.when(F.col("_pos") <= F.col("_last_delete"), F.col("_rev_events")).otherwise(0)).over(
                    in_window
                ),
            )
        )
        no_delete = F.col("_last_delete").isNull()
        is_last = F.col("_pos") == F.col("_last")
        is_d = F.col("_pos") == F.col("_last_delete")
        merged = (
            F.when(no_delete, F.col("_total"))
            .when(is_d, F.col("_upto_delete"))
            .otherwise(F.col("_total") - F.col("_upto_delete"))
        )
        emitted = marked.where(
            (no_delete & is_last) | is_d | (~no_delete & is_last & (F.col("_pos") > F.col("_last_delete")))
        )
        return (
            emitted.withColumn("action", action_of(F.col("page_change_kind")))
            .withColumn("merged_count", merged.cast("int"))
            .select(*SILVER_PAGE_CHANGES_COLUMNS)
        )

    return transform


def dedup_page_changes(mode: str, width: timedelta) -> Callable[[DataFrame], DataFrame]:
    """Bronze page-change rows -> deduplicated, ordered rows per key and window."""

    def transform(df: DataFrame) -> DataFrame:
        return df.transform(assign_windows(mode, width)).transform(apply_merge_rules())

    return transform
