"""Silver jobs: bronze events -> bucketed silver events; bronze page changes -> deduplicated, in order."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.eventlog import RunRecord
from pipelines.incremental import Batch, FlowRecord, StateBatch, StateRules, StateStep
from pipelines.runner import Context
from pipelines.setting_sections import PageChangeSettings
from pipelines.tables import SILVER_PAGE_CHANGES
from silver.buckets import BucketMapping, in_buckets
from silver.events import to_silver_events
from silver.page_changes import (
    EVENT_COLUMNS,
    SILVER_PAGE_CHANGES_COLUMNS,
    dedup_run,
    event_clock,
    next_state,
    state_events,
    state_last_emitted,
    state_progress,
)


def events(batch: Batch, mapping: BucketMapping, record: FlowRecord) -> DataFrame:
    """New bronze events -> silver events with their team bucket (this run's buckets only).

    Not cached: the gate's checks and the figures read the event columns only, so Spark leaves the
    property parse out of them and re-reads those columns from bronze; the documents are parsed
    once, by the write. (Caching the batch cost more than the parse it saved: the cache holds
    every parsed document.)
    """
    return batch.rows.transform(to_silver_events(mapping)).transform(in_buckets(batch.buckets))


def events_figures(out: DataFrame, mapping: BucketMapping, record: FlowRecord) -> None:
    # One row per bucket: the batch's figures, not its rows.
    per_bucket = out.groupBy("bucket").agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).collect()
    n_out = sum(int(r["n"]) for r in per_bucket)
    record.rows(n_out, n_out)
    record.add(**{f"bucket.{r['bucket']}.events": int(r["n"]) for r in per_bucket})
    # Lag: how far behind now the newest event of each bucket in this batch is.
    now = datetime.now(UTC).timestamp()
    record.add(
        **{
            f"bucket.{r['bucket']}.lag_seconds": round(now - r["t"].timestamp(), 3)
            for r in per_bucket
            if r["t"] is not None
        }
    )
    record.say(f"silver/events: {n_out:,} events in {len(per_bucket)} bucket(s)")


def silver_events(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    """silver.events once, as ``medallion run silver.events`` runs it."""
    from pipelines.flows import RunOptions, flow

    return flow("silver.events").execute(ctx, RunOptions(buckets=buckets))


def silver_page_changes(ctx: Context, drain: bool = False) -> RunRecord:
    """silver.page_changes once, as ``medallion run silver.page_changes`` runs it."""
    from pipelines.flows import RunOptions, flow

    return flow("silver.page_changes").execute(ctx, RunOptions(drain=drain))


def page_changes_done(state: DataFrame) -> int | None:
    """The bronze version the page-change state has processed (its one progress row)."""
    progress = state.transform(state_progress).first()
    return progress["bronze_version"] if progress else None


#: How the runner keeps silver/page_changes' state: open-window events, the last change emitted
#: per page and the progress, replaced each run with the run's output rows (its outbox).
PAGE_CHANGE_STATE = StateRules(page_changes_done, state_events, "emit", SILVER_PAGE_CHANGES_COLUMNS)


def page_changes(batch: StateBatch, cfg: PageChangeSettings, record: FlowRecord) -> StateStep:
    """New bronze page changes and the state -> reordered, deduplicated page changes, window by
    window, and the next state (silver.page_changes)."""
    state = batch.state
    progress = state.transform(state_progress).first()
    max_seen = progress["max_event_time"] if progress else None
    new = batch.rows.select(*EVENT_COLUMNS) if batch.rows is not None else None
    n_in, batch_max = 0, None
    if new is not None:
        seen = new.agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).first()
        n_in, batch_max = (int(seen["n"]), seen["t"]) if seen else (0, None)
    max_seen, watermark = event_clock(max_seen, batch_max, cfg.allowed_lateness, batch.drain)
    buffered = state.transform(state_events)
    events = buffered if new is None else buffered.unionByName(new)
    result = dedup_run(events, state.transform(state_last_emitted), cfg.mode, cfg.window, watermark)
    # Several actions read these; caching them keeps each step computed once.
    for df in (result.windowed, result.finalized):
        record.cache(df)
    finalized = (
        result.finalized.groupBy()
        .agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("_stale").cast("int")).alias("stale"))
        .first()
    )
    emitted = record.gate(SILVER_PAGE_CHANGES.key, record.cache(result.emitted))
    open_events = record.cache(result.buffered)
    # The run's figures, computed on the cached steps before the state they read is replaced.
    n_emitted = emitted.count()
    buffered_events = open_events.count()
    open_windows = open_events.select("wiki_id", "page_id", "window_start").distinct().count()
    n_key_rows = result.last_emitted.count()
    n_final = int(finalized["n"] or 0) if finalized else 0
    stale = int(finalized["stale"] or 0) if finalized else 0
    record.rows(n_in, n_emitted)
    record.add(
        input_events=n_in,
        finalized_events=n_final,
        emitted=n_emitted,
        stale=stale,
        deduplicated=n_final - n_emitted - stale,
        open_windows=open_windows,
        buffered_events=buffered_events,
        state_rows=buffered_events + n_key_rows + n_emitted + 1,
    )
    if watermark is not None:
        record.add(watermark_epoch_s=watermark.timestamp())
    record.say(
        f"silver/page_changes: {n_in:,} new, {n_final:,} in closed windows -> {n_emitted:,} emitted, "
        f"{stale:,} stale, {buffered_events:,} buffered in {open_windows:,} open window(s)"
        + (" (drained)" if batch.drain else "")
    )
    return StateStep(next_state(open_events, result.last_emitted, emitted, max_seen, batch.end))
