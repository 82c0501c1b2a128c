"""Gold jobs: silver events -> partial counts (stage 1) -> merged into gold (stage 2) -> ClickHouse."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.backfill import counted_by_stages
from gold.property_values import (
    COUNTED,
    MERGE_UPDATE,
    SKIP_REASONS,
    WINDOW_START,
    FanoutRules,
    TeamFilter,
    counted_partials,
    merge_on,
    merge_source,
    skip_figures,
    tuple_counts,
)
from pipelines.config.layers import fanout_rules, team_filter
from pipelines.config.settings import Settings
from pipelines.runtime.flow_types import Batch, FlowRecord, MergeRules
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES


@dataclass(frozen=True)
class GoldConfig:
    """What gold's two stages are configured with, built once per run from settings."""

    rules: FanoutRules
    teams: TeamFilter
    window: timedelta
    #: How numbers are written (``bronze.number_notation``).
    notation: str


def gold_config(settings: Settings) -> GoldConfig:
    return GoldConfig(
        fanout_rules(settings), team_filter(settings), settings.gold.window, settings.bronze.number_notation
    )


def counting_rules(config: GoldConfig) -> dict[str, Any]:
    """The settings gold's counts depend on, as its event-log rows record them (stage 1's and a
    backfill's): what ``medallion backfill`` compares to say which rules changed."""
    rules = {f"rules.{k}": v for k, v in asdict(config.rules).items()}
    rules |= {f"teams.{k}": v for k, v in asdict(config.teams).items()}
    rules |= {"window": str(config.window), "number_notation": config.notation}
    return {k: list(v) if isinstance(v, tuple | list) else v for k, v in rules.items()}


def counted_teams(teams: TeamFilter, rows: DataFrame, record: FlowRecord, metric: str) -> DataFrame:
    """``rows`` of the teams gold counts (``gold.teams``); how many rows it leaves out goes to the
    event log as ``metric`` (a figure, counted only when a filter is set)."""
    if not teams.everyone:
        record.add(**{metric: teams.left_out(rows).count()})
    return teams.counted(rows)


INPUT_EVENTS = "input_events"
PARTIAL_ROWS = "partial_rows"
#: The observation of stage 1's tuples: counted and skipped per reason (``skip_figures``).
TUPLES = "tuples"


def partials(batch: Batch, config: GoldConfig, record: FlowRecord) -> DataFrame:
    """Stage 1: new silver events -> partial tuple counts per window and source batch.

    One pass: the write computes the fan-out and its aggregation, and counts as it goes the events,
    the tuples that count and those skipped per reason (observed, no pass of their own); the gate
    holds the partials' sum to the tuples that count, judged before the commit where the store can
    (else the gate caches the batch for it). The time is a literal so every read of the batch
    sees the same one.
    """
    events = counted_teams(config.teams, batch.rows, record, "filtered_teams.events")
    events = record.observe(INPUT_EVENTS, events, rows=F.count(F.lit(1)))
    counts = events.transform(tuple_counts(config.rules, config.window, config.notation))
    counts = record.observe(TUPLES, counts, **skip_figures())
    # No tuple (a batch all filtered out or without properties): no sum to hold the batch against.
    record.check_with(tuples=lambda: int(record.observed(TUPLES, query=False).get(COUNTED) or 0) or None)
    return counts.transform(counted_partials(F.lit(datetime.now(UTC))))


def partials_figures(out: DataFrame, config: GoldConfig, record: FlowRecord) -> None:
    n_out = record.gated_rows(GOLD_PARTIALS.key)
    if n_out is None:  # no gate counted them
        n_out = out.count()
    tuples = record.observed(TUPLES)
    counted = int(tuples.get(COUNTED) or 0)
    n_events = int(record.observed(INPUT_EVENTS).get("rows") or 0)
    record.rows(rows_in=n_events, rows_out=n_out)
    skipped = {f"skipped.{r}": int(tuples[r]) for r in SKIP_REASONS if tuples.get(r)}
    record.add(input_events=n_events, tuples=counted, partial_rows=n_out, **skipped)
    record.describe(json.dumps({"rules": counting_rules(config)}))
    record.say(f"gold stage 1: {n_events:,} events -> {counted:,} tuples -> {n_out:,} partial rows")


def merged(batch: Batch, config: GoldConfig, record: FlowRecord) -> DataFrame:
    """Stage 2: partials not merged yet -> summed per tuple and window, the source of the MERGE
    into gold (:data:`GOLD_MERGE`).

    Stage 2 applies the team filter too, so partials counted before a team was filtered out are
    not merged while it is, and never later: a team added back resumes from what it had.
    Not cached: a source that no gold row can match is appended in one pass (the write counts
    the partials it reads), and so is one MERGEd on delta-rs (its gate counts the source as it is
    staged for the MERGE); Delta on Spark validates a MERGE's source from a cache.

    The partials are gathered by bucket before they are summed: gold is written by bucket (one
    writer task per bucket), and a sum over the rows of one bucket needs no exchange of its own,
    so the query shuffles once, not twice (Spark drops the writer's gathering as done). The
    partials were summed per batch by stage 1, so a sum before the shuffle saved little.
    """
    # A backfill's partials are in gold already: it wrote their sums itself.
    parts = counted_teams(config.teams, batch.rows.transform(counted_by_stages), record, "filtered_teams.partial_rows")
    parts = record.observe(PARTIAL_ROWS, parts, rows=F.count(F.lit(1)))
    return parts.repartition("bucket").transform(merge_source())


def merged_figures(out: DataFrame, config: GoldConfig, record: FlowRecord) -> None:
    n_parts = int(record.observed(PARTIAL_ROWS)["rows"])
    record.rows(rows_in=n_parts)
    record.add(partial_rows=n_parts)
    n = record.gated_rows(GOLD_PROPERTY_VALUES.key)
    if n is None:  # no gate counted them
        n = out.count()
    record.rows(rows_out=n)
    record.add(merged_rows=n)
    record.say(f"gold stage 2: {int(record.figure('partial_rows')):,} partial rows merged as {n:,} rows")


#: How stage 2 writes: each tuple's counts added to what gold holds, in the run's buckets only. A
#: window is in the MERGE key, so a source whose windows all start after every window gold holds
#: in the run's buckets (a first load, a batch of new windows only) is appended.
GOLD_MERGE = MergeRules(merge_on, MERGE_UPDATE, appends_above=WINDOW_START)
