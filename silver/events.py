"""Silver events: bronze events with event time, lineage and a team bucket."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from silver.buckets import BUCKET, BucketMapping, assign_buckets
from silver.properties import DOCUMENT, DOCUMENT_COLUMNS, JAVASCRIPT, parse_documents

SILVER_EVENTS_SCHEMA = StructType(
    [
        StructField("uuid", StringType()),
        StructField("event", StringType()),
        StructField("team_id", LongType()),
        StructField("distinct_id", StringType()),
        StructField("event_time", TimestampType()),
        StructField("properties", StringType()),
        StructField("person_properties", StringType()),
        StructField(BUCKET, IntegerType()),
        StructField("batch_id", StringType()),  # the bronze batch (pod flush) the event came in
        StructField("ingest_time", TimestampType()),
        # properties and person_properties parsed once (silver.properties): what gold fans out.
        *(StructField(c, DOCUMENT) for c in DOCUMENT_COLUMNS),
    ]
)
SILVER_EVENTS_COLUMNS = [f.name for f in SILVER_EVENTS_SCHEMA.fields]


def to_silver_events(mapping: BucketMapping, notation: str = JAVASCRIPT) -> Callable[[DataFrame], DataFrame]:
    """Bronze event rows -> silver event rows (renamed event time, bucket assigned unless the rows
    have one already, property documents parsed, their numbers in ``notation``)."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.withColumn("event_time", F.col("timestamp"))
            .transform(assign_buckets(mapping) if BUCKET not in df.columns else (lambda bucketed: bucketed))
            .transform(parse_documents(notation=notation))
            .select(*SILVER_EVENTS_COLUMNS)
        )

    return transform
