"""``medallion backfill gold``: the windows of a range counted again from silver, under the settings
in force, and ClickHouse corrected, exactly once.

What a backfill does, in order, each step safe to repeat:

1. Both stages catch up (a pass of ``gold.partials``, then of ``gold.merge``), so every partial
   gold holds came from silver up to the version stage 1 recorded (``S``), and no partial waits;
   ``S`` is past a silver backfill's replace, whose rows stage 1 leaves to this recount.
2. Silver as of ``S`` (time travel: rows landed after ``S`` are stage 1's to count, later) is fanned
   out again for the range's events; the partials of the range are replaced by those counts, their
   batches marked as a backfill's (:func:`gold.backfill.marked`: stage 2 never adds them).
3. Gold's rows of the range are replaced by the sums of those partials, and stage 2's progress
   moves past them in the same commit (it never adds them; a crash before leaves them to step 1,
   which skips them too, and to the same command run again).
4. The export runs as always: the change feed of step 3 shows each changed and removed tuple of
   the windows ClickHouse holds, and their corrections go out once through the outbox.

Each replace is one commit, guarded by the progress it was computed from: stage 1's on the
partials (recorded again at the version read) and stage 2's on gold (moved on). A ``run all`` in
another process that commits progress in between fails the commit (:class:`CommitConflictError`);
the backfill then starts over from step 1 (a few times, waiting longer each time) or stops and
says so: nothing is counted twice, nothing is lost. Killed at any point, the same command
finishes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Observation
from pyspark.sql import functions as F

from gold.backfill import WindowRange, earliest_window, iso, marked, replaced_figures, window_range
from gold.property_values import COUNTED, SKIP_REASONS, counted_partials, merge_source, skip_figures, tuple_counts
from pipelines.errors import CommitConflictError, InputError
from pipelines.flows import flow_names
from pipelines.flows.gold import GoldConfig, counting_rules, gold_config
from pipelines.runtime import passes, quality
from pipelines.runtime.eventlog import PIPELINE_EVENTS, RunRecord
from pipelines.runtime.runner import Context, app_id, run_job
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES, SILVER_EVENTS
from pipelines.storage import AppTxn, TableSpec
from silver.backfill import replaced_rows

JOB = "backfill.gold"
#: The progress each replace is guarded by, and the backfill's own (numbered runs).
STAGE_1 = app_id(flow_names.GOLD_PARTIALS, SILVER_EVENTS)
STAGE_2 = app_id(flow_names.GOLD_MERGE, GOLD_PARTIALS)
BACKFILL = f"medallion/{JOB}"


def backfill_gold(ctx: Context, start: datetime, end: datetime) -> RunRecord:
    """Recount gold's windows that start in [``start``, ``end``) (see the module's docstring); the
    backfill's event-log record (its range, the rules it counted under and how they differ from those
    gold last counted under, the tuples it added, removed and changed)."""
    config = gold_config(ctx.settings)
    span = window_range(start, end, config.window)

    record = run_backfill(ctx, "gold", span, lambda record: _recount(ctx, config, span, record))
    if record.status == "ok":
        ctx.say(f"backfill: exporting the corrections of {span}")
        passes.export_property_values(ctx)
    return record


def run_backfill(ctx: Context, layer: str, span: WindowRange, body: Callable[[RunRecord], None]) -> RunRecord:
    """``body`` run as ``backfill.<layer>`` (:func:`~pipelines.runtime.runner.run_job`: its
    conflict retries and event-log row); a :class:`CommitConflictError` that says what to do where
    another run kept committing through every retry."""
    try:
        return run_job(ctx, f"backfill.{layer}", body)
    except CommitConflictError as exc:
        raise CommitConflictError(
            f"backfill {layer} {span}: another run kept committing to {layer} while the backfill ran, so it "
            f"stopped; nothing was counted twice: run it again once that run is idle ({exc})"
        ) from exc


def describe(record: RunRecord, span: WindowRange, rules: dict[str, Any], previous: dict[str, Any]) -> None:
    """A backfill's details in its event-log row: its range, the ``rules`` it ran under and those
    that differ from ``previous``, the rules the table was last made under (empty: not known)."""
    changed = {k: [previous.get(k), v] for k, v in rules.items() if previous and previous.get(k) != v}
    record.details = json.dumps(
        {
            **span.bounds(),
            "rules": rules,
            "changed": changed if previous else "not known: no earlier run recorded its rules",
        },
        default=str,
    )


def _recount(ctx: Context, config: GoldConfig, span: WindowRange, record: RunRecord) -> None:
    store = ctx.store
    rules = counting_rules(config)
    record.details = json.dumps(span.bounds())
    previous = _can_recount(ctx, span, rules, record)
    if previous is None:
        return
    # 1. Both stages caught up: what gold holds is what stage 1 counted, up to its silver version
    # (past a silver backfill's replace, whose rows stage 1 leaves to this recount).
    passes.gold_partials(ctx)
    passes.gold_merge(ctx)
    parts = store.txn_snapshot(GOLD_PARTIALS, [STAGE_1])
    gold = store.txn_snapshot(GOLD_PROPERTY_VALUES, [STAGE_2])
    silver_version = parts.versions[STAGE_1]
    if silver_version is None or gold.versions[STAGE_2] != parts.table_version:
        raise CommitConflictError("stage 1 committed partials while the backfill caught stage 2 up")
    seq = (store.txn_version(GOLD_PARTIALS, BACKFILL) or 0) + 1
    # 2. The range's partials, counted again from silver as stage 1 had read it.
    events = store.read_at(SILVER_EVENTS, silver_version).where(span.holds("event_time"))
    events = config.teams.counted(events)
    counts = events.transform(tuple_counts(config.rules, config.window, config.notation))
    tuples = Observation("backfill.tuples")  # counted and skipped per reason, as the partials are made
    counts = counts.observe(tuples, *(c.alias(k) for k, c in skip_figures().items()))
    # Cached: the gate counts the partials, the replace writes them (a backfill's range, not a lake).
    partials = marked(counts.transform(counted_partials(F.lit(datetime.now(UTC))))).persist()
    try:
        passed = quality.gate(ctx, record, GOLD_PARTIALS.key, partials, AppTxn(BACKFILL, seq))
        guard = [AppTxn(BACKFILL, seq), AppTxn(STAGE_1, silver_version)]
        parts_version = store.replace(GOLD_PARTIALS, passed, span.holds(), guard, parts.table_version)
    finally:
        partials.unpersist()
    # 3. Gold's rows of the range: the sums of those partials.
    # As the replace left them: partials stage 1 commits since are stage 2's to add.
    sums = store.read_at(GOLD_PARTIALS, parts_version).where(span.holds())
    sums = sums.repartition("bucket").transform(merge_source())
    sums = quality.gate(ctx, record, GOLD_PROPERTY_VALUES.key, sums, AppTxn(BACKFILL, seq))
    # Stage 2's progress moves past the backfill's partials: the backfill added them to gold itself.
    # Recorded through the version read, so a stage 2 that committed since fails the replace.
    _stage_2_at(ctx, gold.versions[STAGE_2])  # not moved since the snapshot
    merged = AppTxn(STAGE_2, parts_version)
    gold_version = store.replace(GOLD_PROPERTY_VALUES, sums, span.holds(), [merged], gold.table_version)
    _stage_2_at(ctx, parts_version)  # where the replace put it (not a write Delta skipped as done)
    versions = {"silver_version": silver_version, "partials_version": parts_version, "gold_version": gold_version}
    _figures(ctx, record, span, rules, previous, tuples.get or {}, versions)


def _stage_2_at(ctx: Context, version: int | None) -> None:
    """:class:`CommitConflictError` unless stage 2's progress in gold is at ``version``."""
    if ctx.store.txn_version(GOLD_PROPERTY_VALUES, STAGE_2) != version:
        raise CommitConflictError(f"stage 2 recorded progress in {GOLD_PROPERTY_VALUES.key} during the backfill")


def summary(metrics: dict[str, float]) -> str:
    """What a backfill changed, in a line: its event-log figures."""
    n = {k: int(metrics.get(f"tuples_{k}", 0)) for k in ("changed", "removed", "added", "unchanged")}
    changed = f"{n['changed']:,} tuples changed, {n['removed']:,} removed, {n['added']:,} added"
    return f"{changed}, {n['unchanged']:,} as they were"


def _can_recount(ctx: Context, span: WindowRange, rules: dict[str, Any], record: RunRecord) -> dict[str, Any] | None:
    """The rules gold last counted under, if the range can be recounted; None (said why in
    ``record``) where there is nothing to do; an :class:`InputError` where it must not be done."""
    tables = (SILVER_EVENTS, GOLD_PARTIALS, GOLD_PROPERTY_VALUES)
    made, nothing = (GOLD_PARTIALS, STAGE_1), "gold has counted nothing yet: a first `run gold` counts every window"
    if not ready(ctx, record, span, "gold", tables, made, nothing, (SILVER_EVENTS, "event_time")):
        return None
    return counted_under(ctx, span, rules)


def ready(
    ctx: Context,
    record: RunRecord,
    span: WindowRange,
    layer: str,
    tables: Sequence[TableSpec],
    made: tuple[TableSpec, str],
    nothing: str,
    held: tuple[TableSpec, str],
) -> bool:
    """Whether a backfill of ``layer`` has a range to make again, its ``tables`` ensured: False (a
    no-op, said why in ``record``) where no window starts in ``span`` or the flow ``made`` names
    (the table it writes, its app id) has written nothing yet (``nothing``); an
    :class:`InputError` where that flow writes per bucket, or where the range starts before what
    ``held`` (the table read again, its event-time column) holds."""
    if not span.windows:
        record.noop(f"no window starts in {span}")
        return False
    for spec in tables:
        ctx.store.ensure(spec)
    if not has_made(ctx, layer, *made):
        record.noop(nothing)
        return False
    check_held(ctx, layer, span, *held)
    return True


def made_figures(
    ctx: Context,
    record: RunRecord,
    span: WindowRange,
    replaced: tuple[TableSpec, int, Sequence[str], str],
    rules: dict[str, Any],
    previous: dict[str, Any],
    read: dict[str, int],
    versions: dict[str, int],
) -> None:
    """A silver backfill's figures and details in its event-log record: the rows its replace
    (``replaced``: the table, the version, what tells its rows apart and their unit) removed,
    added and wrote again as they were, from the replace's change feed; the bronze rows it
    ``read``; the ``versions`` it read and wrote; its range and rules."""
    spec, version, key, unit = replaced
    found = ctx.store.read_changes(spec, version, version).transform(replaced_rows(key, unit)).first()  # one row
    figures = found.asDict() if found else {}
    record.add(windows=span.windows, **read, **figures)
    record.add(**versions)
    describe(record, span, rules, previous)
    record.rows_in = sum(read.values())
    record.rows_out = int(figures.get(f"{unit}_added", 0)) + int(figures.get(f"{unit}_unchanged", 0))


def has_counted(ctx: Context) -> bool:
    """Whether gold's stage 1 has counted (its tables ensured); an :class:`InputError` where it
    counted per bucket, which backfills do not recount (:func:`has_made`)."""
    return has_made(ctx, "gold", GOLD_PARTIALS, STAGE_1)


def has_made(ctx: Context, layer: str, spec: TableSpec, app: str) -> bool:
    """Whether the flow ``app`` has written ``spec`` (ensured) over every bucket; an
    :class:`InputError` where it wrote it per bucket (`--bucket`: a progress per bucket set, none
    under ``app``), which backfills do not do."""
    if ctx.store.txn_version(spec, app) is not None:
        return True
    if ctx.store.stats(spec).rows:
        raise InputError(
            f"backfill {layer}: this lake runs {layer} per bucket (`--bucket`), which backfills do not do yet"
        )
    return False


def check_held(ctx: Context, layer: str, span: WindowRange, source: TableSpec, column: str) -> None:
    """An :class:`InputError` where ``span`` starts before the earliest window ``source`` (what a
    backfill of ``layer`` reads again) holds events of, by ``column``: naming the earliest start."""
    earliest = earliest_window(ctx.store.least(source, column), span.width)
    if earliest is None or span.first < earliest:
        at = "nothing" if earliest is None else f"windows from {iso(earliest)}"
        raise InputError(
            f"backfill {layer} {span}: {source.key} holds {at}, so windows before it would lose their counts; "
            + ("" if earliest is None else f"the earliest start it can do is {iso(earliest)}")
        )


def counted_under(ctx: Context, span: WindowRange, rules: dict[str, Any]) -> dict[str, Any]:
    """The rules gold last counted under (:func:`previous_rules`); an :class:`InputError` where
    ``gold.window`` (in ``rules``, those in force) is not the width it counted in."""
    previous = previous_rules(ctx, (JOB, flow_names.GOLD_PARTIALS))
    if previous.get("window") not in (None, rules["window"]):
        raise InputError(
            f"backfill gold {span}: gold.window is {rules['window']} but gold counted in windows of "
            f"{previous['window']}: a range would hold windows of both widths and count events twice; "
            "set gold.window back, or count a new lake"
        )
    return previous


def _figures(
    ctx: Context,
    record: RunRecord,
    span: WindowRange,
    rules: dict[str, Any],
    previous: dict[str, Any],
    observed: dict[str, Any],
    versions: dict[str, int],
) -> None:
    """The backfill's figures and details in its event-log record: ``observed``, the tuples counted
    and skipped per reason; ``versions``, what it read and wrote."""
    gold_version = versions["gold_version"]
    changes = ctx.store.read_changes(GOLD_PROPERTY_VALUES, gold_version, gold_version)
    found = changes.transform(replaced_figures()).first()  # one row of figures
    replaced = found.asDict() if found else {}
    skipped = {f"skipped.{r}": int(observed.get(r) or 0) for r in SKIP_REASONS if observed.get(r)}
    record.add(windows=span.windows, tuples=int(observed.get(COUNTED) or 0), **replaced, **skipped)
    record.add(**versions)
    describe(record, span, rules, previous)
    record.rows_in = int(observed.get(COUNTED) or 0)
    record.rows_out = int(replaced.get("tuples_added", 0)) + int(replaced.get("tuples_changed", 0))
    ctx.say(f"backfill gold {span}: {summary(record.metrics)}")


def previous_rules(ctx: Context, jobs: Sequence[str]) -> dict[str, Any]:
    """The rules a table was last made under, as the newest of ``jobs``' runs that recorded them
    did (a flow's and its backfill's; empty: none recorded any)."""
    if not ctx.store.exists(PIPELINE_EVENTS):
        return {}
    last = (
        ctx.store.read(PIPELINE_EVENTS)
        .where(F.col("job").isin(*jobs) & (F.col("status") == "ok"))
        .where(F.col("details").contains('"rules"'))
        # The newest to end: a backfill ends after the runs that land while it runs.
        .orderBy(F.col("ended_at").desc())
        .select("details")
        .first()  # one row: the newest such run's details
    )
    try:
        return dict(json.loads(last["details"]).get("rules") or {}) if last else {}
    except (ValueError, TypeError, AttributeError):
        return {}
