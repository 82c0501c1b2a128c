"""``medallion backfill silver``: the events of a range made again from bronze under the settings in
force (a changed deduplication horizon, a changed bucket mapping), then the same range counted
again in gold and ClickHouse corrected, exactly once.

What it does, in order, each step safe to repeat:

1. Silver catches up with bronze (a pass of ``silver.events``), so silver holds every event bronze
   held up to the version that run recorded (``B``).
2. Bronze as of ``B`` (rows landed after it are the next run's) gives the range's events again
   (:func:`silver.backfill.events_again`); silver's rows of the range are replaced by them in one
   commit, guarded by ``silver.events``' progress. A replace's rows did not arrive: the flows that
   read silver's new rows (gold's stage 1, the counters) leave them out
   (:meth:`~pipelines.storage.TableStore.read_inserted`).
3. The range goes on to gold (:func:`pipelines.runtime.backfill.backfill_gold`): stage 1 catches up
   past the replace, the range is counted again from silver as the replace left it, and
   ClickHouse is corrected through the outbox.

Killed at any point, the same command finishes it: step 2 makes the same rows again, step 3
replaces what gold holds. A ``run all`` in another process that commits to silver during step 2
fails the replace; the backfill starts over a few times, then stops and says so.

Counters are not carried: they keep the events they counted (``docs/backfill.md``).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from gold.backfill import WindowRange, window_range
from pipelines.errors import CommitConflictError
from pipelines.flows import flow_names
from pipelines.flows.gold import counting_rules, gold_config
from pipelines.flows.silver import SilverConfig, silver_config, silver_rules
from pipelines.runtime import passes, quality
from pipelines.runtime.backfill import (
    backfill_gold,
    counted_under,
    has_counted,
    made_figures,
    previous_rules,
    ready,
    run_backfill,
)
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.runner import Context, app_id
from pipelines.runtime.tables import BRONZE_EVENTS, GOLD_PARTIALS, GOLD_PROPERTY_VALUES, SILVER_EVENTS
from pipelines.storage import AppTxn
from silver.backfill import ROW_KEY, events_again

JOB = "backfill.silver"
#: The progress silver's replace is guarded by, and the backfill's own (numbered runs).
SILVER_FLOW = app_id(flow_names.SILVER_EVENTS, BRONZE_EVENTS)
BACKFILL = f"medallion/{JOB}"


def backfill_silver(ctx: Context, start: datetime, end: datetime) -> list[RunRecord]:
    """Make silver's events of gold's windows that start in [``start``, ``end``) again from bronze,
    then count those windows again in gold (see the module's docstring); the event-log records:
    silver's backfill, then gold's where it ran."""
    span = window_range(start, end, ctx.settings.gold.window)  # gold's windows: the range goes on whole
    config = silver_config(ctx.settings)

    record = run_backfill(ctx, "silver", span, lambda record: _replace(ctx, config, span, record))
    if record.status != "ok":
        return [record]
    ctx.say(f"backfill: carrying {span} on to gold")
    return [record, backfill_gold(ctx, span.first, span.end)]


def _replace(ctx: Context, config: SilverConfig, span: WindowRange, record: RunRecord) -> None:
    store = ctx.store
    rules = silver_rules(config)
    record.details = json.dumps(span.bounds())
    previous = _can_replace(ctx, span, record)
    if previous is None:
        return
    # 1. Silver caught up: it holds every event bronze held up to the version its run recorded.
    passes.silver_events(ctx)
    snap = store.txn_snapshot(SILVER_EVENTS, [SILVER_FLOW, BACKFILL])
    bronze_version = snap.versions[SILVER_FLOW]
    if bronze_version is None:
        raise CommitConflictError(f"{SILVER_EVENTS.key} lost its progress while the backfill caught it up")
    seq = (snap.versions[BACKFILL] or 0) + 1
    # 2. The range's events again, from bronze as silver's run had read it.
    rows = store.read_at(BRONZE_EVENTS, bronze_version).where(span.holds("timestamp"))
    held = None
    if config.horizon:  # what silver keeps before the range, within the horizon, is left as it is
        held = store.read_at(SILVER_EVENTS, snap.table_version).where(_before(span, config.horizon))
    # Cached: the gate counts the events, the replace writes them (a range's, not a lake's).
    events = rows.transform(events_again(config.mapping, config.horizon, held)).persist()
    try:
        passed = quality.gate(ctx, record, SILVER_EVENTS.key, events, AppTxn(BACKFILL, seq))
        guard = [AppTxn(BACKFILL, seq), AppTxn(SILVER_FLOW, bronze_version)]
        version = store.replace(SILVER_EVENTS, passed, span.holds("event_time"), guard, snap.table_version)
    finally:
        events.unpersist()
    # A count of the range's bronze rows, from the files their event times may be in (an observation
    # of them is never filled where Spark plans an empty range away).
    read = {"bronze_events": rows.count()}
    versions = {"bronze_version": bronze_version, "silver_version": version}
    made_figures(ctx, record, span, (SILVER_EVENTS, version, ROW_KEY, "events"), rules, previous, read, versions)
    ctx.say(f"backfill silver {span}: {summary(record.metrics)}")


def summary(metrics: dict[str, float]) -> str:
    """What a silver backfill changed, in a line: its event-log figures."""
    n = {k: int(metrics.get(f"events_{k}", 0)) for k in ("removed", "added", "unchanged")}
    return f"{n['removed']:,} events removed, {n['added']:,} added, {n['unchanged']:,} as they were"


def _before(span: WindowRange, horizon: timedelta) -> str:
    """SQL text true for silver's rows in the horizon before the range."""
    return WindowRange(span.first - horizon, span.first, span.width).holds("event_time")


def _can_replace(ctx: Context, span: WindowRange, record: RunRecord) -> dict[str, Any] | None:
    """The rules silver's events were last made under, if the range can be made again; None (said
    why in ``record``) where there is nothing to do; an :class:`InputError` where it must not be."""
    nothing = "silver holds nothing yet: a first `run silver` makes every event"
    made, held = (SILVER_EVENTS, SILVER_FLOW), (BRONZE_EVENTS, "timestamp")
    if not ready(ctx, record, span, "silver", (BRONZE_EVENTS, SILVER_EVENTS), made, nothing, held):
        return None
    # The range goes on to gold: what gold's backfill would refuse (a lake counted per bucket, a
    # changed gold.window) is refused before silver changes.
    for spec in (GOLD_PARTIALS, GOLD_PROPERTY_VALUES):
        ctx.store.ensure(spec)
    has_counted(ctx)
    counted_under(ctx, span, counting_rules(gold_config(ctx.settings)))
    return previous_rules(ctx, (JOB, flow_names.SILVER_EVENTS))
