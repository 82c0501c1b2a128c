"""Metric flows: bronze samples -> final panes (silver) -> closed windows (gold)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.metric_windows import close_windows, closes_through, panes_after, raw_rows, window_rows
from pipelines.config.settings import Settings
from pipelines.errors import StorageError
from pipelines.runtime.flow_types import Batch, FlowRecord, StateBatch, StateRules, StateStep
from pipelines.runtime.tables import GOLD_METRIC_WINDOWS, SILVER_METRIC_PANES
from silver.config import AggregationSettings
from silver.metric_panes import (
    INPUT_COLUMNS,
    METRIC_PANE_COLUMNS,
    carried_state,
    late_condition,
    next_state,
    pane_clock,
    pane_run,
    progress_row,
    select_samples,
    state_lasts,
    state_progress,
    state_samples,
)


def aggregations(settings: Settings) -> tuple[AggregationSettings, ...]:
    return tuple(settings.metrics.aggregations)


def no_aggregations(aggs: Sequence[AggregationSettings]) -> str | None:
    return None if aggs else "no metric aggregations configured (metrics.aggregations)"


def panes_done(state: DataFrame) -> int | None:
    """The bronze version the metric state has processed (its progress row without aggregation)."""
    bronze = state.transform(state_progress).where(F.col("aggregation").isNull()).first()
    return bronze["bronze_version"] if bronze else None


#: How the runner keeps silver/metric_panes' state: samples of panes not final yet, each series'
#: newest counted sample, per-aggregation clocks and bronze progress, replaced each run with the
#: run's pane rows as its outbox (read back without them).
METRIC_STATE = StateRules(panes_done, state_samples, "pane", METRIC_PANE_COLUMNS, where="kind <> 'pane'")


def panes(batch: StateBatch, aggs: Sequence[AggregationSettings], record: FlowRecord) -> StateStep:
    """New bronze samples and the state -> final panes of every configured aggregation (see
    silver.metric_panes) and the next state."""
    state = batch.state
    # One progress row per aggregation (and one for bronze): the state's bookkeeping, not samples.
    progress = {r["aggregation"]: r for r in state.transform(state_progress).collect()}
    new = record.cache(batch.rows.select(*INPUT_COLUMNS)) if batch.rows is not None else None
    buffered = state.transform(state_samples)
    lasts = state.transform(state_lasts)
    outs, keep, new_lasts, progress_rows = [], [], [], []
    n_in = 0
    for agg in aggs:
        mine = record.cache(select_samples(new, agg)) if new is not None else buffered.limit(0)
        seen = mine.agg(F.count(F.lit(1)).alias("n"), F.max("timestamp").alias("t")).first()
        n_new = int(seen["n"]) if seen else 0
        prev = progress.get(agg.name)
        clock = pane_clock(agg, prev["max_seen"] if prev else None, seen["t"] if seen else None, batch.options.drain)
        late, counted = _late(batch, agg, mine, clock.previous, record)
        step = pane_run(
            agg,
            mine,
            buffered.where(F.col("aggregation") == agg.name),
            lasts.where(F.col("aggregation") == agg.name),
            clock.previous,
            clock.closes,
            batch.run,
            close_all=batch.options.drain,
            counted=counted,
        )
        n_late = step.late.count() if late else 0
        if counted is not None:
            record.add(**{f"{agg.name}.late_repeats": late - n_late})
        outs.append(step.panes)
        keep.append(step.buffered)
        new_lasts.append(step.lasts)
        progress_rows.append(progress_row(agg, clock, prev["dropped"] if prev else None, n_late))
        n_in += n_new
        record.add(**{f"{agg.name}.samples": n_new, f"{agg.name}.late_{agg.late}": n_late})
        if clock.watermark is not None:
            record.add(**{f"{agg.name}.watermark_epoch_s": clock.watermark.timestamp()})
    rest = record.cache(carried_state(keep, new_lasts))
    # One row per kind: figures of the cached rest, taken before the state it reads is replaced.
    counts = {r["kind"]: int(r["n"]) for r in rest.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}

    def published(n: int) -> None:
        record.rows(n_in, n)
        record.add(
            input_samples=n_in,
            panes=n,
            buffered_samples=counts.get("sample", 0),
            series_tracked=counts.get("last", 0),
            # The aggregations' progress rows and the bronze one.
            state_rows=sum(counts.values()) + n + len(progress_rows) + 1,
        )
        record.say(
            f"silver/metric_panes: {n_in:,} samples -> {n:,} final pane rows, "
            f"{counts.get('sample', 0):,} samples in open panes" + (" (drained)" if batch.options.drain else "")
        )

    return StateStep(next_state(rest, outs, progress_rows, batch.end), published)


def _late(
    batch: StateBatch, agg: AggregationSettings, mine: DataFrame, previous: datetime | None, record: FlowRecord
) -> tuple[int, DataFrame | None]:
    """How many of ``agg``'s new samples are late, and the samples earlier runs took around them
    (their repeats are not counted again: :func:`~silver.metric_panes.without_repeats`); the
    earlier source is read only where some are late, and only over their time span."""
    is_late = late_condition(agg, previous)
    if is_late is None:
        return 0, None
    # The late samples' count and span: one row.
    span = (
        mine.where(is_late)
        .agg(F.count(F.lit(1)).alias("n"), F.min("timestamp").alias("lo"), F.max("timestamp").alias("hi"))
        .first()
    )
    if not span or not span["n"] or batch.earlier is None:
        return (int(span["n"]) if span else 0), None
    try:
        earlier = batch.earlier()
    except StorageError as exc:  # the versions it took are vacuumed: late samples go on unchecked
        record.say(f"{agg.name}: late samples not checked for repeats ({exc})")
        return int(span["n"]), None
    return int(span["n"]), earlier.where(F.col("timestamp").between(span["lo"], span["hi"]))


def windows(batch: Batch, aggs: Sequence[AggregationSettings], record: FlowRecord) -> DataFrame:
    """New final panes -> windows the watermark has closed, late rows for windows already closed."""
    by_name = {a.name: a for a in aggs}
    new = record.cache(batch.rows)
    # Per aggregation: its newest watermark and run, and how far windows are closed (one row each).
    stats = {
        r["aggregation"]: r
        for r in new.groupBy("aggregation")
        .agg(F.max("watermark").alias("watermark"), F.max("run").alias("run"), F.count(F.lit(1)).alias("n"))
        .collect()
    }
    closed = {
        r["aggregation"]: r["c"]
        for r in batch.read(GOLD_METRIC_WINDOWS, "kind = 'window'")
        .groupBy("aggregation")
        .agg(F.max("closed_through").alias("c"))
        .collect()
    }
    unknown = sorted(set(stats) - set(by_name))
    if unknown:
        record.add(**{f"{name}.unconfigured_panes": stats[name]["n"] for name in unknown})
    outs = []
    for name, s in stats.items():
        agg = by_name.get(name)
        if agg is None:
            continue
        mine = new.where(F.col("aggregation") == name)
        if agg.raw:
            outs.append(raw_rows(mine))
            continue
        prev = closed.get(name)
        through = closes_through(prev, s["watermark"])
        panes = batch.read(SILVER_METRIC_PANES, f"aggregation = '{name}' AND run <= {s['run']}")
        if prev is not None:
            panes = panes.where(panes_after(prev, agg))
        outs.append(close_windows(agg, mine, panes, prev, through))
    n_in = sum(int(s["n"]) for s in stats.values())
    record.rows(rows_in=n_in)
    record.add(pane_rows=n_in)
    return record.cache(window_rows(outs)) if outs else batch.empty(GOLD_METRIC_WINDOWS)


def windows_figures(rows: DataFrame, aggs: Sequence[AggregationSettings], record: FlowRecord) -> None:
    # One row per kind of window row: figures, not rows.
    kinds = {r["kind"]: int(r["n"]) for r in rows.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
    record.add(**{f"{k}_rows": v for k, v in kinds.items()})
    record.rows(rows_out=sum(kinds.values()))
    record.say(
        f"gold/metric_windows: {kinds.get('window', 0):,} closed windows, "
        f"{kinds.get('late', 0):,} late rows, {kinds.get('raw', 0):,} raw rows"
    )
