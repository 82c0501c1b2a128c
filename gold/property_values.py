"""Property values: events fanned out into ``(team, property_type, key, value)`` tuples, counted
per event-time window in two stages.

Stage 1 (map) turns each batch of silver events into partial counts per tuple and window; stage 2
(merge) sums partials per tuple and window and adds them to the gold table. The fan-out explodes
the property documents bronze parsed once (``bronze.properties``); it runs no Python UDF.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from bronze.primitives import window_start
from bronze.properties import (
    DOCUMENT,
    GROUP_SET_PROPS,
    INTEGER,
    NESTED_KINDS,
    NULL,
    PERSON_PROPS,
    PROPS,
    SET_ONCE_PROPS,
    SET_PROPS,
)

TUPLE = ("team_id", "property_type", "property_key", "property_value")
WINDOW_START = "window_start"
SKIP_REASON = "skip_reason"
GROUP_TYPES = 256  # $group_type_index is a u8 in PostHog: 0..255
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
    """What the fan-out skips: over-long keys and values, and excluded keys; and whether objects
    and arrays are skipped (``nested_values="skip"``) or counted as their JSON text (``"json"``)."""

    max_key_length: int = 400
    max_value_length: int = 255
    excluded_keys: Sequence[str] = ()
    nested_values: str = "skip"


@dataclass(frozen=True)
class TeamFilter:
    """Which teams gold counts: those in ``allow`` (every team when empty), less those in
    ``block``, and of those the ``rollout_percent`` whose stable hash falls under it."""

    allow: Sequence[int] = ()
    block: Sequence[int] = ()
    rollout_percent: int = 100

    @property
    def everyone(self) -> bool:
        return not self.allow and not self.block and self.rollout_percent >= 100

    def admits(self, team_id: Column) -> Column:
        """True for a team that is counted. The rollout hash is Spark's xxhash64 of the team id
        (seed 42, the same on every engine and version), modulo 100: a team is in or out the same
        way every time, and raising the percent only adds teams."""
        ok = F.lit(True)
        if self.allow:
            ok = ok & team_id.isin(*[int(t) for t in self.allow])
        if self.block:
            ok = ok & ~team_id.isin(*[int(t) for t in self.block])
        if self.rollout_percent < 100:
            ok = ok & (F.pmod(F.xxhash64(team_id.cast("long")), F.lit(100)) < F.lit(int(self.rollout_percent)))
        return ok

    def counted(self, rows: DataFrame) -> DataFrame:
        """The ``rows`` (with a ``team_id``) of the teams gold counts."""
        return rows if self.everyone else rows.where(self.admits(F.col("team_id")))

    def left_out(self, rows: DataFrame) -> DataFrame:
        """The ``rows`` of the teams gold does not count."""
        return rows.limit(0) if self.everyone else rows.where(~self.admits(F.col("team_id")))


def _without(entries: Column, *others: Column) -> Column:
    """``entries`` less the keys any of ``others`` holds."""
    return F.map_filter(entries, lambda k, _: ~F.exists(F.array(*others), lambda m: F.map_contains_key(m, k)))


def person_entries(set_: Column, set_once: Column, person: Column) -> Column:
    """One person observation per key: ``person_properties`` (the state after the event) wins,
    then ``$set``, then ``$set_once``. Each argument is a parsed document, or null."""
    empty = F.create_map().cast(DOCUMENT)
    person, set_, set_once = (F.coalesce(m, empty) for m in (person, set_, set_once))
    return F.map_concat(person, _without(set_, person), _without(set_once, person, set_))


def group_type(props: Column) -> Column:
    """``group_<i>`` for an integer ``$group_type_index`` i in 0..255, else null."""
    index = props["$group_type_index"]
    i = F.when(index["kind"] == INTEGER, index["text"].try_cast("bigint"))
    return F.when(i.between(0, GROUP_TYPES - 1), F.concat(F.lit("group_"), i.cast("string")))


def _doc(property_type: Column | str, entries: Column) -> Column:
    kind = property_type if isinstance(property_type, Column) else F.lit(property_type)
    return F.struct(kind.alias("property_type"), entries.alias("entries"))


def property_entries(df: DataFrame) -> DataFrame:
    """Silver events -> one row per property entry (``property_type``, ``property_key``, ``_entry``):
    the event's own properties, the person's and, for a ``$groupidentify``, the group's."""
    per_doc = df.select(
        "team_id",
        "bucket",
        "event_time",
        "batch_id",
        F.inline(
            F.array(
                _doc("event", F.col(PROPS)),
                _doc("person", person_entries(F.col(SET_PROPS), F.col(SET_ONCE_PROPS), F.col(PERSON_PROPS))),
                # A $groupidentify without an integer index in 0..255 keeps its entries under
                # no type, so they are counted as skipped (bad_group_index), never lost.
                _doc(group_type(F.col(PROPS)), F.when(F.col("event") == "$groupidentify", F.col(GROUP_SET_PROPS))),
            )
        ),
    )
    return per_doc.select(
        "team_id",
        "bucket",
        "event_time",
        "batch_id",
        "property_type",
        F.explode("entries").alias("property_key", "_entry"),
    )


def fan_out(rules: FanoutRules) -> Callable[[DataFrame], DataFrame]:
    """Silver events -> one row per property entry, with ``property_value`` as text and a
    ``skip_reason`` (null for a tuple that counts).

    Reads the documents bronze parsed (``bronze.properties``): each entry's text is already
    canonical, so this is explodes and comparisons only.
    """

    def transform(df: DataFrame) -> DataFrame:
        exploded = property_entries(df)
        kind, text = F.col("_entry.kind"), F.col("_entry.text")
        nested = kind.isin(*NESTED_KINDS)
        value = F.when(nested, text if rules.nested_values == "json" else F.lit(None)).otherwise(text)
        key = F.col("property_key")
        reason = F.coalesce(
            F.when(F.col("property_type").isNull(), F.lit("bad_group_index")),
            F.when(key.isNull() | (key == ""), F.lit("empty_key")),
            F.when(kind == NULL, F.lit("null_value")),
            F.when(nested, F.lit("nested_value")) if rules.nested_values == "skip" else F.lit(None),
            F.when(value == "", F.lit("empty_value")),
            F.when(F.length(key) > rules.max_key_length, F.lit("key_too_long")),
            F.when(F.length(value) > rules.max_value_length, F.lit("value_too_long")),
            F.when(key.isin(*rules.excluded_keys), F.lit("excluded_key")) if rules.excluded_keys else F.lit(None),
        )
        return exploded.select(
            "team_id",
            "bucket",
            "event_time",
            "batch_id",
            "property_type",
            "property_key",
            value.alias("property_value"),
            reason.alias(SKIP_REASON),
        )

    return transform


def tuple_counts(width: timedelta) -> Callable[[DataFrame], DataFrame]:
    """Fan-out rows -> their count and newest event time per tuple, window, source batch and skip
    reason: stage 1's partials (the rows without a reason) and its skip figures in one
    aggregation."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.withColumn(WINDOW_START, window_start(F.col("event_time"), width))
            .groupBy(*TUPLE, "bucket", WINDOW_START, "batch_id", SKIP_REASON)
            .agg(F.count(F.lit(1)).alias("count"), F.max("event_time").alias("max_event_time"))
        )

    return transform


def counted_partials(created_at: Column | None = None) -> Callable[[DataFrame], DataFrame]:
    """``tuple_counts`` rows -> the partials of the tuples that count (stage 1's output)."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.where(F.col(SKIP_REASON).isNull())
            .withColumn("created_at", created_at if created_at is not None else F.current_timestamp())
            .select(*[f.name for f in PARTIALS_SCHEMA.fields])
        )

    return transform


def partials(width: timedelta, created_at: Column | None = None) -> Callable[[DataFrame], DataFrame]:
    """Fan-out rows -> partial counts per tuple, window and source batch of the tuples that count
    (stage 1)."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.where(F.col(SKIP_REASON).isNull()).transform(tuple_counts(width)).transform(counted_partials(created_at))
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


#: Why the fan-out skips a tuple (:func:`fan_out`'s ``skip_reason``).
SKIP_REASONS = (
    "bad_group_index",
    "empty_key",
    "null_value",
    "nested_value",
    "empty_value",
    "key_too_long",
    "value_too_long",
    "excluded_key",
)
COUNTED = "counted"


def skip_figures() -> dict[str, Column]:
    """Over ``tuple_counts`` rows: the tuples that count (``counted``) and those skipped per reason,
    as aggregates (one figure each, for ``DataFrame.observe`` on the pass that writes them)."""
    reason, count = F.col(SKIP_REASON), F.col("count")
    figures = {COUNTED: F.coalesce(F.sum(F.when(reason.isNull(), count)), F.lit(0))}
    figures.update({r: F.coalesce(F.sum(F.when(reason == r, count)), F.lit(0)) for r in SKIP_REASONS})
    return figures


def skip_counts(df: DataFrame) -> DataFrame:
    """``tuple_counts`` rows -> tuples per skip reason (``counted`` for tuples that count)."""
    reason = F.coalesce(F.col(SKIP_REASON), F.lit("counted")).alias("reason")
    return df.groupBy(reason).agg(F.sum("count").cast("long").alias("count"))
