"""Incremental flows whose code is a transform: the runner does everything else.

A flow declared with a ``transform`` (:class:`pipelines.flows.Flow`) reads its source's new
commits and appends the transform's rows to its target. Its code sees only a :class:`Batch` (the
new rows and their source versions), the typed config its ``config`` built from settings once per
run, and a :class:`FlowRecord` for its figures. The runner owns the rest:

- ensuring the target, the pending increment and, for flows that split by bucket, the split
  check and the batch cut to the run's buckets;
- the quality gate of the target's suite, the append with the app transaction in the same commit;
- conflict retries and the event-log record (:func:`pipelines.runtime.runner.run_job`);
- every frame the flow cached (:meth:`FlowRecord.cache`), released on every exit, errors included.

A flow with ``state`` (``mode="state"``, :class:`StateRules`) keeps its own progress and buffered
rows in a state table, rewritten each run together with the run's output rows (its outbox), which
are then published to its output table under the same run number. Its transform gets a
:class:`StateBatch` (the state as the last run left it and the source rows since) and returns the
next state; the runner reads and writes the state, publishes the outbox (and finishes the
publishing a stopped run left undone), and keeps the state cached while the transform runs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.config.layers import bucket_mapping
from pipelines.config.spark import small_increment
from pipelines.runtime import quality
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.flow_types import (
    MERGE_SOURCE,
    Batch,
    DeclaredTables,
    Flow,
    FlowRecord,
    Merge,
    RunOptions,
    State,
    StateBatch,
)
from pipelines.runtime.progress import Increment, after, pending
from pipelines.runtime.runner import Context, app_id, check_split, run_job, task_name
from pipelines.storage import AddedStats, AppTxn, Greatest, Predicate, TableSpec, TableStore

log = logging.getLogger("medallion.runner")


def declared(ctx: Context, flow: Flow) -> DeclaredTables:
    """The lake as ``flow``'s code may use it: the tables it declares, and no other."""
    return DeclaredTables(ctx.store, flow.name, flow.reads_tables)


def configured(ctx: Context, flow: Flow) -> tuple[Callable[..., Any], Any, str | None]:
    """A transform flow's code, the config it built from settings (once per run) and why it has
    nothing to do under that config (None: it has work)."""
    assert flow.transform is not None, f"{flow.name} has no transform"
    config: Any = flow.config(ctx.settings) if flow.config is not None else None
    return flow.transform, config, flow.skip(config) if flow.skip is not None else None


def gate_rows(
    ctx: Context, record: RunRecord, table: str, df: DataFrame, txn: AppTxn, params: Mapping[str, Any]
) -> DataFrame:
    """The rows of ``df`` that ``table``'s suite lets through (:func:`pipelines.runtime.quality.gate`)."""
    return quality.gate(ctx, record, table, df, txn, **params)


def gated_write(
    ctx: Context,
    record: RunRecord,
    flow: Flow,
    out: DataFrame,
    txn: AppTxn,
    buckets: Sequence[int] | None,
    params: Mapping[str, Any],
    figures: FlowRecord,
    least: Any = None,
    read_version: int | None = None,
) -> int:
    """``out`` written into ``flow``'s target through its gate, in one pass where the suite
    allows (:func:`pipelines.runtime.quality.gate_in_write`): appended (or, for a MERGE whose
    source no target row can match, appended too), the gate's checks on totals judged between the
    write's files and its commit where the store can; MERGEd where the store reads the source
    once and can judge it before the MERGE changes anything (delta-rs stages it), else the source
    is validated first from a cache. The new version."""
    target = flow.targets[0]
    staged = ctx.store.checks_before_commit
    if isinstance(flow.write, Merge) and not staged:
        held = _append_instead(ctx, flow, out, buckets, figures, least)
        if held is None:  # a MERGE that reads its source more than once: validated from a cache
            source = gate_rows(ctx, record, target.key, figures.cache(out), txn, params)
            return write(ctx, flow, source, txn, buckets, figures, least, read_version=read_version)
    gated = quality.gate_in_write(ctx, record, target.key, out, txn, staged, **params)
    return gated.write_staged(
        lambda rows, check: write(ctx, flow, rows, txn, buckets, figures, least, check, read_version)
    )


def _added_rows(store: TableStore, inc: Increment | None) -> int | None:
    """The rows ``inc``'s commits added, by the log's statistics, with no Spark job (None where
    they do not say)."""
    added = store.inserted_stats(inc.source, inc.start, inc.end) if inc is not None else None
    return added.rows if added is not None else None


def run_incremental(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of ``flow``: its source's new commits through its transform into its target."""
    transform, config, skip = configured(ctx, flow)
    (source,), target = flow.sources, flow.targets[0]
    buckets = options.buckets if flow.by_bucket else None

    def body(record: RunRecord) -> None:
        if skip is not None:
            record.noop(skip)
            return
        ctx.store.ensure(target)
        if flow.by_bucket:
            check_split(
                ctx.store, flow.name, source, target, buckets, bucket_mapping(ctx.settings).count, ctx.checked_splits
            )
        inc = pending(ctx.store, source, target, app_id(flow.name, source, buckets))
        if inc is None:
            record.noop(f"no new rows in {source.key}")
            return
        params: dict[str, Any] = {}  # what it gives the target's suite (FlowRecord.check_with)
        figures = FlowRecord(record, ctx.say, _suite_params=params)
        try:
            # Planned whole where the increment is small (one job per query, no re-planning).
            added = ctx.store.inserted_stats(source, inc.start, inc.end)  # the log's, read once
            with small_increment(ctx.spark, ctx.settings, added.rows if added else None, flow.increment_only):
                rows = (
                    inc.read(ctx.store)
                    if flow.reads == "inserts"
                    else ctx.store.read_changes(source, inc.start, inc.end)
                )
                if buckets and "bucket" in source.schema.fieldNames():  # a split run's rows only
                    rows = rows.where(F.col("bucket").isin(*sorted(set(buckets))))
                run = RunOptions(buckets, options.drain)
                out = transform(Batch(rows, inc.start, inc.end, run, declared(ctx, flow), added), config, figures)
                least = _least_added(flow, added)
                # Committed through the version its progress was read at: a run of the same flow
                # in another process that recorded progress since fails the commit (and retries).
                at = inc.read_version
                if target.key not in flow.gated:
                    write(ctx, flow, out, inc.txn, buckets, figures, least, read_version=at)
                else:  # checked as it is written, where the suite allows
                    gated_write(ctx, record, flow, out, inc.txn, buckets, params, figures, least, at)
                if flow.figures is not None:
                    flow.figures(out, config, figures)
                record.add(source_from=inc.start, source_to=inc.end)
        finally:
            figures.release()

    return run_job(ctx, task_name(flow.name, buckets), body)


def run_whole(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of a flow that reads all of its source each time (``reads="all"``: gold.counters
    finds the entities due for a flush among every partial). Its transform returns None when there
    is nothing to write (having said why, :meth:`FlowRecord.noop`); its commits are numbered runs."""
    transform, config, skip = configured(ctx, flow)
    (source,), target = flow.sources, flow.targets[0]
    app = app_id(flow.name, source)

    def body(record: RunRecord) -> None:
        if skip is not None:
            record.noop(skip)
            return
        for spec in (source, target):
            ctx.store.ensure(spec)
        params: dict[str, Any] = {}
        figures = FlowRecord(record, ctx.say, _suite_params=params)
        try:
            progress = ctx.store.txn_snapshot(target, [app])  # the run is numbered, and committed, from it
            run = (progress.versions[app] or 0) + 1
            version = ctx.store.version(source) or 0
            batch = Batch(ctx.store.read(source), 0, version, RunOptions(None, options.drain), declared(ctx, flow))
            out = transform(batch, config, figures)
            if out is None:
                return
            if target.key in flow.gated:
                out = gate_rows(ctx, record, target.key, out, AppTxn(app, run), params)
            write(ctx, flow, out, AppTxn(app, run), None, figures, read_version=progress.table_version)
            if flow.figures is not None:
                flow.figures(out, config, figures)
            record.add(source_to=version)
        finally:
            figures.release()

    return run_job(ctx, flow.name, body)


def write(
    ctx: Context,
    flow: Flow,
    out: DataFrame,
    txn: AppTxn,
    buckets: Sequence[int] | None,
    figures: FlowRecord | None = None,
    least: Any = None,
    before_commit: Callable[[], None] | None = None,
    read_version: int | None = None,
) -> int:
    """``out`` into ``flow``'s target with the app transaction ``txn``: appended, or MERGEd (an
    empty MERGE may not commit, so then the progress is recorded alone; a source no target row
    can match is appended, see ``MergeRules.appends_above``; ``figures``: the flow's record, which
    may hold its :data:`MERGE_SOURCE` observation; ``least``: a lower bound of the source's
    ``appends_above`` column that its files' statistics gave). ``before_commit``: the gate's
    judgement, run between an append's files and its commit, or before a MERGE changes the
    target (where the store can, ``checks_before_commit``); ``read_version``: the target's version
    the progress was read at, which the commit is checked from (None: not checked). The new version."""
    target = flow.targets[0]
    if not isinstance(flow.write, Merge):
        return ctx.store.append(target, out, [txn], read_version=read_version, before_commit=before_commit)
    held = _append_instead(ctx, flow, out, buckets, figures, least)
    if held is not None:  # committed through the version the bound (or the progress) was read at
        log.info("%s: no row of %s can match, appended", flow.name, target.key)
        at = min((v for v in (read_version, held.version) if v is not None), default=None)
        return ctx.store.append(target, out, [txn], read_version=at, before_commit=before_commit)
    rules = flow.write.rules
    on = rules.on(buckets)
    if (column := rules.appends_above) is not None:
        on = _from_least(on, column, _least(out, column, figures, least))
    return ctx.store.merge(
        target,
        out,
        on=on,
        update=rules.update,
        insert=rules.insert,
        update_when=rules.update_when,
        txns=[txn],
        before_commit=before_commit,
        read_version=read_version,
    )


def _least_added(flow: Flow, added: AddedStats | None) -> Any:
    """A lower bound of the MERGE source's ``appends_above`` column, from the statistics of the
    source rows its run reads (the rows its source's commits added; a run over some buckets reads
    a part of them, so the bound still holds), where the source carries that column; else None."""
    if not isinstance(flow.write, Merge) or flow.write.rules.appends_above is None or added is None:
        return None
    return added.earliest.get(flow.write.rules.appends_above)


def _append_instead(
    ctx: Context, flow: Flow, out: DataFrame, buckets: Sequence[int] | None, figures: FlowRecord | None, least: Any
) -> Greatest | None:
    """The target's bound when a MERGE flow's source can match no target row and is appended
    instead (``MergeRules.appends_above``), else None. Asked once per run: the gate's choice
    between a checked append and a validated MERGE and the write's agree."""
    assert isinstance(flow.write, Merge)
    rules = flow.write.rules
    column = rules.appends_above
    if column is None or rules.insert is not None:
        return None
    key = (id(out), tuple(buckets or ()))
    cache = figures._appends if figures is not None else {}
    if key not in cache:
        low = functools.cache(lambda: _least(out, column, figures, least))  # asked where needed
        cache[key] = _above_target(ctx, flow.targets[0], column, buckets, low)
    return cache[key]


def _above_target(
    ctx: Context,
    target: TableSpec,
    column: str,
    buckets: Sequence[int] | None,
    least: Callable[[], Any],
) -> Greatest | None:
    """The target's bound when every row of the MERGE source has ``column`` above every row the
    target holds in ``buckets`` (the MERGE condition names them), by the target's statistics and
    the source's ``least`` value (:func:`_least`); None when some row may match."""
    held = ctx.store.greatest(target, column, buckets)
    if held is None:
        return None
    if held.value is None:  # the target holds no rows there
        return held
    low = least()
    return held if low is not None and low > held.value else None


def _least(out: DataFrame, column: str, figures: FlowRecord | None, bound: Any = None) -> Any:
    """The least ``column`` of the MERGE source ``out`` (or a lower bound of it): as its source's
    statistics gave it (``bound``), as a pass already observed it, else asked."""
    least = bound
    if least is None and figures is not None:
        least = figures.observed(MERGE_SOURCE, query=False).get("least")
    if least is None:
        row = out.agg(F.min(column)).first()  # one value
        least = row[0] if row is not None else None
    if isinstance(least, datetime) and least.tzinfo is None:  # Spark's local wall time
        try:
            least = least.astimezone(UTC)
        except (ValueError, OverflowError):  # at the edge of the calendar: no bound
            return None
    return least


def _from_least(on: Predicate, column: str, least: Any) -> Predicate:
    """The MERGE condition ``on`` bounded below on the target's ``column`` by the source's least
    value (it holds ``column`` equal): the target's files wholly below it are not read, by their
    statistics (Delta on Spark prunes by the target's side of the condition alone)."""
    if not isinstance(on, str) or not isinstance(least, datetime):
        return on
    try:
        at = least.astimezone(UTC)
    except (ValueError, OverflowError):  # a time at the edge of the calendar: not bounded
        return on
    # An instant (UTC, said so): a literal without its zone is read in the session's time zone.
    return f"({on}) AND t.{column} >= TIMESTAMP '{at.year:04d}-{at:%m-%dT%H:%M:%S.%f}Z'"


def publish_outbox(store: TableStore, state: TableSpec, out: TableSpec, app: str, kind: str, columns: list[str]) -> int:
    """Append the outbox rows (``kind``) a state commit holds, unless ``out`` already has them.

    A state flow replaces its state table and its outbox in one commit, then publishes the
    outbox under the same run number: a crash between the two is finished by the next run.
    """
    state_seq = store.txn_version(state, app)
    out_seq = store.txn_version(out, app)
    if state_seq is None or (out_seq is not None and out_seq >= state_seq):
        return 0
    rows = store.read(state, where=f"kind = '{kind}'").select(*columns).persist()
    try:
        store.append(out, rows, [AppTxn(app, state_seq)])
        return rows.count()
    finally:
        rows.unpersist()


def run_stateful(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of a flow with state: its source's new rows and its state -> the next state and
    the outbox published (see the module's docstring)."""
    transform, config, skip = configured(ctx, flow)
    assert isinstance(flow.write, State), f"{flow.name} is not a state flow"
    rules = flow.write.rules
    (source,), (out, state_table) = flow.sources, flow.targets
    app = app_id(flow.name, source)

    def publish() -> int:
        return publish_outbox(ctx.store, state_table, out, app, rules.outbox_kind, rules.outbox_columns)

    def body(record: RunRecord) -> None:
        if skip is not None:
            record.noop(skip)
            return
        for spec in (out, state_table, source):
            ctx.store.ensure(spec)
        recovered = publish()
        if recovered:
            record.add(recovered_outbox_rows=recovered)
            ctx.say(f"{out.key}: published {recovered:,} rows a stopped run had left in its outbox")
        run = (ctx.store.txn_version(state_table, app) or 0) + 1
        txn = AppTxn(app, run)

        figures = FlowRecord(record, ctx.say, lambda table, df: gate_rows(ctx, record, table, df, txn, {}))
        try:
            state = ctx.store.read(state_table, where=rules.where)
            # A state table still at its creation commit holds nothing: no query of it (a first
            # pass, cold). Its progress is otherwise read from its rows, whatever its log keeps.
            # Asked only where no run's transaction was found: a committed run is past version 0.
            # Not from a cache: the progress reads a few columns of the state, and a run with
            # nothing new reads no more (a cache would hold every row, the buffer's text too).
            fresh = run == 1 and ctx.store.version(state_table) == 0
            done = None if fresh else rules.done(state)
            inc = after(ctx.store, source, done, app)
            added = _added_rows(ctx.store, inc)
            if inc is not None and added == 0:
                inc = None  # commits of no rows (the source's creation): nothing new to read
            if inc is None and not (options.drain and not fresh and rules.buffered(state).limit(1).count()):
                record.noop(f"no new rows in {source.key}" + (" and nothing buffered" if options.drain else ""))
                return
            state = figures.cache(state)  # the same snapshot, read by the transform's several queries
            rows = inc.read(ctx.store) if inc else None
            with small_increment(ctx.spark, ctx.settings, added if inc is not None else None):
                earlier = None if done is None else functools.partial(ctx.store.read_at, source, done)
                batch = StateBatch(state, rows, inc.end if inc else done, run, RunOptions(None, options.drain), earlier)
                step = transform(batch, config, figures)
                ctx.store.overwrite(state_table, step.state, [txn])
            if inc is not None:
                record.add(source_from=inc.start, source_to=inc.end)
        finally:
            figures.release()
        published = publish()
        if step.published is not None:
            step.published(published)

    return run_job(ctx, flow.name, body)
