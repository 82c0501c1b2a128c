"""What to send to ClickHouse: count differences per tuple and window, from gold's change feed.

ClickHouse's ``property_values`` is a SummingMergeTree, so sending the *difference* a gold commit
made (new rows: their count; updated rows: post-image minus pre-image) keeps ``sum(count)`` per
tuple and window equal to the gold count, however many times a window was updated.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from gold.property_values import TUPLE, WINDOW_START

EXPORT_COLUMNS = (*TUPLE, WINDOW_START, "count")
EXPORT_SCHEMA = StructType(
    [
        StructField("team_id", LongType()),
        StructField("property_type", StringType()),
        StructField("property_key", StringType()),
        StructField("property_value", StringType()),
        StructField(WINDOW_START, TimestampType()),
        StructField("count", LongType()),
        StructField("source_version", LongType()),
    ]
)

_SIGN = {"insert": 1, "update_postimage": 1, "update_preimage": -1, "delete": -1}


def count_deltas() -> Callable[[DataFrame], DataFrame]:
    """Gold change-feed rows -> one row per tuple, window and commit with the count it added."""

    def transform(df: DataFrame) -> DataFrame:
        sign = F.coalesce(*[F.when(F.col("_change_type") == k, F.lit(v)) for k, v in _SIGN.items()])
        return (
            df.groupBy(*TUPLE, WINDOW_START, F.col("_commit_version").alias("source_version"))
            .agg(F.sum(F.col("count") * sign).cast("long").alias("count"))
            .where(F.col("count") != 0)
            .select(*[f.name for f in EXPORT_SCHEMA.fields])
        )

    return transform
