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

#: Variant types of a JSON number written without fraction or exponent (Spark stores ``1.0`` as
#: DECIMAL(1,0), so a DECIMAL with scale 0 is not one of them).
INTEGER_VARIANT_TYPES = ("BIGINT", "INT", "SMALLINT", "TINYINT")
#: Shortest round-trip digits of a double (Schubfach), in Java's notation; jackson-core ships with
#: Spark. Java 17's own Double.toString is not always the shortest.
SHORTEST_DOUBLE = "com.fasterxml.jackson.core.io.schubfach.DoubleToDecimal"


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


def _as_map(obj: Column) -> Column:
    """A JSON object held in a VARIANT as a map of its entries (null when it is not an object)."""
    return F.try_variant_get(obj, "$", "map<string,variant>")


def number_text(value: Column) -> Column:
    """The canonical text of a JSON number held in a VARIANT (null for anything else).

    - An integer keeps all its digits: ``-0`` is ``0``, 2^53+1 stays ``9007199254740993``, and
      ``100.0`` is ``100``. That is every number Spark holds exactly with no fraction (BIGINT, or
      DECIMAL with scale 0, up to 38 digits); an exponent or more digits make it a double.
    - Any other number is the double it denotes, written as JavaScript's ``String(x)`` (and
      ``JSON.stringify``) writes it: the shortest digits that read back to the same double, plain
      for 1e-6 <= |x| < 1e21, else ``d.ddde±n``. So ``1.0`` is ``1``, ``2.5e3`` ``2500``,
      ``1e21`` ``1e+21``, ``1e16`` ``10000000000000000``, ``1.25e-5`` ``0.0000125``,
      ``0.000001`` ``0.000001``, ``1e-7`` ``1e-7``.

    Built from native functions: Schubfach's shortest digits (via ``reflect``) re-laid-out with
    string functions, no Python UDF.
    """
    kind = F.schema_of_variant(value)
    integer = F.when(kind.isin(*INTEGER_VARIANT_TYPES) | kind.endswith(",0)"), F.to_json(value))
    double = F.try_variant_get(value, "$", "double")
    java = F.reflect(F.lit(SHORTEST_DOUBLE), F.lit("toString"), double)  # e.g. -1.25E-5, 2500.0
    parts = r"^-?([0-9]+)\.([0-9]+)(?:E(-?[0-9]+))?$"
    whole, fraction = F.regexp_extract(java, parts, 1), F.regexp_extract(java, parts, 2)
    exponent = F.coalesce(F.regexp_extract(java, parts, 3).try_cast("int"), F.lit(0))
    digits = F.concat(whole, fraction)
    leading = F.length(digits) - F.length(F.regexp_replace(digits, "^0+", ""))
    significant = F.regexp_replace(F.regexp_replace(digits, "^0+", ""), "0+$", "")
    k = F.length(significant)
    n = F.length(whole) + exponent - leading  # the value is 0.<significant> x 10^n
    e = n - 1
    sign = F.when(java.startswith("-") & (k > 0), F.lit("-")).otherwise(F.lit(""))
    laid_out = (
        F.when(k == 0, F.lit("0"))
        .when((k <= n) & (n <= 21), F.concat(significant, F.repeat(F.lit("0"), n - k)))
        .when(
            (n > 0) & (n <= 21),
            F.concat(F.substr(significant, F.lit(1), n), F.lit("."), F.substr(significant, n + 1)),
        )
        .when((n > -6) & (n <= 0), F.concat(F.lit("0."), F.repeat(F.lit("0"), -n), significant))
        .otherwise(
            F.concat(
                F.substr(significant, F.lit(1), F.lit(1)),
                F.when(k > 1, F.concat(F.lit("."), F.substr(significant, F.lit(2)))).otherwise(F.lit("")),
                F.lit("e"),
                F.when(e >= 0, F.lit("+")).otherwise(F.lit("-")),
                F.abs(e).cast("string"),
            )
        )
    )
    finite = F.when(whole != "", F.concat(sign, laid_out)).otherwise(java)  # else Infinity, -Infinity
    fractional = kind.isin("DOUBLE", "FLOAT") | kind.startswith("DECIMAL")
    return F.coalesce(integer, F.when(fractional, finite))


def _without(entries: Column, *others: Column) -> Column:
    """``entries`` less the keys any of ``others`` holds."""
    return F.map_filter(entries, lambda k, _: ~F.exists(F.array(*others), lambda m: F.map_contains_key(m, k)))


def person_entries(set_: Column, set_once: Column, person: Column) -> Column:
    """One person observation per key: ``person_properties`` (the state after the event) wins,
    then ``$set``, then ``$set_once``. Each argument is a map of entries, or null."""
    empty = F.create_map().cast("map<string,variant>")
    person, set_, set_once = (F.coalesce(m, empty) for m in (person, set_, set_once))
    return F.map_concat(person, _without(set_, person), _without(set_once, person, set_))


def fan_out(rules: FanoutRules) -> Callable[[DataFrame], DataFrame]:
    """Silver events -> one row per property entry, with ``property_value`` as text and a
    ``skip_reason`` (null for a tuple that counts)."""

    def transform(df: DataFrame) -> DataFrame:
        # Two plain generators: each event's documents (properties, the person entries,
        # $group_set) as (property type, map) rows, then each map's entries. Spark compiles
        # explode and inline; higher-order functions (lambdas) are interpreted row by row, so they
        # are kept to the person documents, which are small and often absent.
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
        index = F.try_variant_get(props, "$['$group_type_index']", "variant")
        group_index = F.when(
            F.schema_of_variant(index).isin(*INTEGER_VARIANT_TYPES), F.try_variant_get(index, "$", "bigint")
        )
        good_index = group_index.between(0, GROUP_TYPES - 1)

        def doc(property_type: Column | str, entries: Column) -> Column:
            kind = property_type if isinstance(property_type, Column) else F.lit(property_type)
            return F.struct(kind.alias("property_type"), entries.alias("entries"))

        per_doc = docs.select(
            "team_id",
            "bucket",
            "event_time",
            "batch_id",
            F.inline(
                F.array(
                    doc("event", _as_map(props)),
                    doc(
                        "person",
                        person_entries(
                            _as_map(F.try_variant_get(props, "$['$set']", "variant")),
                            _as_map(F.try_variant_get(props, "$['$set_once']", "variant")),
                            _as_map(F.col("_person")),
                        ),
                    ),
                    # A $groupidentify without an integer index in 0..255 keeps its entries under
                    # no type, so they are counted as skipped (bad_group_index), never lost.
                    doc(
                        F.when(good_index, F.concat(F.lit("group_"), group_index.cast("string"))),
                        F.when(
                            F.col("event") == "$groupidentify",
                            _as_map(F.try_variant_get(props, "$['$group_set']", "variant")),
                        ),
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
        nested = first.isin("{", "[")
        value = (
            F.when(first == '"', F.try_variant_get(F.col("_value"), "$", "string"))
            .when(first == "n", F.lit(None))
            .when(nested, F.col("_json") if rules.nested_values == "json" else F.lit(None))
            .when(first.isin("t", "f"), F.col("_json"))
            .otherwise(number_text(F.col("_value")))
        )
        key = F.col("property_key")
        reason = F.coalesce(
            F.when(F.col("property_type").isNull(), F.lit("bad_group_index")),
            F.when(key.isNull() | (key == ""), F.lit("empty_key")),
            F.when(first == "n", F.lit("null_value")),
            F.when(nested, F.lit("nested_value")) if rules.nested_values == "skip" else F.lit(None),
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
