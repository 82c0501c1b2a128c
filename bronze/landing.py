"""What every bronze row carries besides its payload, and the quarantine it falls into when bad.

Landing input is one row per message: ``value`` (the bytes as they came) plus where they came
from. Parsers add a ``reason`` column (null when the message is good); :func:`valid` and
:func:`quarantined` split on it, so nothing is ever dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bronze.primitives import quarantine_row

VALUE = "value"
RAW = "raw"
REASON = "reason"
PARSED = "_v"

LANDING_FIELDS = [
    StructField("source", StringType()),  # kafka | file
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("kafka_timestamp", TimestampType()),
    StructField("source_file", StringType()),
    StructField("ingest_time", TimestampType()),
    StructField("batch_id", StringType()),
]
LANDING_COLUMNS = [f.name for f in LANDING_FIELDS]

#: Landing input handed to the parsers: the message bytes and where they came from.
LANDING_SCHEMA = StructType([StructField(VALUE, BinaryType()), *LANDING_FIELDS])

QUARANTINE_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField(RAW, BinaryType()),
        StructField(REASON, StringType()),
        StructField("expectation", StringType()),
        *LANDING_FIELDS,
    ]
)


def first_failure(checks: Sequence[tuple[Column, Column | str]]) -> Column:
    """The reason of the first check whose condition holds, else null."""
    branches = [F.when(cond, reason if isinstance(reason, Column) else F.lit(reason)) for cond, reason in checks]
    return F.coalesce(*branches) if branches else F.lit(None).cast("string")


def json_type(parsed: Column, path: str) -> Column:
    """The variant type name at ``path`` (``STRING``, ``BIGINT``, ``VOID`` for null, null if absent)."""
    return F.schema_of_variant(F.try_variant_get(parsed, path, "variant"))


def envelope_checks(max_bytes: int) -> list[tuple[Column, Column | str]]:
    """Checks every JSON message passes first: size, UTF-8, JSON, top-level object."""
    size = F.length(F.col(VALUE))
    raw = F.col(RAW)
    return [
        (F.col(VALUE).isNull(), "empty message (null value)"),
        (size > max_bytes, F.format_string(f"message of %d bytes is over the limit of {max_bytes}", size)),
        (~F.expr(f"is_valid_utf8({RAW})"), "not valid UTF-8"),
        (F.col(PARSED).isNull(), "not valid JSON"),
        (~F.ltrim(raw).startswith("{"), "not a JSON object"),
    ]


def with_parsed_json() -> Callable[[DataFrame], DataFrame]:
    """Adds ``raw`` (the value as text) and a parsed variant column used by the checks."""

    def transform(df: DataFrame) -> DataFrame:
        return df.withColumn(RAW, F.col(VALUE).cast("string")).withColumn(PARSED, F.try_parse_json(F.col(RAW)))

    return transform


def valid(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """The rows that passed every check, projected to ``columns``."""
    return df.where(F.col(REASON).isNull()).select(*columns)


def quarantined(df: DataFrame, kind: str) -> DataFrame:
    """The rows that failed a check, in the quarantine table's shape."""
    row = quarantine_row(
        F.lit(kind),
        F.col(VALUE),
        F.col(REASON),
        F.lit(None).cast("string"),
        {c: F.col(c) for c in LANDING_COLUMNS},
        LANDING_COLUMNS,
    )
    return df.where(F.col(REASON).isNotNull()).select(*(v.alias(k) for k, v in row.items()))
