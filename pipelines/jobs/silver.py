"""Silver jobs: bronze events -> bucketed silver events; bronze page changes -> deduplicated, in order."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import quality
from pipelines.eventlog import RunRecord
from pipelines.incremental import Batch, FlowRecord
from pipelines.jobs.outbox import publish_outbox
from pipelines.runner import Context, after, app_id, run_job
from pipelines.storage import AppTxn
from pipelines.tables import (
    BRONZE_PAGE_CHANGES,
    SILVER_PAGE_CHANGE_STATE,
    SILVER_PAGE_CHANGES,
)
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
    """New bronze page changes -> reordered, deduplicated page changes, window by window.

    State (open-window events, last emitted per key, progress) lives in one table that each run
    replaces in one commit, together with the run's output rows (an outbox). The outbox is then
    appended to silver/page_changes under the same run number: a crash between the two commits is
    finished by the next run, and a crash before the first leaves everything as it was.
    """
    cfg = ctx.settings.page_changes
    app = app_id("silver.page_changes", BRONZE_PAGE_CHANGES)

    def publish() -> int:
        return publish_outbox(
            ctx, SILVER_PAGE_CHANGE_STATE, SILVER_PAGE_CHANGES, app, "emit", SILVER_PAGE_CHANGES_COLUMNS
        )

    def body(record: RunRecord) -> None:
        for spec in (SILVER_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE):
            ctx.store.ensure(spec)
        recovered = publish()
        if recovered:
            record.add(recovered_outbox_rows=recovered)
            ctx.say(f"silver/page_changes: published {recovered:,} rows a stopped run had left in its outbox")
        seq = ctx.store.txn_version(SILVER_PAGE_CHANGE_STATE, app) or 0
        state = ctx.store.read(SILVER_PAGE_CHANGE_STATE).persist()
        progress = state.transform(state_progress).first()
        done = progress["bronze_version"] if progress else None
        max_seen = progress["max_event_time"] if progress else None
        inc = after(ctx.store, BRONZE_PAGE_CHANGES, done, app)
        buffered = state.transform(state_events)
        if inc is None and not (drain and buffered.limit(1).count()):
            state.unpersist()
            record.noop("no new bronze page changes" + (" and nothing buffered" if drain else ""))
            return
        end = inc.end if inc else done
        new = inc.read(ctx.store).select(*EVENT_COLUMNS) if inc else None
        n_in, batch_max = 0, None
        if new is not None:
            seen = new.agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).first()
            n_in, batch_max = (int(seen["n"]), seen["t"]) if seen else (0, None)
        max_seen, watermark = event_clock(max_seen, batch_max, cfg.allowed_lateness, drain)
        events = buffered if new is None else buffered.unionByName(new)
        result = dedup_run(events, state.transform(state_last_emitted), cfg.mode, cfg.window, watermark)
        # Several actions read these; caching them keeps each step computed once.
        cached = [result.windowed.persist(), result.finalized.persist(), result.emitted.persist()]
        finalized = (
            result.finalized.groupBy()
            .agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("_stale").cast("int")).alias("stale"))
            .first()
        )
        emitted = quality.gate(ctx, record, SILVER_PAGE_CHANGES.key, result.emitted, AppTxn(app, seq + 1))
        open_events = result.buffered.persist()
        cached.append(open_events)
        new_state = next_state(open_events, result.last_emitted, emitted, max_seen, end)
        # The run's figures, computed on the cached steps before the state they read is replaced.
        n_emitted = emitted.count()
        buffered_events = open_events.count()
        open_windows = open_events.select("wiki_id", "page_id", "window_start").distinct().count()
        n_key_rows = result.last_emitted.count()
        ctx.store.overwrite(SILVER_PAGE_CHANGE_STATE, new_state, [AppTxn(app, seq + 1)])
        state.unpersist()
        for df in cached:
            df.unpersist()
        publish()
        n_final = int(finalized["n"] or 0) if finalized else 0
        stale = int(finalized["stale"] or 0) if finalized else 0
        record.rows_in, record.rows_out = n_in, n_emitted
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
        ctx.say(
            f"silver/page_changes: {n_in:,} new, {n_final:,} in closed windows -> {n_emitted:,} emitted, "
            f"{stale:,} stale, {buffered_events:,} buffered in {open_windows:,} open window(s)"
            + (" (drained)" if drain else "")
        )

    return run_job(ctx, "silver.page_changes", body)
