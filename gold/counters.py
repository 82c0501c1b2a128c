"""Counters: running totals per (counter, entity) with tiered flush intervals and milestones.

A counter registry (YAML, named by ``counters.registry``) says which events increment which counter
and for which entity (an event property such as ``post_id``). The path is the two-stage one of
property values:

1. ``gold/counter_partials``: per batch of silver events, the increments per counter, entity and
   window, tagged with the batch (``seq``, the last silver version read).
2. ``gold/counters``: one row per (counter, entity) with the running ``total``; a flush adds an
   entity's partials newer than its ``flushed_seq`` in one MERGE, guarded by that ``flushed_seq``,
   so a redone flush, pods, or several runs never count a partial twice.

Tiers: an entity is flushed when the clock (the newest event time the partials have seen) is at
least its tier's interval past its last flush, the tier being chosen by its current total. Low
counts (interval 0) show up on every run; hot entities are batched.

Milestones come from the change data feed of ``gold/counters``: for every committed update, each
threshold with ``before < threshold <= after`` is one row of ``gold/counter_milestones``, written
with an app transaction at the counters version read. A crash between the MERGE and the milestone
write is finished by the next run, and no version is read twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bronze.number_text import JAVASCRIPT, fractional_text
from bronze.primitives import ConfigError, Duration, named, non_negative, unique_names
from gold.property_values import event_properties, property_text

COUNTER_PARTIALS_SCHEMA = StructType(
    [
        StructField("counter", StringType()),
        StructField("entity", StringType()),
        StructField("window_start", TimestampType()),
        StructField("window_end", TimestampType()),
        StructField("count", LongType()),
        StructField("seq", LongType()),  # the silver version the batch read up to
    ]
)
COUNTERS_SCHEMA = StructType(
    [
        StructField("counter", StringType()),
        StructField("entity", StringType()),
        StructField("total", LongType()),
        StructField("flushed_seq", LongType()),  # partials up to this seq are in total
        StructField("flushed_at", TimestampType()),  # the clock (event time) of the last flush
        StructField("flushes", LongType()),
        StructField("updated_at", TimestampType()),
    ]
)
COUNTERS_COLUMNS = [f.name for f in COUNTERS_SCHEMA.fields]
MILESTONES_SCHEMA = StructType(
    [
        StructField("counter", StringType()),
        StructField("entity", StringType()),
        StructField("threshold", LongType()),
        StructField("crossed_at", TimestampType()),  # the flush's clock
        StructField("total", LongType()),  # the total right after the crossing flush
        StructField("counters_version", LongType()),
    ]
)

Scalar = str | int | float | bool


class RegistryError(ConfigError):
    """A counter registry cannot be used; ``problems`` holds one line per problem."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tier(_Model):
    below: int | None = Field(default=None, ge=1, description="applies while the total is below this")
    interval: Duration

    _check_interval = field_validator("interval")(lambda v: non_negative(v, "interval"))


class Counter(_Model):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
    event: str | list[str] = Field(description="event name(s) that increment the counter")
    where: dict[str, Scalar | list[Scalar]] = Field(
        default_factory=dict, description="property conditions: equal to a value, or in a list"
    )
    entity: str = Field(min_length=1, description="the event property whose value is the entity")
    tiers: list[Tier] = Field(default_factory=lambda: [Tier(interval=timedelta(0))])
    milestones: list[int] = Field(default_factory=list)

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: list[Tier]) -> list[Tier]:
        if not v:
            raise ValueError("give at least one tier")
        bounds = [t.below for t in v[:-1]]
        if any(b is None for b in bounds):
            raise ValueError("only the last tier may leave out `below` (it covers every larger total)")
        if v[-1].below is not None:
            raise ValueError("the last tier must leave out `below`: it covers every larger total")
        if bounds != sorted(set(bounds)):  # type: ignore[type-var]
            raise ValueError(f"tier bounds must increase, got {bounds}")
        return v

    @field_validator("milestones")
    @classmethod
    def _milestones(cls, v: list[int]) -> list[int]:
        if any(m <= 0 for m in v):
            raise ValueError("milestones must be positive")
        return sorted(set(v))

    def events(self) -> list[str]:
        return [self.event] if isinstance(self.event, str) else list(self.event)


class Registry(_Model):
    counters: list[Counter]

    @model_validator(mode="after")
    def _unique(self) -> Registry:
        unique_names(self.counters, "counter")
        return self

    def get(self, name: str) -> Counter:
        return named(self.counters, name, "no counter named {name!r} in the registry ({known})", RegistryError)


def load_registry(path: Path) -> Registry:
    """Read and validate a registry file; every problem becomes one line of a RegistryError."""
    where = f"counter registry {path}"
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError([f"{where}: file not found (MEDALLION_COUNTERS__REGISTRY)"]) from None
    except yaml.YAMLError as exc:
        raise RegistryError([f"{where}: not valid YAML: {exc}"]) from None
    if isinstance(data, list):
        data = {"counters": data}
    if not isinstance(data, dict):
        raise RegistryError([f"{where}: expected a mapping with a `counters` list"])
    try:
        return Registry.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = ""
            for p in e["loc"]:
                loc += f"[{p}]" if isinstance(p, int) else ("." if loc else "") + str(p)
            msg = e["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {loc or 'counters'}: {msg}")
        raise RegistryError(problems) from None


# -- stage 1: increments --------------------------------------------------------------------------
def _literal(v: Scalar, notation: str) -> str:
    """A registry value as a property's text is written: a number in its canonical text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return fractional_text(v, notation)
    return str(v)


def increments(
    events: DataFrame, registry: Registry, window: timedelta, seq: int, notation: str = JAVASCRIPT
) -> DataFrame:
    """Silver events -> partial counts per counter, entity and window (events without the entity
    property do not count)."""
    events = events.select("event", "event_time", "raw", event_properties(F.col("raw")).alias("_props"))

    def value(key: str) -> Column:
        return property_text(F.col("_props"), key, notation, F.col("raw"))

    frames = []
    for c in registry.counters:
        matched = events.where(F.col("event").isin(c.events()))
        for key, want in c.where.items():
            values = want if isinstance(want, list) else [want]
            matched = matched.where(value(key).isin([_literal(v, notation) for v in values]))
        frames.append(
            matched.select(
                F.lit(c.name).alias("counter"),
                value(c.entity).alias("entity"),
                F.window("event_time", f"{int(window.total_seconds())} seconds")["start"].alias("window_start"),
            ).where(F.col("entity").isNotNull())
        )
    rows = frames[0]
    for more in frames[1:]:
        rows = rows.unionByName(more)
    return rows.groupBy("counter", "entity", "window_start").agg(
        (F.col("window_start") + F.expr(f"INTERVAL {int(window.total_seconds())} SECONDS")).alias("window_end"),
        F.count(F.lit(1)).alias("count"),
        F.lit(seq).cast("long").alias("seq"),
    )


# -- stage 2: tiered flush ------------------------------------------------------------------------
def tier_interval(c: Counter, total: Column) -> Column:
    """Seconds between flushes for an entity at ``total``."""
    expr = F.lit(c.tiers[-1].interval.total_seconds())
    for tier in reversed(c.tiers[:-1]):
        expr = F.when(total < F.lit(tier.below), F.lit(tier.interval.total_seconds())).otherwise(expr)
    return expr


def flush_source(
    partials: DataFrame, counters: DataFrame, registry: Registry, clock: Any, seq: int, force: bool = False
) -> DataFrame:
    """The MERGE source: every entity with partials newer than its flushed_seq whose tier is due
    (every such entity when ``force``, at the end of a backfill)."""
    current = counters.select("counter", "entity", "total", "flushed_seq", "flushed_at", "flushes")
    pending = (
        partials.join(current.select("counter", "entity", "flushed_seq"), ["counter", "entity"], "left")
        .where(F.col("seq") > F.coalesce(F.col("flushed_seq"), F.lit(-1)))
        .groupBy("counter", "entity")
        .agg(F.sum("count").alias("delta"))
        .join(current, ["counter", "entity"], "left")
    )
    total = F.coalesce(F.col("total"), F.lit(0))
    interval = F.lit(None).cast("double")
    for c in registry.counters:
        interval = F.when(F.col("counter") == c.name, tier_interval(c, total)).otherwise(interval)
    since = F.unix_seconds(F.lit(clock).cast("timestamp")) - F.unix_seconds("flushed_at")
    due = F.lit(True) if force else F.col("flushed_at").isNull() | (interval == 0) | (since >= interval)
    known = F.col("counter").isin([c.name for c in registry.counters])
    return pending.where(due & known).select(
        "counter",
        "entity",
        (total + F.col("delta")).alias("total"),
        F.lit(seq).cast("long").alias("flushed_seq"),
        F.lit(clock).cast("timestamp").alias("flushed_at"),
        (F.coalesce(F.col("flushes"), F.lit(0)) + 1).alias("flushes"),
        F.current_timestamp().alias("updated_at"),
        F.coalesce(F.col("flushed_seq"), F.lit(-1)).alias("expected_seq"),
    )


FLUSH_ON = "t.counter = s.counter AND t.entity = s.entity"
FLUSH_WHEN = "t.flushed_seq = s.expected_seq"
FLUSH_UPDATE = {c: f"s.{c}" for c in ("total", "flushed_seq", "flushed_at", "flushes", "updated_at")}
FLUSH_INSERT = {c: f"s.{c}" for c in COUNTERS_COLUMNS}


# -- milestones -----------------------------------------------------------------------------------
def crossings(changes: DataFrame, registry: Registry) -> DataFrame:
    """CDF rows of gold/counters -> one row per threshold crossed by a committed change."""
    post = changes.where(F.col("_change_type").isin("insert", "update_postimage"))
    pre = changes.where(F.col("_change_type") == "update_preimage").select(
        "counter", "entity", "_commit_version", F.col("total").alias("before")
    )
    moved = post.join(pre, ["counter", "entity", "_commit_version"], "left").select(
        "counter",
        "entity",
        F.coalesce(F.col("before"), F.lit(0)).alias("before"),
        F.col("total").alias("after"),
        "flushed_at",
        F.col("_commit_version").alias("counters_version"),
    )
    thresholds = F.lit(None).cast("array<bigint>")
    for c in registry.counters:
        thresholds = F.when(
            F.col("counter") == c.name, F.array(*(F.lit(m).cast("bigint") for m in c.milestones))
        ).otherwise(thresholds)
    crossed = moved.select("*", F.explode(thresholds).alias("threshold")).where(
        (F.col("before") < F.col("threshold")) & (F.col("threshold") <= F.col("after"))
    )
    # A threshold is crossed once per entity even if the table were rewritten: keep the first.
    first = Window.partitionBy("counter", "entity", "threshold").orderBy("counters_version")
    return (
        crossed.withColumn("_n", F.row_number().over(first))
        .where("_n = 1")
        .select(
            "counter",
            "entity",
            "threshold",
            F.col("flushed_at").alias("crossed_at"),
            F.col("after").alias("total"),
            "counters_version",
        )
    )


# -- export ---------------------------------------------------------------------------------------
def exported_changes(changes: DataFrame) -> DataFrame:
    """CDF rows of gold/counters -> the rows to send: each change's new total, with its counters
    ``version``, in version order."""
    return (
        changes.where(F.col("_change_type").isin("insert", "update_postimage"))
        .select(
            "counter",
            "entity",
            "total",
            F.col("_commit_version").alias("version"),
            "updated_at",
        )
        .orderBy("version", "counter", "entity")
    )


def by_version(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Arrow batches of :func:`exported_changes` -> one table per counters version, in order.

    One version is one insert with its own token; only the rows of the version at hand are held."""
    held: list[pa.Table] = []
    for batch in batches:
        table = pa.Table.from_batches([batch])
        for version in pc.unique(table["version"]).to_pylist():
            part = table.filter(pc.equal(table["version"], version))
            if held and held[0]["version"][0].as_py() != version:
                yield pa.concat_tables(held)
                held = []
            held.append(part)
    if held:
        yield pa.concat_tables(held)
