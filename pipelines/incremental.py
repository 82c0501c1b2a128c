"""Incremental flows whose code is a transform: the runner does everything else.

A flow declared with a ``transform`` (:class:`pipelines.flows.Flow`) reads its source's new
commits and appends the transform's rows to its target. Its code sees only a :class:`Batch` (the
new rows and their source versions), the typed config its ``config`` built from settings once per
run, and a :class:`FlowRecord` for its figures. The runner owns the rest:

- ensuring the target, the pending increment and, for flows that split by bucket, the split
  check and the batch cut to the run's buckets;
- the quality gate of the target's suite, the append with the app transaction in the same commit;
- conflict retries and the event-log record (:func:`pipelines.runner.run_job`);
- every frame the flow cached (:meth:`FlowRecord.cache`), released on every exit, errors included.

A flow with ``state`` (``mode="state"``, :class:`StateRules`) keeps its own progress and buffered
rows in a state table, rewritten each run together with the run's output rows (its outbox), which
are then published to its output table under the same run number. Its transform gets a
:class:`StateBatch` (the state as the last run left it and the source rows since) and returns the
next state; the runner reads and writes the state, publishes the outbox (and finishes the
publishing a stopped run left undone), and keeps the state cached while the transform runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import quality
from pipelines.eventlog import RunRecord
from pipelines.layer_config import bucket_mapping
from pipelines.runner import Context, Increment, after, app_id, check_split, pending, run_job, task_name
from pipelines.spark import observed_as_read
from pipelines.storage import AppTxn, Predicate, TableSpec, TableStore

if TYPE_CHECKING:
    from pipelines.flows import Flow, RunOptions


@dataclass(frozen=True)
class Batch:
    """What a flow's transform gets: the rows added to its source in versions ``start..end``."""

    rows: DataFrame
    start: int
    end: int
    buckets: Sequence[int] | None = None
    #: Reads another table as it is now (a lookup, never a source of increments).
    lookup: Callable[[TableSpec, str | None], DataFrame] | None = None
    #: The rows are in memory already: handed over by the flow before (:class:`Handoff`).
    kept: bool = False
    #: Treat every window as closed (the end of a backfill).
    drain: bool = False
    #: Reads another table's rows from a point of a column on (:meth:`read_since`).
    since: Callable[[TableSpec, str, datetime], DataFrame] | None = None

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        assert self.lookup is not None, "a batch built without a lookup"
        return self.lookup(spec, where)

    def read_since(self, spec: TableSpec, column: str, since: datetime) -> DataFrame:
        """Another table's rows whose ``column`` is ``since`` or later, from the files that may
        hold them (:meth:`pipelines.storage.TableStore.read_since`)."""
        assert self.since is not None, "a batch built without a lookup"
        return self.since(spec, column, since)

    def empty(self, spec: TableSpec) -> DataFrame:
        """No rows, with ``spec``'s schema."""
        return self.rows.sparkSession.createDataFrame([], spec.schema)


@dataclass(frozen=True)
class MergeRules:
    """How a flow MERGEs its rows (alias ``s``) into its target (alias ``t``); see
    :meth:`pipelines.storage.TableStore.merge`."""

    #: The match condition, for a run over these buckets (None: every bucket).
    on: Callable[[Sequence[int] | None], Predicate]
    update: Mapping[str, str] | None = None
    insert: Mapping[str, str] | None = None
    update_when: str | None = None


@dataclass
class Handoff:
    """The rows a flow just wrote (``Flow.hands_off``), kept in memory for the next flow of the
    same pass (``medallion run gold``): when they are exactly what that flow has pending, it takes
    them instead of reading them back. The runner releases them after that flow, whatever happens,
    and at the end of the pass.
    """

    table: str | None = None
    version: int | None = None
    frame: DataFrame | None = None
    cached: list[DataFrame] = field(default_factory=list)

    def keep(self, table: TableSpec, version: int, frame: DataFrame, cached: Sequence[DataFrame]) -> None:
        self.release()
        self.table, self.version, self.frame, self.cached = table.key, version, frame, list(cached)

    def take(self, store: TableStore, inc: Increment) -> DataFrame | None:
        """The kept rows if they are all ``inc`` holds: it ends at the version they were written
        in, and any version before that in it added no rows (the table's creation, say)."""
        if self.frame is None or inc.source.key != self.table or inc.end != self.version:
            return None
        if inc.start < inc.end and store.read_inserted(inc.source, inc.start, inc.end - 1).limit(1).count():
            return None
        return self.frame

    def release(self) -> None:
        for df in reversed(self.cached):  # newest first: see FlowRecord.release
            df.unpersist()
        self.table, self.version, self.frame, self.cached = None, None, None, []


@dataclass(frozen=True)
class StateRules:
    """How the runner reads and writes a flow's state table (its ``targets[1]``)."""

    #: The source version the state has processed (None: nothing yet).
    done: Callable[[DataFrame], int | None]
    #: The rows it buffers for later windows (a drain run goes on while there are any).
    buffered: Callable[[DataFrame], DataFrame]
    #: The ``kind`` of the state's outbox rows and the output table's columns.
    outbox_kind: str
    outbox_columns: list[str]
    #: Which state rows the transform reads (None: all, the last outbox's included).
    where: str | None = None


@dataclass(frozen=True)
class StateBatch:
    """What a state flow's transform gets."""

    #: The state table as the last run left it (cached by the runner for the run).
    state: DataFrame
    #: Source rows added since (None: none, a drain run over buffered rows only).
    rows: DataFrame | None
    #: The source version the next state covers.
    end: int | None
    #: This run's number: the version of its state commit's app transaction.
    run: int
    #: Treat every window as closed (the end of a backfill).
    drain: bool


@dataclass(frozen=True)
class StateStep:
    """A state flow's result: the next state (its outbox rows included), and what to record
    once the outbox is published, given how many rows it held."""

    state: DataFrame
    published: Callable[[int], None] | None = None


@dataclass
class FlowRecord:
    """A flow's figures and progress lines; frames it caches are released by the runner."""

    _record: RunRecord
    _say: Callable[[str], None]
    _gate: Callable[[str, DataFrame], DataFrame] | None = None
    _cached: list[DataFrame] = field(default_factory=list)
    #: Parameters the target's suite takes from this batch (its gate's ``**params``).
    gate_params: dict[str, Any] = field(default_factory=dict)
    _observed: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)

    def incr(self, **figures: float | int) -> None:
        self._record.incr(**figures)

    def add(self, **figures: float | int) -> None:
        self._record.add(**figures)

    def noop(self, why: str) -> None:
        """Nothing to write this run, and why (the transform then returns None)."""
        self._record.noop(why)

    def figure(self, name: str) -> float:
        """A figure recorded so far this run (0 when there is none)."""
        return float(self._record.metrics.get(name, 0))

    def gated_rows(self, table: str) -> int | None:
        """The rows of this run's batch for ``table`` that its gate counted and let through (None
        when no gate counted them: quality off, or no check on rows): a figure with no pass of its own."""
        return quality.passed_rows(self._record, table)

    def rows(self, rows_in: int | None = None, rows_out: int | None = None) -> None:
        """Rows read and written, for the event log (a figure not given is left as it is)."""
        if rows_in is not None:
            self._record.rows_in = rows_in
        if rows_out is not None:
            self._record.rows_out = rows_out

    def say(self, message: str) -> None:
        self._say(message)

    def observe(self, name: str, df: DataFrame, **figures: Column) -> DataFrame:
        """``df`` computing the aggregates ``figures`` as the first action that reads it runs (the
        write, or a pass that fills a cache), to take by ``name`` after it (:meth:`observed`): no
        pass of their own."""
        out, self._observed[name] = observed_as_read(df, **figures)
        return out

    def observed(self, name: str) -> dict[str, Any]:
        """The figures :meth:`observe` named ``name`` (none when this run observed none by it)."""
        values = self._observed.get(name)
        return values() if values is not None else {}

    def gate(self, table: str, df: DataFrame) -> DataFrame:
        """The rows of ``df`` that ``table``'s quality suite lets through (for a flow whose gated
        rows are not the rows it appends: a state flow's outbox)."""
        assert self._gate is not None, "this flow's runner gates its output itself"
        return self._gate(table, df)

    def cache(self, df: DataFrame) -> DataFrame:
        """``df`` persisted until the run ends (whatever way it ends)."""
        kept = df.persist()
        self._cached.append(kept)
        return kept

    def release(self, *frames: DataFrame) -> None:
        """Unpersist ``frames`` now (frames this record cached; all of them when none is named)."""
        gone = list(frames) if frames else list(self._cached)
        # Newest first. Spark re-plans every cached plan that reads a frame being unpersisted and
        # has not been computed yet (CacheManager.uncacheQuery -> recacheByCondition); a frame
        # cached from an older one is gone before the older one goes, so nothing is re-planned.
        for df in reversed(gone):
            df.unpersist()
        self._cached = [df for df in self._cached if all(df is not g for g in gone)]

    def handed_over(self) -> list[DataFrame]:
        """The frames cached so far, now the :class:`Handoff`'s to release."""
        cached, self._cached = self._cached, []
        return cached


def configured(ctx: Context, flow: Flow) -> tuple[Callable[..., Any], Any, str | None]:
    """A transform flow's code, the config it built from settings (once per run) and why it has
    nothing to do under that config (None: it has work)."""
    assert flow.transform is not None, f"{flow.name} has no transform"
    config: Any = flow.config(ctx.settings) if flow.config is not None else None
    return flow.transform, config, flow.skip(config) if flow.skip is not None else None


def gate_rows(
    ctx: Context, record: RunRecord, table: str, df: DataFrame, txn: AppTxn, params: Mapping[str, Any]
) -> DataFrame:
    """The rows of ``df`` that ``table``'s suite lets through (:func:`pipelines.quality.gate`)."""
    return quality.gate(ctx, record, table, df, txn, **params)


def gated_append(
    ctx: Context,
    record: RunRecord,
    flow: Flow,
    out: DataFrame,
    txn: AppTxn,
    buckets: Sequence[int] | None,
    params: Mapping[str, Any],
) -> int:
    """``out`` appended to ``flow``'s target through its gate, in one pass where the suite allows
    (:func:`pipelines.quality.gate_in_write`). The new version."""
    gated = quality.gate_in_write(ctx, record, flow.targets[0].key, out, txn, **params)
    return gated.write(lambda rows: write(ctx, flow, rows, txn, buckets))


def run_incremental(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of ``flow``: its source's new commits through its transform into its target."""
    transform, config, skip = configured(ctx, flow)
    (source,), target = flow.sources, flow.targets[0]
    buckets = options.buckets if flow.by_bucket else None
    handoff = options.handoff

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
        figures = FlowRecord(record, ctx.say)
        handed_off = False
        try:
            kept = handoff.take(ctx.store, inc) if handoff is not None and flow.reads == "inserts" else None
            if kept is not None:
                rows = kept
            elif flow.reads == "inserts":
                rows = inc.read(ctx.store)
            else:
                rows = ctx.store.read_changes(source, inc.start, inc.end)
            if kept is None and buckets and "bucket" in source.schema.fieldNames():  # a split run's rows only
                rows = rows.where(F.col("bucket").isin(*sorted(set(buckets))))
            batch = Batch(
                rows, inc.start, inc.end, buckets, ctx.store.read, kept is not None, options.drain, ctx.store.read_since
            )
            out = transform(batch, config, figures)
            if target.key not in flow.gated:
                version = write(ctx, flow, out, inc.txn, buckets)
            elif flow.merge is None:  # an append checks its rows as it writes them, where it can
                version = gated_append(ctx, record, flow, out, inc.txn, buckets, figures.gate_params)
            else:
                out = gate_rows(ctx, record, target.key, out, inc.txn, figures.gate_params)
                version = write(ctx, flow, out, inc.txn, buckets)
            if flow.figures is not None:
                flow.figures(out, config, figures)
            record.add(source_from=inc.start, source_to=inc.end)
            if handoff is not None and flow.hands_off:
                handoff.keep(target, version, out, figures.handed_over())
                handed_off = True
        finally:
            figures.release()
            if handoff is not None and not handed_off:
                handoff.release()  # what the flow before kept is this flow's to take, or nobody's

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
        figures = FlowRecord(record, ctx.say)
        try:
            run = (ctx.store.txn_version(target, app) or 0) + 1
            version = ctx.store.version(source) or 0
            batch = Batch(ctx.store.read(source), 0, version, None, ctx.store.read, drain=options.drain)
            out = transform(batch, config, figures)
            if out is None:
                return
            if target.key in flow.gated:
                out = gate_rows(ctx, record, target.key, out, AppTxn(app, run), figures.gate_params)
            write(ctx, flow, out, AppTxn(app, run), None)
            if flow.figures is not None:
                flow.figures(out, config, figures)
            record.add(source_to=version)
        finally:
            figures.release()

    return run_job(ctx, flow.name, body)


def write(ctx: Context, flow: Flow, out: DataFrame, txn: AppTxn, buckets: Sequence[int] | None) -> int:
    """``out`` into ``flow``'s target with the app transaction ``txn``: appended, or MERGEd (an
    empty MERGE may not commit, so then the progress is recorded alone). The new version."""
    target, rules = flow.targets[0], flow.merge
    if rules is None:
        return ctx.store.append(target, out, [txn])
    if out.isEmpty():
        return ctx.store.append(target, target.arrow_schema.empty_table(), [txn])
    return ctx.store.merge(
        target,
        out,
        on=rules.on(buckets),
        update=rules.update,
        insert=rules.insert,
        update_when=rules.update_when,
        txns=[txn],
    )


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
    rules = flow.state
    assert rules is not None, f"{flow.name} is not a state flow"
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
            state = figures.cache(ctx.store.read(state_table, where=rules.where))
            done = rules.done(state)
            inc = after(ctx.store, source, done, app)
            if inc is None and not (options.drain and rules.buffered(state).limit(1).count()):
                record.noop(f"no new rows in {source.key}" + (" and nothing buffered" if options.drain else ""))
                return
            rows = inc.read(ctx.store) if inc else None
            step = transform(StateBatch(state, rows, inc.end if inc else done, run, options.drain), config, figures)
            ctx.store.overwrite(state_table, step.state, [txn])
            if inc is not None:
                record.add(source_from=inc.start, source_to=inc.end)
        finally:
            figures.release()
        published = publish()
        if step.published is not None:
            step.published(published)

    return run_job(ctx, flow.name, body)
