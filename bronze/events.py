"""PostHog-style product events as ingested, landed raw with the fields later layers need.

An event is a JSON object with ``uuid``, ``event``, ``team_id`` (integer), ``distinct_id``,
``timestamp`` (ISO-8601) and ``properties`` (an object, or a JSON string holding one). An
optional ``person_properties`` object may sit beside them; ``$set``/``$set_once`` live inside
``properties`` and ``$groupidentify`` events carry ``$group_type_index``/``$group_set`` there.

The message is parsed here for the fields every layer keys by and for bronze's checks; the message
itself is kept as it came (``raw``), and gold reads the properties from it (:mod:`gold.property_values`),
so bronze builds nothing per property.
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
from bronze.primitives import INTEGER_TYPES

KIND = "events"
REQUIRED_STRINGS = ("uuid", "event", "distinct_id", "timestamp")
UUID_PATTERN = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"

EVENT_FIELDS = [
    StructField("uuid", StringType()),
    StructField("event", StringType()),
    StructField("team_id", LongType()),
    StructField("distinct_id", StringType()),
    StructField("timestamp", TimestampType()),
]
BRONZE_EVENTS_SCHEMA = StructType([*EVENT_FIELDS, StructField(RAW, StringType()), *LANDING_FIELDS])
BRONZE_EVENTS_COLUMNS = [f.name for f in BRONZE_EVENTS_SCHEMA.fields]

#: The fields that must hold a JSON object (or a JSON string holding one) where they are present.
_OBJECT_FIELDS = ("properties", "person_properties")


def _objects() -> list[Column]:
    """Per object field, whether it holds an object, given as one or as a JSON string holding one
    (``_<field>_object``; null where it is absent or null).

    Whether the field is an object is asked by its cast to a map (the walk of ``schema_of_variant``
    costs more on an object, and ``to_json`` renders it all); a string is parsed once more, as the
    JSON it holds."""
    cols = []
    for name in _OBJECT_FIELDS:
        field = F.col(f"_{name}")
        is_object = F.try_variant_get(field, "$", "map<string,variant>").isNotNull()
        is_string = F.schema_of_variant(field) == "STRING"
        inner = F.try_parse_json(F.try_variant_get(field, "$", "string"))
        held = F.when(is_object, F.lit(True)).when(
            is_string & F.try_variant_get(inner, "$", "map<string,variant>").isNotNull(), F.lit(True)
        )
        cols.append(held.alias(f"_{name}_object"))
    return cols


def _staged(v: Column) -> list[Column]:
    """Every value the checks and the output need, each computed once.

    Spark keeps a projection apart when inlining it would repeat a non-trivial expression, so
    staging here stops the variant lookups from being evaluated once per check.
    """
    cols = [
        json_type(v, f"$.{name}").alias(f"_t_{name}")
        for name in ("uuid", "event", "team_id", "distinct_id", "timestamp")
    ]
    cols += [F.try_variant_get(v, f"$.{name}", "string").alias(f"_s_{name}") for name in REQUIRED_STRINGS]
    cols.append(F.try_variant_get(v, "$.team_id", "bigint").alias("_team_id"))
    for field in ("properties", "person_properties"):
        cols.append(F.try_variant_get(v, f"$.{field}", "variant").alias(f"_{field}"))
    return cols


def duplicate_keys(value: Column) -> Column:
    """Whether an event's JSON text repeats a key at its top level or at the top level of its
    ``properties`` or ``person_properties``. Parsing keeps the last occurrence, as JSON parsers
    (PostHog's included) do, so such an event lands; this only lets it be counted."""

    def repeats(text: Column) -> Column:
        keys = F.json_object_keys(text)
        return F.coalesce(F.size(keys) != F.size(F.array_distinct(keys)), F.lit(False))

    return (
        repeats(value)
        | repeats(F.get_json_object(value, "$.properties"))
        | repeats(F.get_json_object(value, "$.person_properties"))
    )


def parse_events(max_bytes: int) -> Callable[[DataFrame], DataFrame]:
    """Landing rows -> rows with the event fields, ``raw`` and a ``reason`` (null when valid)."""

    def transform(df: DataFrame) -> DataFrame:
        df = df.transform(with_parsed_json())
        staged = df.select("*", *_staged(F.col(PARSED)))
        staged = staged.select("*", *_objects())
        timestamp = F.try_to_timestamp(F.col("_s_timestamp"))
        checks = envelope_checks(max_bytes)
        for name in ("uuid", "event", "team_id", "distinct_id", "timestamp"):
            t = F.col(f"_t_{name}")
            checks.append((t.isNull() | (t == "VOID"), f"missing required field {name!r}"))
        for name in REQUIRED_STRINGS:
            checks.append((F.col(f"_t_{name}") != "STRING", f"field {name!r} is not a string"))
        uuid = F.col("_s_uuid")
        checks += [
            (~F.col("_t_team_id").isin(*INTEGER_TYPES), "field 'team_id' is not an integer"),
            (F.length(uuid) == 0, "field 'uuid' is empty"),
            (~uuid.rlike(UUID_PATTERN), "field 'uuid' is not a UUID"),
            (F.length(F.col("_s_event")) == 0, "field 'event' is empty"),
            (timestamp.isNull(), "field 'timestamp' is not an ISO-8601 time"),
        ]
        for name in _OBJECT_FIELDS:
            # Present (not absent, not null) and not an object, nor a string holding one.
            field = F.col(f"_{name}")
            present = field.isNotNull() & ~F.is_variant_null(field)
            checks.append((present & F.col(f"_{name}_object").isNull(), f"field {name!r} is not a JSON object"))
        return staged.select(
            F.col("value"),
            uuid.alias("uuid"),
            F.col("_s_event").alias("event"),
            F.col("_team_id").alias("team_id"),
            F.col("_s_distinct_id").alias("distinct_id"),
            timestamp.alias("timestamp"),
            F.col(RAW),
            *LANDING_COLUMNS,
            first_failure(checks).alias(REASON),
        )

    return transform
