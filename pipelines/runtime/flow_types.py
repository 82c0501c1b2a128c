"""The flow model: what a flow is, and everything its code sees. A leaf of the runtime.

A flow (:class:`Flow`) is data: its name, its stage, the tables it reads and writes, how it writes,
and its code. Its code sees only the types here: a :class:`Batch` (or a :class:`StateBatch`, or an
:class:`ExportRun` for an export), its typed config, and a :class:`FlowRecord` for its figures. The
runners (:mod:`pipelines.runtime.incremental`, :mod:`pipelines.runtime.exports`) and the dispatch
(:mod:`pipelines.runtime.passes`) import this module; it imports none of them, nor the registry
(:mod:`pipelines.flows`), so flow code and the registry can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pyspark.sql import Column, DataFrame

from pipelines.config.settings import Settings
from pipelines.config.spark import observed_as_read
from pipelines.runtime.declared_tables import DeclaredTables
from pipelines.runtime.eventlog import RunRecord, passed_rows
from pipelines.storage import AddedStats, AppTxn, Predicate, TableSpec, TableStore

#: A flow's config type: what its ``config`` builds from settings and its code takes.
C = TypeVar("C")


@dataclass
class RunOptions:
    """What one run of a flow is asked to do: the only place a run's buckets and drain live."""

    #: The team buckets this run covers (None: all), for a flow that splits by bucket.
    buckets: Sequence[int] | None = None
    #: Treat every window as closed (the end of a backfill).
    drain: bool = False


# -- how a flow writes: one of these, its ``write`` ------------------------------------------------
@dataclass(frozen=True)
class Append:
    """Its transform's rows are appended to its target."""

    kind: ClassVar[str] = "append"


@dataclass(frozen=True)
class Merge:
    """Its transform's rows are MERGEd into its target by ``rules``."""

    rules: MergeRules
    kind: ClassVar[str] = "merge"


@dataclass(frozen=True)
class State:
    """It keeps a state table (its ``targets[1]``) that the runner reads and rewrites by
    ``rules``, and publishes its outbox rows to its output (``targets[0]``)."""

    rules: StateRules
    kind: ClassVar[str] = "state"


@dataclass(frozen=True)
class Export:
    """It sends lake rows to ``to``, a system outside the lake, with its own exactly-once log."""

    to: str
    kind: ClassVar[str] = "export"


@dataclass(frozen=True)
class Ingest:
    """It lands input from ``source`` (Kafka, files, remote write): started by ``medallion
    ingest`` or ``serve``, not by ``medallion run``."""

    source: str
    kind: ClassVar[str] = "ingest"


Write = Append | Merge | State | Export | Ingest


@dataclass(frozen=True)
class Flow(Generic[C]):
    """One flow's declaration: data only. Its write kind (:data:`Write`) says which runner runs
    it; ``config`` builds the ``C`` that ``transform``, ``skip`` and ``figures`` take, so mypy
    checks that a config builder fits its code."""

    name: str
    stage: str
    sources: tuple[TableSpec, ...]
    targets: tuple[TableSpec, ...]
    write: Write
    description: str
    #: The flow's code, given its typed config and its record; the runner does the rest. An
    #: incremental flow's maps new source rows to target rows (a :class:`Batch` -> a DataFrame;
    #: a :class:`State` flow's, a :class:`StateBatch` -> a :class:`StateStep`); an export's sends
    #: an :class:`ExportRun`'s rows to its sink. None for an :class:`Ingest` flow.
    transform: Callable[[Any, C, FlowRecord], Any] | None = None
    #: Builds the transform's typed config from settings, once per run (None: the config is None).
    config: Callable[[Settings], C] | None = None
    #: Why the flow has nothing to do under this config (a noop), else None.
    skip: Callable[[C], str | None] | None = None
    #: Figures of what was written (the rows appended), after the commit.
    figures: Callable[[DataFrame, C, FlowRecord], None] | None = None
    #: Splits by team bucket (``--bucket``): one app id per bucket set.
    by_bucket: bool = False
    #: What its transform gets of the source's new commits: the rows they added, or their change
    #: feed (``_change_type``, ``_commit_version``, ...); or ``all``: the whole source every run.
    reads: Literal["inserts", "changes", "all"] = "inserts"
    #: Tables its code also reads as they are now (never a source of increments); reading a table
    #: that is not among its sources, targets or lookups raises.
    lookups: tuple[TableSpec, ...] = ()
    #: Tables whose quality suite gates this flow's writes.
    gated: tuple[str, ...] = ()
    #: Table key -> how ``medallion validate`` reads it with the figures that tie it to its
    #: sources (a conservation check of what this flow writes).
    checks: Mapping[str, TableCheck] = field(default_factory=dict)
    #: Its queries read the new rows alone (no lookup, no read of its target), so a small increment
    #: runs them interpreted too (:func:`pipelines.config.spark.small_increment`).
    increment_only: bool = False

    @property
    def mode(self) -> str:
        """How it writes, as ``medallion flows``, ``status``, the bundle and the report show it."""
        return self.write.kind

    @property
    def external_source(self) -> str | None:
        return self.write.source if isinstance(self.write, Ingest) else None

    @property
    def external_target(self) -> str | None:
        return self.write.to if isinstance(self.write, Export) else None

    @property
    def reads_tables(self) -> tuple[TableSpec, ...]:
        """Every table its code may read: its sources, targets and lookups."""
        return tuple({s.key: s for s in (*self.sources, *self.targets, *self.lookups)}.values())


@dataclass(frozen=True)
class Batch:
    """What an incremental flow's transform gets: the rows added to its source in versions
    ``start..end``, the run's options, and reads of the tables the flow declares."""

    rows: DataFrame
    start: int
    end: int
    options: RunOptions
    tables: DeclaredTables
    #: What the statistics of the source files of ``rows`` say of them, read by the runner with no
    #: Spark job (:meth:`pipelines.storage.TableStore.inserted_stats`; None where they do not say,
    #: or the rows are not one range of the source's commits): bounds, not figures, when the run
    #: keeps some of those rows only (a run over some buckets).
    added: AddedStats | None = None

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        """A declared table as it is now (a lookup, never a source of increments)."""
        return self.tables.read(spec, where)

    def read_since(self, spec: TableSpec, column: str, since: datetime) -> DataFrame:
        """A declared table's rows whose ``column`` is ``since`` or later, from the files that may
        hold them (:meth:`pipelines.storage.TableStore.read_since`)."""
        return self.tables.read_since(spec, column, since)

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
    #: A column the match condition holds equal, so that a source row whose value is above every
    #: target row's can match none: a source wholly above the target (by the target's statistics,
    #: :meth:`pipelines.storage.TableStore.greatest`) is appended, in one commit as the MERGE
    #: would be, with no read of the target. Only where unmatched rows are inserted as they are.
    appends_above: str | None = None


#: The observation (:meth:`FlowRecord.observe`) in which a MERGE flow gives the least value of its
#: source's ``MergeRules.appends_above`` column, as the figure ``least``; without it the runner
#: asks the source.
MERGE_SOURCE = "merge_source"


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
    options: RunOptions
    #: The source as the state had read it (the rows earlier runs took), read when called; None
    #: before a first run. For a flow that checks new rows against those it already took.
    earlier: Callable[[], DataFrame] | None = None


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
    #: The runner's: the frames this run cached (released by it, whatever way the run ends).
    _cached: list[DataFrame] = field(default_factory=list)
    #: The runner's: what the target's suite takes from this batch (:meth:`check_with`).
    _suite_params: dict[str, Any] = field(default_factory=dict)
    _observed: dict[str, Callable[..., dict[str, Any]]] = field(default_factory=dict)
    #: The runner's: whether this run's MERGE source is appended instead, by source and buckets.
    _appends: dict[Any, Any] = field(default_factory=dict)

    def incr(self, **figures: float | int) -> None:
        self._record.incr(**figures)

    def add(self, **figures: float | int) -> None:
        self._record.add(**figures)

    def noop(self, why: str) -> None:
        """Nothing to write this run, and why (the transform then returns None)."""
        self._record.noop(why)

    def describe(self, details: str) -> None:
        """What the run's event-log row says of it besides its figures (``details``)."""
        self._record.details = details

    def figure(self, name: str) -> float:
        """A figure recorded so far this run (0 when there is none)."""
        return float(self._record.metrics.get(name, 0))

    def gated_rows(self, table: str) -> int | None:
        """The rows of this run's batch for ``table`` that its gate counted and let through (None
        when no gate counted them: quality off, or no check on rows): a figure with no pass of its own."""
        return passed_rows(self._record, table)

    def check_with(self, **params: Any) -> None:
        """Parameters the target's quality suite takes from this batch (e.g. how many tuples it
        fanned out to), for the gate of the rows the transform returns."""
        self._suite_params.update(params)

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

    def observed(self, name: str, query: bool = True) -> dict[str, Any]:
        """The figures :meth:`observe` named ``name`` (none when this run observed none by it).
        Where no action gave them, a query counts them (:func:`observed_as_read`); with
        ``query=False``, none: for figures asked once the frames they read are gone (a written
        state, read again, would be the next one)."""
        values = self._observed.get(name)
        return values(query) if values is not None else {}

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
        self._cached[:] = [df for df in self._cached if all(df is not g for g in gone)]  # the runner's list


@dataclass(frozen=True)
class ExportRun:
    """What an export's code gets besides its config and record."""

    tables: DeclaredTables
    options: RunOptions
    #: The gate of a frame written under ``txn`` by a table's (or dataset's) suite, checked by
    #: the write where the suite allows (:func:`pipelines.runtime.quality.gate_in_write`).
    gate: Callable[[str, DataFrame, AppTxn], WriteGate]
    #: A block for a batch of so many source rows (None: unknown), planned whole where small (``small_increment``).
    small: Callable[[int | None], AbstractContextManager[None]] = lambda _: nullcontext()


T = TypeVar("T")


#: A table as its suite checks it: its rows, the figures that tie it to its sources (or None), the
#: suite's parameters, and a note on what was left out (or None).
Frames = tuple[DataFrame, DataFrame | None, dict[str, Any], str | None]
#: How ``medallion validate`` reads a table with those figures (None: the table does not exist yet).
TableCheck = Callable[[TableStore, Settings], Frames | None]


@dataclass
class WriteGate:
    """A gate run by the write itself (:func:`gate_in_write`): :meth:`write` its ``rows``."""

    rows: DataFrame
    passed: Callable[[], None]
    #: Validates the batch as :func:`gate` does when the write failed on a row (raises why).
    failed: Callable[[], None]
    #: Whether ``rows`` holds every row of the batch (no ``drop`` check removed any): figures counted before hold.
    kept_all: bool = True
    #: Whether the gate is judged between the write's files and its commit (:meth:`write_staged`).
    before_commit: bool = False
    #: Releases what the gate cached to validate the batch before its write.
    release: Callable[[], None] = field(default=lambda: None)

    def write(self, write: Callable[[DataFrame], T]) -> T:
        """``write(rows)``, then the gate's results; a row that stopped the write raises why."""
        return self.write_staged(lambda rows, _: write(rows), staged=False)

    def write_staged(self, write: Callable[[DataFrame, Callable[[], None] | None], T], staged: bool = True) -> T:
        """``write(rows, before_commit)``: ``passed`` where the gate is judged before the commit (and the
        write can do it, ``staged``), else None and the results come after the write."""
        early = staged and self.before_commit
        try:
            try:
                out = write(self.rows, self.passed if early else None)
            except Exception as exc:
                from expectations.in_write import FAILED_IN_WRITE  # Great Expectations: imported when used

                if FAILED_IN_WRITE in str(exc):
                    self.failed()
                raise
            if not early:
                self.passed()
            return out
        finally:
            self.release()
