"""Metric jobs: bronze samples -> final panes (silver) -> closed windows (gold)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.metric_windows import close_windows, closes_through, panes_after, raw_rows, window_rows
from pipelines.eventlog import RunRecord
from pipelines.jobs.outbox import publish_outbox
from pipelines.runner import Context, after, app_id, pending, run_job
from pipelines.storage import AppTxn
from pipelines.tables import BRONZE_SAMPLES, GOLD_METRIC_WINDOWS, SILVER_METRIC_PANES, SILVER_METRIC_STATE
from silver.metric_panes import (
    INPUT_COLUMNS,
    METRIC_PANE_COLUMNS,
    carried_state,
    next_state,
    pane_clock,
    pane_run,
    progress_row,
    select_samples,
    state_lasts,
    state_progress,
    state_samples,
)


def silver_metric_panes(ctx: Context, drain: bool = False) -> RunRecord:
    """New bronze samples -> final panes of every configured aggregation (see silver.metric_panes).

    State (samples of panes not final yet, each series' newest counted sample, per-aggregation
    largest sample time and dropped count, bronze progress) is one table replaced per run with the
    run's pane rows as its outbox, as silver/page_changes does.
    """
    aggs = ctx.settings.metrics.aggregations
    app = app_id("silver.metric_panes", BRONZE_SAMPLES)

    def body(record: RunRecord) -> None:
        if not aggs:
            record.noop("no metric aggregations configured (metrics.aggregations)")
            return
        for spec in (SILVER_METRIC_PANES, SILVER_METRIC_STATE, BRONZE_SAMPLES):
            ctx.store.ensure(spec)
        recovered = publish_outbox(ctx, SILVER_METRIC_STATE, SILVER_METRIC_PANES, app, "pane", METRIC_PANE_COLUMNS)
        if recovered:
            record.add(recovered_outbox_rows=recovered)
        seq = ctx.store.txn_version(SILVER_METRIC_STATE, app) or 0
        state = ctx.store.read(SILVER_METRIC_STATE, where="kind <> 'pane'").persist()
        # One progress row per aggregation (and one for bronze): the state's bookkeeping, not samples.
        progress = {r["aggregation"]: r for r in state.transform(state_progress).collect()}
        done = progress[None]["bronze_version"] if None in progress else None
        inc = after(ctx.store, BRONZE_SAMPLES, done, app)
        buffered = state.transform(state_samples)
        if inc is None and not (drain and buffered.limit(1).count()):
            state.unpersist()
            record.noop("no new samples" + (" and nothing buffered" if drain else ""))
            return
        end = inc.end if inc else done
        new = inc.read(ctx.store).select(*INPUT_COLUMNS) if inc else None
        if new is not None:
            new = new.persist()
        lasts = state.transform(state_lasts)
        panes, keep, new_lasts, progress_rows = [], [], [], []
        kept_cached: list[DataFrame] = []  # each aggregation's samples, cached until the state is written
        n_in = 0
        for agg in aggs:
            mine = select_samples(new, agg).persist() if new is not None else buffered.limit(0)
            seen = mine.agg(F.count(F.lit(1)).alias("n"), F.max("timestamp").alias("t")).first()
            n_new = int(seen["n"]) if seen else 0
            prev = progress.get(agg.name)
            clock = pane_clock(agg, prev["max_seen"] if prev else None, seen["t"] if seen else None, drain)
            step = pane_run(
                agg,
                mine,
                buffered.where(F.col("aggregation") == agg.name),
                lasts.where(F.col("aggregation") == agg.name),
                clock.previous,
                clock.closes,
                seq + 1,
                close_all=drain,
            )
            n_late = step.late.count() if clock.previous is not None else 0
            panes.append(step.panes)
            keep.append(step.buffered)
            new_lasts.append(step.lasts)
            progress_rows.append(progress_row(agg, clock, prev["dropped"] if prev else None, n_late))
            n_in += n_new
            record.add(**{f"{agg.name}.samples": n_new, f"{agg.name}.late_{agg.late}": n_late})
            if clock.watermark is not None:
                record.add(**{f"{agg.name}.watermark_epoch_s": clock.watermark.timestamp()})
            kept_cached.append(mine)
        rest = carried_state(keep, new_lasts).persist()
        new_state = next_state(rest, panes, progress_rows, end)
        # One row per kind: figures of the cached rest, taken before the state it reads is replaced.
        counts = {r["kind"]: int(r["n"]) for r in rest.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
        ctx.store.overwrite(SILVER_METRIC_STATE, new_state, [AppTxn(app, seq + 1)])
        for df in (rest, state, *kept_cached, *([new] if new is not None else [])):
            df.unpersist()
        published = publish_outbox(ctx, SILVER_METRIC_STATE, SILVER_METRIC_PANES, app, "pane", METRIC_PANE_COLUMNS)
        record.rows_in, record.rows_out = n_in, published
        record.add(
            input_samples=n_in,
            panes=published,
            buffered_samples=counts.get("sample", 0),
            series_tracked=counts.get("last", 0),
            # The aggregations' progress rows and the bronze one.
            state_rows=sum(counts.values()) + published + len(progress_rows) + 1,
        )
        ctx.say(
            f"silver/metric_panes: {n_in:,} samples -> {published:,} final pane rows, "
            f"{counts.get('sample', 0):,} samples in open panes" + (" (drained)" if drain else "")
        )

    return run_job(ctx, "silver.metric_panes", body)


def gold_metric_windows(ctx: Context) -> RunRecord:
    """New final panes -> windows the watermark has closed, late rows for windows already closed."""
    aggs = {a.name: a for a in ctx.settings.metrics.aggregations}

    def body(record: RunRecord) -> None:
        ctx.store.ensure(GOLD_METRIC_WINDOWS)
        inc = pending(
            ctx.store, SILVER_METRIC_PANES, GOLD_METRIC_WINDOWS, app_id("gold.metric_windows", SILVER_METRIC_PANES)
        )
        if inc is None:
            record.noop("no new panes")
            return
        new = inc.read(ctx.store).persist()
        # Per aggregation: its newest watermark and run, and how far windows are closed (one row each).
        stats = {
            r["aggregation"]: r
            for r in new.groupBy("aggregation")
            .agg(F.max("watermark").alias("watermark"), F.max("run").alias("run"), F.count(F.lit(1)).alias("n"))
            .collect()
        }
        closed = {
            r["aggregation"]: r["c"]
            for r in ctx.store.read(GOLD_METRIC_WINDOWS, where="kind = 'window'")
            .groupBy("aggregation")
            .agg(F.max("closed_through").alias("c"))
            .collect()
        }
        unknown = sorted(set(stats) - set(aggs))
        if unknown:
            record.add(**{f"{name}.unconfigured_panes": stats[name]["n"] for name in unknown})
        outs = []
        for name, s in stats.items():
            agg = aggs.get(name)
            if agg is None:
                continue
            mine = new.where(F.col("aggregation") == name)
            if agg.raw:
                outs.append(raw_rows(mine))
                continue
            prev = closed.get(name)
            through = closes_through(prev, s["watermark"])
            panes = ctx.store.read(SILVER_METRIC_PANES, where=f"aggregation = '{name}' AND run <= {s['run']}")
            if prev is not None:
                panes = panes.where(panes_after(prev, agg))
            outs.append(close_windows(agg, mine, panes, prev, through))
        rows = window_rows(outs).persist() if outs else ctx.spark.createDataFrame([], GOLD_METRIC_WINDOWS.schema)
        ctx.store.append(GOLD_METRIC_WINDOWS, rows, [inc.txn])
        # One row per kind of window row: figures, not rows.
        kinds = {r["kind"]: int(r["n"]) for r in rows.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
        rows.unpersist()
        new.unpersist()
        record.rows_in = sum(int(s["n"]) for s in stats.values())
        record.rows_out = sum(kinds.values())
        record.add(pane_rows=record.rows_in, **{f"{k}_rows": v for k, v in kinds.items()})
        ctx.say(
            f"gold/metric_windows: {record.rows_in:,} pane rows -> {kinds.get('window', 0):,} closed windows, "
            f"{kinds.get('late', 0):,} late rows, {kinds.get('raw', 0):,} raw rows"
        )

    return run_job(ctx, "gold.metric_windows", body)
