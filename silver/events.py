"""Silver events: bronze events with event time, lineage and a team bucket.

The event's JSON comes from bronze as it landed (``raw``): silver keeps it as it is, parsing nothing,
and gold reads the properties from it.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from silver.buckets import BUCKET, BucketMapping, assign_buckets

SILVER_EVENTS_SCHEMA = StructType(
    [
        StructField("uuid", StringType()),
        StructField("event", StringType()),
        StructField("team_id", LongType()),
        StructField("distinct_id", StringType()),
        StructField("event_time", TimestampType()),
        StructField(BUCKET, IntegerType()),
        StructField("batch_id", StringType()),  # the bronze batch (pod flush) the event came in
        StructField("ingest_time", TimestampType()),
        # The event's JSON as it landed: what gold fans out (its properties and person properties).
        StructField("raw", StringType()),
    ]
)
SILVER_EVENTS_COLUMNS = [f.name for f in SILVER_EVENTS_SCHEMA.fields]


def to_silver_events(mapping: BucketMapping) -> Callable[[DataFrame], DataFrame]:
    """Bronze event rows -> silver event rows (renamed event time, bucket assigned unless the rows
    have one already)."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.withColumn("event_time", F.col("timestamp"))
            .transform(assign_buckets(mapping) if BUCKET not in df.columns else (lambda bucketed: bucketed))
            .select(*SILVER_EVENTS_COLUMNS)
        )

    return transform
