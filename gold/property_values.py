"""Property values: events fanned out into ``(team, property_type, key, value)`` tuples, counted
per event-time window in two stages.

Stage 1 (map) turns each batch of silver events into partial counts per tuple and window; stage 2
(merge) sums partials per tuple and window and adds them to the gold table. The fan-out runs on
Spark's VARIANT functions, not a Python UDF.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

TUPLE = ("team_id", "property_type", "property_key", "property_value")
WINDOW_START = "window_start"
SKIP_REASON = "skip_reason"
GROUP_TYPES = 5  # $group_type_index 0..4
PROPERTY_TYPES = ("event", "person", *(f"group_{i}" for i in range(GROUP_TYPES)))

#: A tuple in a window, with the team's bucket (the partition column) after the team.
KEY_FIELDS = [
    StructField("team_id", LongType()),
    StructField("bucket", IntegerType()),
    StructField("property_type", StringType()),
    StructField("property_key", StringType()),
    StructField("property_value", StringType()),
    StructField(WINDOW_START, TimestampType()),
]
COUNT_FIELDS = [
    StructField("count", LongType()),
    StructField("max_event_time", TimestampType()),  # newest event counted: drives the watermark
]
PARTIALS_SCHEMA = StructType(
    [*KEY_FIELDS, *COUNT_FIELDS, StructField("batch_id", StringType()), StructField("created_at", TimestampType())]
)
PROPERTY_VALUES_SCHEMA = StructType(
    [*KEY_FIELDS, *COUNT_FIELDS, StructField("first_seen", TimestampType()), StructField("last_seen", TimestampType())]
)
#: Columns that identify one gold row: a tuple in a window, in the bucket that counted it. A team
#: keeps its bucket until the mapping moves it; after a move, a window it straddles has one row in
#: each bucket, and the export sums them. Keying gold by bucket keeps each bucket's MERGE inside its
#: own partition, so per-bucket tasks never touch (or conflict over) each other's rows.
GOLD_KEY = (*TUPLE, "bucket", WINDOW_START)


@dataclass(frozen=True)
class FanoutRules:
    """What the fan-out skips: over-long keys and values, and excluded keys."""

    max_key_length: int = 400
    max_value_length: int = 255
    excluded_keys: Sequence[str] = ()


def _as_map(obj: Column) -> Column:
    """A JSON object held in a VARIANT as a map of its entries (null when it is not an object)."""
    return F.try_variant_get(obj, "$", "map<string,variant>")


def fan_out(rules: FanoutRules) -> Callable[[DataFrame], DataFrame]:
    """Silver events -> one row per property entry, with ``property_value`` as text and a
    ``skip_reason`` (null for a tuple that counts)."""

    def transform(df: DataFrame) -> DataFrame:
        # Two plain generators, no lambdas: each event's documents (properties, $set, $set_once,
        # person properties, $group_set) as (property type, map) rows, then each map's entries.
        # Spark compiles explode and inline; higher-order functions over the entries would be
        # interpreted row by row, at over twice the cost.
        docs = df.select(
            "team_id",
            "bucket",
            "event_time",
            "batch_id",
            "event",
            F.try_parse_json(F.col("properties")).alias("_props"),
            F.try_parse_json(F.col("person_properties")).alias("_person"),
        )
        props = F.col("_props")
        group_index = F.try_variant_get(props, "$['$group_type_index']", "int")
        is_group = (F.col("event") == "$groupidentify") & group_index.between(0, GROUP_TYPES - 1)

        def doc(property_type: Column | str, obj: Column) -> Column:
            kind = property_type if isinstance(property_type, Column) else F.lit(property_type)
            return F.struct(kind.alias("property_type"), _as_map(obj).alias("entries"))

        per_doc = docs.select(
            "team_id",
            "bucket",
            "event_time",
            "batch_id",
            F.inline(
                F.array(
                    doc("event", props),
                    doc("person", F.try_variant_get(props, "$['$set']", "variant")),
                    doc("person", F.try_variant_get(props, "$['$set_once']", "variant")),
                    doc("person", F.col("_person")),
                    doc(
                        F.concat(F.lit("group_"), group_index.cast("string")),
                        F.when(is_group, F.try_variant_get(props, "$['$group_set']", "variant")),
                    ),
                )
            ),
        )
        exploded = per_doc.select(
            "team_id",
            "bucket",
            "event_time",
            "batch_id",
            "property_type",
            F.explode("entries").alias("property_key", "_value"),
        ).withColumn("_json", F.to_json(F.col("_value")))
        first = F.substring(F.col("_json"), 1, 1)
        value = (
            F.when(first == '"', F.try_variant_get(F.col("_value"), "$", "string"))
            .when(first.isin("{", "[", "n"), F.lit(None))
            .otherwise(F.col("_json"))  # numbers and booleans: their JSON text
        )
        key = F.col("property_key")
        reason = F.coalesce(
            F.when(key.isNull() | (key == ""), F.lit("empty_key")),
            F.when(first == "n", F.lit("null_value")),
            F.when(first.isin("{", "["), F.lit("nested_value")),
            F.when(value == "", F.lit("empty_value")),
            F.when(F.length(key) > rules.max_key_length, F.lit("key_too_long")),
            F.when(F.length(value) > rules.max_value_length, F.lit("value_too_long")),
            F.when(key.isin(*rules.excluded_keys), F.lit("excluded_key")) if rules.excluded_keys else F.lit(None),
        )
        return exploded.withColumn("property_value", value).withColumn(SKIP_REASON, reason).drop("_json", "_value")

    return transform


def window_start(event_time: Column, width: timedelta) -> Column:
    """Start of the tumbling event-time window of ``width`` holding ``event_time``."""
    w = int(width.total_seconds() * 1_000_000)
    t = F.unix_micros(event_time)
    return F.timestamp_micros(t - F.pmod(t, F.lit(w)))


def partials(width: timedelta, created_at: Column | None = None) -> Callable[[DataFrame], DataFrame]:
    """Counted tuples (fan-out rows without a skip reason) -> partial counts per tuple, window
    and source batch (stage 1)."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.where(F.col(SKIP_REASON).isNull())
            .withColumn(WINDOW_START, window_start(F.col("event_time"), width))
            .groupBy(*TUPLE, "bucket", WINDOW_START, "batch_id")
            .agg(F.count(F.lit(1)).alias("count"), F.max("event_time").alias("max_event_time"))
            .withColumn("created_at", created_at if created_at is not None else F.current_timestamp())
            .select(*[f.name for f in PARTIALS_SCHEMA.fields])
        )

    return transform


def merge_source() -> Callable[[DataFrame], DataFrame]:
    """Partials -> one row per tuple and window (stage 2's MERGE source, so MERGE never sees two
    source rows for one target row)."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.groupBy(*TUPLE, "bucket", WINDOW_START)
            .agg(
                F.sum("count").cast("long").alias("count"),
                F.max("max_event_time").alias("max_event_time"),
                F.min("created_at").alias("first_seen"),
                F.max("created_at").alias("last_seen"),
            )
            .select(*[f.name for f in PROPERTY_VALUES_SCHEMA.fields])
        )

    return transform


def merge_on(buckets: Sequence[int] | None = None) -> str:
    """The MERGE condition of stage 2, for a run over ``buckets`` (None: every bucket).

    Naming the buckets as literals on the target side scopes the MERGE to their partitions: the
    engines read only those partitions, and Delta's conflict detection then lets MERGEs over
    disjoint buckets commit side by side instead of failing each other with concurrent appends.
    """
    on = " AND ".join(f"t.{c} = s.{c}" for c in GOLD_KEY)
    if buckets:
        on += " AND t.bucket IN (" + ", ".join(str(int(b)) for b in sorted(set(buckets))) + ")"
    return on


#: MERGE of stage 2: add counts, keep when the tuple was first and last seen.
MERGE_UPDATE = {
    "count": "t.count + s.count",
    "max_event_time": "greatest(t.max_event_time, s.max_event_time)",
    "first_seen": "least(t.first_seen, s.first_seen)",
    "last_seen": "greatest(t.last_seen, s.last_seen)",
}


def skip_counts(df: DataFrame) -> DataFrame:
    """Fan-out rows -> count per skip reason (``counted`` for tuples that count)."""
    return df.groupBy(F.coalesce(F.col(SKIP_REASON), F.lit("counted")).alias("reason")).count()
