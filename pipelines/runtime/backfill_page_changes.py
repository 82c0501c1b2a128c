"""``medallion backfill silver`` for page changes: the page-change windows of a range made again from
bronze under the settings in force (``page_changes.*``, ``silver.dedup_horizon``), with the changes
that landed after their window had closed (dropped as stale then) counted in.

What it does, in order, each step safe to repeat:

1. Silver's page changes catch up with bronze (a pass of ``silver.page_changes``), so its state
   has processed bronze up to the version it recorded (``B``) and its outbox is published.
2. Bronze as of ``B`` (changes landed after it are the next run's) gives the range's page changes
   again, page by page between edges no window of the page crosses
   (:mod:`silver.page_changes_backfill`). Silver's windows that open from the range's start to the
   latest end of a window that opens in it are replaced in one commit by those rows and the rows
   outside the edges as they were, guarded by ``silver.page_changes``' progress.

Killed at any point, the same command finishes it: step 2 makes the same rows again. A run of
``silver.page_changes`` in another process that publishes during step 2 fails the replace; the
backfill starts over a few times, then stops and says so. Nothing downstream reads page changes, so
the backfill goes on to nothing. Windows still open are the flow's: a range that reaches them is
refused, naming the latest end it can do.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.backfill import WindowRange, earliest_window, iso, window_range
from pipelines.errors import CommitConflictError, InputError
from pipelines.flows import flow_names
from pipelines.flows.page_changes import page_change_config, page_change_rules, page_changes_done
from pipelines.runtime import passes, quality
from pipelines.runtime.backfill import made_figures, previous_rules, ready, run_backfill
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.runner import Context, app_id
from pipelines.runtime.tables import BRONZE_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE, SILVER_PAGE_CHANGES
from pipelines.storage import AppTxn, TxnSnapshot
from silver.page_changes import KEY, STATE_KIND, WINDOW_END, WINDOW_START
from silver.page_changes_backfill import (
    ROW_KEY,
    between_edges,
    kept_rows,
    last_before,
    made_again,
    page_edges,
    replace_end,
)

JOB = "backfill.page_changes"
#: The progress the replace is guarded by (the flow's, on its output), and the backfill's own.
FLOW = app_id(flow_names.SILVER_PAGE_CHANGES, BRONZE_PAGE_CHANGES)
BACKFILL = f"medallion/{JOB}"


def backfill_page_changes(ctx: Context, start: datetime, end: datetime) -> RunRecord:
    """Make silver's page-change windows that open in gold's windows that start in [``start``,
    ``end``) again from bronze (see the module's docstring); the backfill's event-log record."""
    span = window_range(start, end, ctx.settings.gold.window)  # the range `backfill silver` takes
    return run_backfill(ctx, "page_changes", span, lambda record: _replace(ctx, span, record))


def _replace(ctx: Context, span: WindowRange, record: RunRecord) -> None:
    store, config = ctx.store, page_change_config(ctx.settings)
    rules = page_change_rules(config)
    record.details = json.dumps(span.bounds())
    previous = _can_replace(ctx, span, record)
    if previous is None:
        return
    snap, published, state, bronze_version = _caught_up(ctx)
    open_windows = state.where(F.col(STATE_KIND) == "event").select(*KEY, WINDOW_START)
    _check_closed(span, open_windows)
    seq = (snap.versions[BACKFILL] or 0) + 1
    # 2. The range's page changes again, from bronze as the flow's run had read it.
    silver = store.read_at(SILVER_PAGE_CHANGES, snap.table_version)
    first, end = span.first, span.end
    found = silver.where(span.holds(WINDOW_START)).transform(replace_end(first, end)).first()  # one value
    until = found["end"] if found else end
    # Every window that reaches into the range or opens in it up to the replace end: the pages'
    # edges, and the rows the replace holds. The frames read more than once are cached: a range's
    # rows, never the lake's.
    cached: list[DataFrame] = []

    def cache(df: DataFrame) -> DataFrame:
        cached.append(df.persist())
        return df

    try:
        near = cache(silver.where((F.col(WINDOW_END) > F.lit(first)) & (F.col(WINDOW_START) < F.lit(until))))
        edges = cache(near.transform(page_edges(first, end, open_windows)))
        changes = store.read_at(BRONZE_PAGE_CHANGES, bronze_version).where(
            (F.col("event_time") >= F.lit(first)) & (F.col("event_time") < F.lit(until))
        )
        between = cache(changes.transform(between_edges(edges, first, end)))
        emitted = last_before(silver.where(F.col(WINDOW_START) < F.lit(first)))
        cfg = config.rules
        rows = between.transform(made_again(emitted, cfg.mode, cfg.window, config.horizon))
        held = near.where(F.col(WINDOW_START) >= F.lit(first)).transform(kept_rows(edges))
        written = cache(rows.unionByName(held))
        passed = quality.gate(ctx, record, SILVER_PAGE_CHANGES.key, written, AppTxn(BACKFILL, seq))
        guard = [AppTxn(BACKFILL, seq), AppTxn(FLOW, published)]
        where = WindowRange(first, until, span.width).holds(WINDOW_START)
        version = store.replace(SILVER_PAGE_CHANGES, passed, where, guard, snap.table_version)
        n_bronze = between.count()  # the changes made again, from the cache
    finally:
        for df in cached:
            df.unpersist()
    replaced = (SILVER_PAGE_CHANGES, version, ROW_KEY, "page_changes")
    versions = {"bronze_version": bronze_version, "silver_version": version}
    made_figures(ctx, record, span, replaced, rules, previous, {"bronze_page_changes": n_bronze}, versions)
    ctx.say(f"backfill page changes {span}, windows to {iso(until)}: {summary(record.metrics)}")


def _caught_up(ctx: Context) -> tuple[TxnSnapshot, int, DataFrame, int]:
    """Step 1: a pass of the flow, so its state has processed bronze up to a version (``B``) and its
    outbox is in silver. Silver's snapshot (its version and progress), the flow's run number it
    records, the state as of then and ``B``; a :class:`CommitConflictError` where a run of the
    flow in another process is between its state's commit and its output's."""
    store = ctx.store
    passes.silver_page_changes(ctx)
    snap = store.txn_snapshot(SILVER_PAGE_CHANGES, [FLOW, BACKFILL])
    state_snap = store.txn_snapshot(SILVER_PAGE_CHANGE_STATE, [FLOW])
    published = snap.versions[FLOW]
    if published is None or state_snap.versions[FLOW] != published:
        raise CommitConflictError(f"a run of {flow_names.SILVER_PAGE_CHANGES} is between its state and its output")
    state = store.read_at(SILVER_PAGE_CHANGE_STATE, state_snap.table_version)
    bronze_version = page_changes_done(state)
    if bronze_version is None:
        raise CommitConflictError(f"{SILVER_PAGE_CHANGE_STATE.key} lost its progress while the backfill caught it up")
    return snap, published, state, bronze_version


def summary(metrics: dict[str, float]) -> str:
    """What a page-change backfill changed, in a line: its event-log figures."""
    n = {k: int(metrics.get(f"page_changes_{k}", 0)) for k in ("removed", "added", "unchanged")}
    return f"{n['removed']:,} page changes removed, {n['added']:,} added, {n['unchanged']:,} as they were"


def _check_closed(span: WindowRange, open_windows: DataFrame) -> None:
    """An :class:`InputError` where a window still open (the watermark has not passed its end) opens
    before the range's end: the flow emits it, so the range must end before it."""
    found = open_windows.agg(F.min(WINDOW_START).alias("t")).first()  # one value
    least = found["t"] if found else None
    if least is None:
        return
    latest = earliest_window(least, span.width)
    if latest is not None and latest < span.end:
        can = f"the latest --to it can do is {iso(latest)}" if latest > span.first else "none of it is closed yet"
        raise InputError(
            f"backfill silver {span}: {SILVER_PAGE_CHANGES.key} has windows still open from {iso(latest)} "
            f"(the watermark has not passed them; the flow emits them): {can}"
        )


def _can_replace(ctx: Context, span: WindowRange, record: RunRecord) -> dict[str, Any] | None:
    """The rules silver's page changes were last made under, if the range can be made again; None
    (said why in ``record``) where there is nothing to do; an :class:`InputError` where it must not be."""
    tables = (BRONZE_PAGE_CHANGES, SILVER_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE)
    nothing = "silver holds no page changes yet: a first `run silver` makes them"
    if not ready(
        ctx, record, span, "silver", tables, (SILVER_PAGE_CHANGES, FLOW), nothing, (BRONZE_PAGE_CHANGES, "event_time")
    ):
        return None
    return previous_rules(ctx, (JOB, flow_names.SILVER_PAGE_CHANGES))
