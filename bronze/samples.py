"""Prometheus / VictoriaMetrics remote-write samples, landed one row per sample.

A series is identified by its sorted label set; ``series_id`` is a stable 64-bit hash of it, so
later layers can group by one integer instead of a map.
"""

from __future__ import annotations

from pyspark.sql.types import (
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

BRONZE_SAMPLES_SCHEMA = StructType(
    [
        StructField("metric_name", StringType()),
        StructField("labels", MapType(StringType(), StringType())),  # every label, __name__ included
        StructField("series_id", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("value", DoubleType()),
        StructField("ingest_time", TimestampType()),
        StructField("source", StringType()),  # prometheus | victoriametrics
        StructField("batch_id", StringType()),
    ]
)
