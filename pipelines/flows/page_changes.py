"""Silver page changes: bronze page changes -> one change per page per window, in order, each
change once (the rules are :mod:`silver.page_changes`; the state and outbox are the runner's)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from pipelines.config.sections import PageChangeSettings
from pipelines.config.settings import Settings
from pipelines.runtime.flow_types import FlowRecord, StateBatch, StateRules, StateStep
from pipelines.runtime.tables import SILVER_PAGE_CHANGES
from silver.dedup import LANDING_ORDER, first_copies, mark_repeats, recent_identities
from silver.page_changes import (
    EVENT_COLUMNS,
    SILVER_PAGE_CHANGES_COLUMNS,
    dedup_run,
    event_clock,
    next_state,
    state_before,
    state_events,
    state_last_emitted,
    state_progress,
    window_counts,
)


def page_changes_done(state: DataFrame) -> int | None:
    """The bronze version the page-change state has processed (its one progress row)."""
    progress = state.transform(state_progress).first()
    return progress["bronze_version"] if progress else None


#: How the runner keeps silver/page_changes' state: open-window events, the last change emitted
#: per page and the progress, replaced each run with the run's output rows (its outbox).
PAGE_CHANGE_STATE = StateRules(page_changes_done, state_events, "emit", SILVER_PAGE_CHANGES_COLUMNS)


@dataclass(frozen=True)
class PageChangeConfig:
    """silver.page_changes' rules and the dedup horizon of exact repeats (``meta.id``; 0: off)."""

    rules: PageChangeSettings
    horizon: timedelta


def page_change_config(settings: Settings) -> PageChangeConfig:
    return PageChangeConfig(settings.page_changes, settings.silver.dedup_horizon)


def page_change_rules(config: PageChangeConfig) -> dict[str, Any]:
    """The settings silver's page changes depend on, as its event-log rows record them (a run's and
    a backfill's): what ``medallion backfill silver`` compares to say which changed."""
    r = config.rules
    return {
        "window": str(r.window),
        "mode": r.mode,
        "allowed_lateness": str(r.allowed_lateness),
        "dedup_horizon": str(config.horizon),
    }


#: A page change's identity: its ``meta.id``, the same on every copy of one change.
META_ID = ("meta_id",)


def new_page_changes(new: DataFrame, buffered: DataFrame, horizon: timedelta) -> tuple[DataFrame, int, datetime | None]:
    """The batch's page changes without exact repeats (a ``meta.id`` landed before, in the batch or
    buffered, within ``horizon``; 0: off), how many came in, and the newest event time among them.

    The two figures come from the batch's event times alone (a query that reads one column); how
    many repeats were dropped is what the run's own counts leave over (:func:`page_changes`), so no
    query marks the repeats but the run's."""
    totals = new.agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).first()  # one row
    n_in, batch_max = (int(totals["n"]), totals["t"]) if totals is not None else (0, None)
    if horizon:
        seen = recent_identities(buffered, META_ID)
        new = first_copies(new.transform(mark_repeats(seen, horizon, order=LANDING_ORDER, identity=META_ID)))
    return new.select(*EVENT_COLUMNS), n_in, batch_max


def page_changes(batch: StateBatch, config: PageChangeConfig, record: FlowRecord) -> StateStep:
    """New bronze page changes and the state -> reordered, deduplicated page changes, window by
    window, and the next state (silver.page_changes).

    An exact repeat (a ``meta.id`` landed before it, in this batch or buffered in an open window,
    within the horizon) is dropped first and counted as ``duplicates_dropped``; a repeat of a change
    whose window is closed is older than what the page emitted, so the rules drop it as stale.
    """
    cfg, state = config.rules, batch.state
    before = state.transform(state_before).first()  # one row: figures
    max_seen = before["max_event_time"] if before else None
    held = int(before["buffered"]) if before else 0
    buffered = state.transform(state_events)
    n_in, batch_max, events = 0, None, buffered
    if batch.rows is not None:
        new, n_in, batch_max = new_page_changes(batch.rows, buffered, config.horizon)
        events = buffered.unionByName(new)
    max_seen, watermark = event_clock(max_seen, batch_max, cfg.allowed_lateness, batch.options.drain)
    result = dedup_run(events, state.transform(state_last_emitted), cfg.mode, cfg.window, watermark)
    # The marked events feed the figures, the outbox and the buffer: cached, and filled by the one
    # query of the run's figures.
    record.cache(result.windowed)
    counts = result.windowed.agg(*window_counts()).first()  # one row: figures
    assert counts is not None, "a global aggregate has one row"
    emitted = record.gate(SILVER_PAGE_CHANGES.key, record.cache(result.emitted))
    n_emitted = record.gated_rows(SILVER_PAGE_CHANGES.key)
    if n_emitted is None:  # no gate counted them: one count over the cache
        n_emitted = emitted.count()
    if config.horizon and batch.rows is not None:
        # The events the run windowed are the buffered ones and the batch's first copies; they end
        # in a closed window or in the next state's buffer, so what is missing is the repeats.
        record.add(duplicates_dropped=held + n_in - int(counts["closed"]) - int(counts["open"]))
    page_change_figures(record, n_in, n_emitted, counts, watermark, batch.options.drain)
    record.describe(json.dumps({"rules": page_change_rules(config)}))
    # The next state is computed by its write alone (no cache, no pass of its own): the write
    # counts its rows, recorded once it is done.
    state_rows = record.observe(
        STATE_ROWS, next_state(result.buffered, result.last_emitted, emitted, max_seen, batch.end), n=F.count("*")
    )

    def written(_: int) -> None:
        # After the write, the run's caches released: a figure the write did not give is left out
        # (counted again, it would read the state this run wrote).
        if (rows := record.observed(STATE_ROWS, query=False).get("n")) is not None:
            record.add(state_rows=int(rows))

    return StateStep(state_rows, published=written)


#: The observation of a page-change run's next state as its write reads it (:func:`page_changes`).
STATE_ROWS = "state_rows"


def page_change_figures(
    record: FlowRecord, n_in: int, n_emitted: int, counts: Row, watermark: datetime | None, drain: bool
) -> None:
    """A page-change run's figures and progress line, from the counts of its windowed events
    (``counts``: :func:`silver.page_changes.window_counts`) and the rows it emitted."""
    n_final, stale, buffered_events, open_windows = (int(counts[k]) for k in ("closed", "stale", "open", "windows"))
    record.rows(n_in, n_emitted)
    record.add(
        input_events=n_in,
        finalized_events=n_final,
        emitted=n_emitted,
        stale=stale,
        deduplicated=n_final - n_emitted - stale,
        open_windows=open_windows,
        buffered_events=buffered_events,
    )
    if watermark is not None:
        record.add(watermark_epoch_s=watermark.timestamp())
    record.say(
        f"silver/page_changes: {n_in:,} new, {n_final:,} in closed windows -> {n_emitted:,} emitted, "
        f"{stale:,} stale, {buffered_events:,} buffered in {open_windows:,} open window(s)"
        + (" (drained)" if drain else "")
    )
