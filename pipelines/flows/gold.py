"""Gold jobs: silver events -> partial counts (stage 1) -> merged into gold (stage 2) -> ClickHouse."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.property_values import (
    MERGE_UPDATE,
    WINDOW_START,
    FanoutRules,
    TeamFilter,
    counted_partials,
    fan_out,
    merge_on,
    merge_source,
    skip_counts,
    tuple_counts,
)
from pipelines.config.layers import fanout_rules, team_filter
from pipelines.config.settings import Settings
from pipelines.runtime.flow_types import MERGE_SOURCE, Batch, FlowRecord, MergeRules
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES


@dataclass(frozen=True)
class GoldConfig:
    """What gold's two stages are configured with, built once per run from settings."""

    rules: FanoutRules
    teams: TeamFilter
    window: timedelta


def gold_config(settings: Settings) -> GoldConfig:
    return GoldConfig(fanout_rules(settings), team_filter(settings), settings.gold.window)


def counted_teams(teams: TeamFilter, rows: DataFrame, record: FlowRecord, metric: str) -> DataFrame:
    """``rows`` of the teams gold counts (``gold.teams``); how many rows it leaves out goes to the
    event log as ``metric`` (a figure, counted only when a filter is set)."""
    if not teams.everyone:
        record.add(**{metric: teams.left_out(rows).count()})
    return teams.counted(rows)


INPUT_EVENTS = "input_events"


def partials(batch: Batch, config: GoldConfig, record: FlowRecord) -> DataFrame:
    """Stage 1: new silver events -> partial tuple counts per window and source batch.

    One aggregation gives the partials and the skip figures; the fan-out rows themselves are never
    kept. The time is a literal so every read of the batch sees the same one.
    """
    events = counted_teams(config.teams, batch.rows, record, "filtered_teams.events")
    events = record.observe(INPUT_EVENTS, events, rows=F.count(F.lit(1)))
    counts = record.cache(events.transform(fan_out(config.rules)).transform(tuple_counts(config.window)))
    # At most one row per skip reason (eight) plus "counted": figures, not rows. The pass that
    # fills the cache counts the events as it reads them.
    reasons = {r["reason"]: int(r["count"]) for r in skip_counts(counts).collect()}
    counted = reasons.pop("counted", 0)
    # No tuple (a batch all filtered out or without properties): no sum to hold the batch against.
    record.check_with(tuples=counted or None)
    n_events = int(record.observed(INPUT_EVENTS)["rows"])
    record.rows(rows_in=n_events)
    record.add(input_events=n_events, tuples=counted, **{f"skipped.{k}": v for k, v in reasons.items()})
    return counts.transform(counted_partials(F.lit(datetime.now(UTC))))


def partials_figures(out: DataFrame, config: GoldConfig, record: FlowRecord) -> None:
    n_out = record.gated_rows(GOLD_PARTIALS.key)
    if n_out is None:  # no gate counted them
        n_out = out.count()
    record.rows(rows_out=n_out)
    record.add(partial_rows=n_out)
    record.say(
        f"gold stage 1: {int(record.figure('input_events')):,} events -> {int(record.figure('tuples')):,} tuples "
        f"-> {n_out:,} partial rows"
    )


def merged(batch: Batch, config: GoldConfig, record: FlowRecord) -> DataFrame:
    """Stage 2: partials not merged yet -> summed per tuple and window, the source of the MERGE
    into gold (:data:`GOLD_MERGE`).

    Stage 2 applies the team filter too, so partials counted before a team was filtered out are
    not merged while it is, and never later: a team added back resumes from what it had.
    """
    parts = counted_teams(config.teams, batch.rows, record, "filtered_teams.partial_rows")
    # Read once, by the pass that fills the cache of the MERGE source, which counts them too, and
    # finds their earliest window (a source past gold's windows is appended, see GOLD_MERGE).
    parts = record.observe(PARTIAL_ROWS, parts, rows=F.count(F.lit(1)))
    parts = record.observe(MERGE_SOURCE, parts, least=F.min(WINDOW_START))
    return record.cache(parts.transform(merge_source()))


PARTIAL_ROWS = "partial_rows"


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
