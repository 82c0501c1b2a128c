"""PostHog-style product events as ingested, landed raw with the fields later layers need.

An event is a JSON object with ``uuid``, ``event``, ``team_id`` (integer), ``distinct_id``,
``timestamp`` (ISO-8601) and ``properties`` (an object, or a JSON string holding one). An
optional ``person_properties`` object may sit beside them; ``$set``/``$set_once`` live inside
``properties`` and ``$groupidentify`` events carry ``$group_type_index``/``$group_set`` there.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from bronze.landing import (
    LANDING_COLUMNS,
    LANDING_FIELDS,
    PARSED,
    RAW,
    REASON,
    envelope_checks,
    first_failure,
    json_type,
    with_parsed_json,
)

KIND = "events"
REQUIRED_STRINGS = ("uuid", "event", "distinct_id", "timestamp")
UUID_PATTERN = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
INTEGER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")

EVENT_FIELDS = [
    StructField("uuid", StringType()),
    StructField("event", StringType()),
    StructField("team_id", LongType()),
    StructField("distinct_id", StringType()),
    StructField("timestamp", TimestampType()),
    StructField("properties", StringType()),  # a JSON object, as text
    StructField("person_properties", StringType()),  # a JSON object, as text, or null
]
BRONZE_EVENTS_SCHEMA = StructType([*EVENT_FIELDS, StructField(RAW, StringType()), *LANDING_FIELDS])
BRONZE_EVENTS_COLUMNS = [f.name for f in BRONZE_EVENTS_SCHEMA.fields]


def _object_text(parsed: Column, field: str) -> tuple[Column, Column]:
    """(JSON text of an object field given as object or as JSON string, 'is bad' flag)."""
    as_json = F.to_json(F.try_variant_get(parsed, f"$.{field}", "variant"))
    as_string = F.try_variant_get(parsed, f"$.{field}", "string")
    inner = F.to_json(F.try_parse_json(as_string))
    text = F.when(as_json.startswith("{"), as_json).when(
        as_json.startswith('"') & inner.startswith("{"), inner
    )
    present = json_type(parsed, f"$.{field}").isNotNull() & (json_type(parsed, f"$.{field}") != "VOID")
    return text, present & text.isNull()


def parse_events(max_bytes: int) -> Callable[[DataFrame], DataFrame]:
    """Landing rows -> rows with the event fields, ``raw`` and a ``reason`` (null when valid)."""

    def transform(df: DataFrame) -> DataFrame:
        df = df.transform(with_parsed_json())
        v = F.col(PARSED)
        properties, bad_properties = _object_text(v, "properties")
        person, bad_person = _object_text(v, "person_properties")
        ts_text = F.try_variant_get(v, "$.timestamp", "string")
        checks = envelope_checks(max_bytes)
        for name in ("uuid", "event", "team_id", "distinct_id", "timestamp"):
            t = json_type(v, f"$.{name}")
            checks.append((t.isNull() | (t == "VOID"), f"missing required field {name!r}"))
        for name in REQUIRED_STRINGS:
            checks.append((json_type(v, f"$.{name}") != "STRING", f"field {name!r} is not a string"))
        checks += [
            (~json_type(v, "$.team_id").isin(*INTEGER_TYPES), "field 'team_id' is not an integer"),
            (F.length(F.try_variant_get(v, "$.uuid", "string")) == 0, "field 'uuid' is empty"),
            (~F.try_variant_get(v, "$.uuid", "string").rlike(UUID_PATTERN), "field 'uuid' is not a UUID"),
            (F.length(F.try_variant_get(v, "$.event", "string")) == 0, "field 'event' is empty"),
            (F.try_to_timestamp(ts_text).isNull(), "field 'timestamp' is not an ISO-8601 time"),
            (bad_properties, "field 'properties' is not a JSON object"),
            (bad_person, "field 'person_properties' is not a JSON object"),
        ]
        return df.select(
            F.col("value"),
            F.try_variant_get(v, "$.uuid", "string").alias("uuid"),
            F.try_variant_get(v, "$.event", "string").alias("event"),
            F.try_variant_get(v, "$.team_id", "bigint").alias("team_id"),
            F.try_variant_get(v, "$.distinct_id", "string").alias("distinct_id"),
            F.try_to_timestamp(ts_text).alias("timestamp"),
            F.coalesce(properties, F.lit("{}")).alias("properties"),
            person.alias("person_properties"),
            F.col(RAW),
            *LANDING_COLUMNS,
            first_failure(checks).alias(REASON),
        )

    return transform
