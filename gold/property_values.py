"""Property values: events fanned out into ``(team, property_type, key, value)`` tuples, counted
per event-time window in two stages.

Stage 1 (map) turns each batch of silver events into partial counts per tuple and window; stage 2
(merge) sums partials per tuple and window and adds them to the gold table. The fan-out parses each
event's JSON once, as a VARIANT, explodes its documents and writes each value in its canonical text
(:mod:`bronze.properties`); it runs no Python UDF and no higher-order function per entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from bronze.primitives import INTEGER_TYPES, window_start
from bronze.properties import JAVASCRIPT, SERDE_JSON, negative_zero, value_text

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


#: The documents of an event the fan-out reads, in the order their entries are taken: the event's
#: properties; the person's (``person_properties``, then ``$set``, then ``$set_once``, each key once,
#: the first to hold it winning); the group's (``$group_set`` of a ``$groupidentify``).
EVENT_DOC, PERSON_DOC, SET_DOC, SET_ONCE_DOC, GROUP_DOC = range(5)
#: The columns of a silver event the fan-out carries to each of its entries.
CARRIED = ("team_id", "bucket", "event_time", "batch_id")
#: An entry's value, as a VARIANT (the event's own parse, never rendered and read again), and its
#: JSON text as Spark writes a variant (a string quoted, an object's keys sorted).
VALUE, JSON = "_value", "_json"
_EMPTY = "map<string,variant>"


def _held(name: str, parsed: Column | str = "_v") -> Column:
    """The object a JSON string in an event's ``name`` field holds, as a map of its values (bronze
    lands such an event as it lands one with the object itself), else null."""
    return F.try_variant_get(F.try_parse_json(F.try_variant_get(parsed, f"$.{name}", "string")), "$", _EMPTY)


def event_properties(raw: Column) -> Column:
    """An event's properties as a map of their values (VARIANTs), from its JSON text: the object it
    holds, or the object a JSON string in it holds; null where it has none."""
    parsed = F.parse_json(raw)
    direct = F.try_variant_get(parsed, "$.properties", _EMPTY)
    return F.when(direct.isNull(), _held("properties", parsed)).otherwise(direct)


def property_text(props: Column, key: str, notation: str = JAVASCRIPT, raw: Column | None = None) -> Column:
    """The canonical text of the property ``key`` of ``props`` (:func:`event_properties`): a nested
    value as its compact JSON, a JSON null as null; ``raw``, the event's JSON text, gives a zero its
    sign in serde_json's notation."""
    value = props[key]
    return canonical_text(value, F.schema_of_variant(value), notation, F.lit(key), raw)


def canonical_text(
    value: Column, kind: Column, notation: str, key: Column | None = None, source: Column | None = None
) -> Column:
    """A VARIANT ``value`` of type ``kind`` (its ``schema_of_variant``) -> its canonical text, null
    for a JSON null. Most values are written from the value itself by its type, in generated code:
    a string as it is, an integer's digits (JavaScript's notation), ``true`` / ``false``; the rest
    (any other number, a nested value) from its JSON text by :func:`bronze.properties.value_text`.
    Rendering every value as JSON first cost a quarter of stage 1 (Spark makes a JSON generator per
    string). ``source``, the JSON text the value of ``key`` was parsed from, gives a zero its sign
    in serde_json's notation."""
    fast = F.when(kind == "STRING", F.variant_get(value, "$", "string"))
    fast = fast.when(kind == "BOOLEAN", F.variant_get(value, "$", "boolean").cast("string"))
    if notation != SERDE_JSON:  # serde_json writes some integers otherwise (past 64 bits, -0)
        fast = fast.when(kind.isin(*INTEGER_TYPES), F.variant_get(value, "$", "bigint").cast("string"))
    json = F.to_json(value)
    text = F.when(kind != "VOID", F.coalesce(fast, value_text(json, value, notation)))
    if notation == SERDE_JSON and key is not None and source is not None:
        text = F.when(negative_zero(key, json, source), F.lit("-0.0")).otherwise(text)
    return text


def group_type(props: Column) -> Column:
    """``group_<i>`` for an integer ``$group_type_index`` i in 0..255 (a u8, as PostHog holds it;
    ``2.0``, ``"2"`` and 256 are none), else null."""
    index = props["$group_type_index"]
    i = F.when(F.schema_of_variant(index).isin(*INTEGER_TYPES), F.try_variant_get(index, "$", "bigint"))
    return F.when(i.between(0, GROUP_TYPES - 1), F.concat(F.lit("group_"), i.cast("string")))


def _doc(property_type: Column | str, entries: Column, doc: int, source: Column) -> Column:
    kind = property_type if isinstance(property_type, Column) else F.lit(property_type)
    return F.struct(
        kind.alias("property_type"), entries.alias("entries"), F.lit(doc).alias("_doc"), source.alias("_source")
    )


def _objects(df: DataFrame, sources: bool) -> DataFrame:
    """Silver events -> ``CARRIED``, ``event`` and the event's properties and person properties as
    maps of their values (``_props``, empty where it has none; ``_person``), from one parse of its
    JSON (``raw``) as a VARIANT; with ``sources``, the JSON texts they were parsed from
    (``_props_text``, ``_person_text``: the event's, or the string an object was given in)."""
    parsed = df.select(*CARRIED, "event", "raw", F.parse_json("raw").alias("_v")).select(
        *CARRIED,
        "event",
        "raw",
        "_v",
        F.try_variant_get("_v", "$.properties", _EMPTY).alias("_props"),
        F.try_variant_get("_v", "$.person_properties", _EMPTY).alias("_person"),
    )
    given_as_text = F.col("_props").isNull()  # absent, or a string holding the object (rare)
    props = F.coalesce(
        F.when(given_as_text, _held("properties")).otherwise(F.col("_props")), F.create_map().cast(_EMPTY)
    )
    person = F.when(F.col("_person").isNull(), _held("person_properties")).otherwise(F.col("_person"))
    texts: list[Column] = []
    if sources:
        string = F.try_variant_get("_v", "$.properties", "string")
        texts = [
            F.when(given_as_text & string.isNotNull(), string).otherwise(F.col("raw")).alias("_props_text"),
            F.coalesce(F.try_variant_get("_v", "$.person_properties", "string"), F.col("raw")).alias("_person_text"),
        ]
    return parsed.select(*CARRIED, "event", props.alias("_props"), person.alias("_person"), *texts)


def property_entries(df: DataFrame, sources: bool = False) -> DataFrame:
    """Silver events -> one row per property entry: ``property_type``, ``property_key`` and its value
    (``_value``, a VARIANT); with ``sources``, the JSON text each was parsed from too (``_source``:
    the event's, or the string its properties were given in), where serde_json's notation reads a
    negative zero's sign.

    The event's JSON (``raw``) is parsed once, as a VARIANT (a key given twice keeps its last
    occurrence); every document is exploded in one pass, with no higher-order function per entry.
    The person's documents are exploded whole and an entry a document before it holds is left out."""

    def inner(key: str) -> Column:
        return F.try_variant_get(F.col("_props")[key], "$", _EMPTY)

    text = F.col("_props_text") if sources else F.lit(None).cast("string")
    person_text = F.col("_person_text") if sources else text
    per_doc = _objects(df, sources).select(
        *CARRIED,
        "_person",
        inner("$set").alias("_set"),
        F.inline(
            F.array(
                _doc("event", F.col("_props"), EVENT_DOC, text),
                _doc("person", F.col("_person"), PERSON_DOC, person_text),
                _doc("person", inner("$set"), SET_DOC, text),
                _doc("person", inner("$set_once"), SET_ONCE_DOC, text),
                # A $groupidentify without an integer index in 0..255 keeps its entries under
                # no type, so they are counted as skipped (bad_group_index), never lost.
                _doc(
                    group_type(F.col("_props")),
                    F.when(F.col("event") == "$groupidentify", inner("$group_set")),
                    GROUP_DOC,
                    text,
                ),
            )
        ),
    )
    entries = per_doc.select(
        *CARRIED,
        "_person",
        "_set",
        "_doc",
        "_source",
        "property_type",
        F.explode("entries").alias("property_key", VALUE),
    )

    def holds(doc: str) -> Column:
        return F.coalesce(F.map_contains_key(doc, F.col("property_key")), F.lit(False))

    doc = F.col("_doc")
    shadowed = ((doc == SET_DOC) & holds("_person")) | ((doc == SET_ONCE_DOC) & (holds("_person") | holds("_set")))
    kept = entries.where(~shadowed)
    return kept.select(*CARRIED, "property_type", "property_key", VALUE, *(["_source"] if sources else []))


def _valued(rules: FanoutRules, notation: str, sources: bool) -> Callable[[DataFrame], DataFrame]:
    """Entries (:func:`property_entries`: ``property_type``, ``property_key``, ``_value``; with
    ``sources``, ``_source``) -> with the value's canonical text (``property_value``,
    :func:`canonical_text`) and why the tuple is skipped (``skip_reason``, null for one that
    counts). ``_source``, the JSON text a value was parsed from, gives a zero its sign in
    serde_json's notation."""

    def transform(df: DataFrame) -> DataFrame:
        staged = df.withColumn("_type", F.schema_of_variant(VALUE))
        kind, source = F.col("_type"), F.col("_source") if sources else None
        text = canonical_text(F.col(VALUE), kind, notation, F.col("property_key"), source)
        null = kind == "VOID"
        nested = kind.startswith("OBJECT") | kind.startswith("ARRAY")
        out = F.when(nested, text if rules.nested_values == "json" else F.lit(None)).otherwise(text)
        valued = staged.withColumn("property_value", out)
        key, written = F.col("property_key"), F.col("property_value")
        reason = F.coalesce(
            F.when(F.col("property_type").isNull(), F.lit("bad_group_index")),
            F.when(key.isNull() | (key == ""), F.lit("empty_key")),
            F.when(null, F.lit("null_value")),
            F.when(nested, F.lit("nested_value")) if rules.nested_values == "skip" else F.lit(None),
            F.when(written == "", F.lit("empty_value")),
            F.when(F.length(key) > rules.max_key_length, F.lit("key_too_long")),
            F.when(F.length(written) > rules.max_value_length, F.lit("value_too_long")),
            F.when(key.isin(*rules.excluded_keys), F.lit("excluded_key")) if rules.excluded_keys else F.lit(None),
        )
        return valued.withColumn(SKIP_REASON, reason).drop("_type", VALUE, "_source")

    return transform


def fan_out(rules: FanoutRules, notation: str = JAVASCRIPT) -> Callable[[DataFrame], DataFrame]:
    """Silver events -> one row per property entry, with ``property_value`` in its canonical text
    and a ``skip_reason`` (null for a tuple that counts)."""

    def transform(df: DataFrame) -> DataFrame:
        serde = notation == SERDE_JSON
        return property_entries(df, sources=serde).transform(_valued(rules, notation, serde))

    return transform


def tuple_counts(rules: FanoutRules, width: timedelta, notation: str = JAVASCRIPT) -> Callable[[DataFrame], DataFrame]:
    """Silver events -> the count and newest event time per tuple, window, source batch and skip
    reason: stage 1's partials (the rows without a reason) and its skip figures in one aggregation.

    The entries are gathered by bucket (part of every key) once they are fanned out, and counted
    there: the partials are written by bucket (one writer task per bucket), so the count needs no
    exchange of its own and stage 1 shuffles once, not twice (Spark drops the writer's gathering
    as done). The fan-out itself runs where the events are read, in as many tasks as they have."""

    def transform(df: DataFrame) -> DataFrame:
        return (
            df.transform(fan_out(rules, notation))
            .withColumn(WINDOW_START, window_start(F.col("event_time"), width))
            .repartition("bucket")
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
    """Fan-out rows (:func:`fan_out`) -> partial counts per tuple, window and source batch of the
    tuples that count (stage 1)."""

    def transform(df: DataFrame) -> DataFrame:
        counted = (
            df.where(F.col(SKIP_REASON).isNull())
            .withColumn(WINDOW_START, window_start(F.col("event_time"), width))
            .groupBy(*TUPLE, "bucket", WINDOW_START, "batch_id", SKIP_REASON)
            .agg(F.count(F.lit(1)).alias("count"), F.max("event_time").alias("max_event_time"))
        )
        return counted.transform(counted_partials(created_at))

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
