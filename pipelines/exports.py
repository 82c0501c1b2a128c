"""Export flows: the runner of flows that send lake rows to a system outside the lake.

An export (``mode="export"``) has its own exactly-once protocol with its sink: an outbox, insert
tokens, a log table of what was sent, commits between sends. So its code drives its commits, but
like a transform it never sees a :class:`~pipelines.runner.Context`. It gets an
:class:`ExportRun`: the lake limited to the tables its flow declares (:class:`DeclaredTables`),
whether the run drains, and the quality gate; plus the typed config its ``config`` built from
settings once (its sink's settings among them) and a :class:`~pipelines.incremental.FlowRecord`
for its figures. The runner ensures the declared tables, runs the code under conflict retries with
its event-log record, and releases every frame the code cached, whatever way the run ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame

from pipelines import quality
from pipelines.eventlog import RunRecord
from pipelines.incremental import FlowRecord, configured
from pipelines.runner import Context, Increment, append_once, pending, run_job
from pipelines.storage import AppTxn, Predicate, TableSpec, TableStore

if TYPE_CHECKING:
    from pipelines.flows import Flow, RunOptions


class DeclaredTables:
    """The table store as an export's code uses it: reads and writes of the tables its flow
    declares (sources and targets), and no other (asking for another is a bug in the flow)."""

    def __init__(self, store: TableStore, flow: str, declared: Sequence[TableSpec]) -> None:
        self._store, self._flow = store, flow
        self._keys = frozenset(s.key for s in declared)

    def _mine(self, spec: TableSpec) -> TableSpec:
        if spec.key not in self._keys:
            raise AssertionError(f"{self._flow} does not declare {spec.key}: add it to its sources or targets")
        return spec

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        return self._store.read(self._mine(spec), where)

    def read_changes(self, spec: TableSpec, start: int, end: int | None = None) -> DataFrame:
        return self._store.read_changes(self._mine(spec), start, end)

    def version(self, spec: TableSpec) -> int | None:
        return self._store.version(self._mine(spec))

    def pending(self, source: TableSpec, target: TableSpec, app: str) -> Increment | None:
        """The source versions not yet recorded by ``app`` on ``target`` (:func:`pipelines.runner.pending`)."""
        return pending(self._store, self._mine(source), self._mine(target), app)

    def txn_version(self, spec: TableSpec, app: str) -> int | None:
        return self._store.txn_version(self._mine(spec), app)

    def commit_of(self, spec: TableSpec, txn: AppTxn) -> int:
        return self._store.commit_of(self._mine(spec), txn)

    def append(self, spec: TableSpec, data: pa.Table | DataFrame, txns: Sequence[AppTxn]) -> int:
        return self._store.append(self._mine(spec), data, txns)

    def append_once(self, spec: TableSpec, data: pa.Table | DataFrame, txn: AppTxn) -> bool:
        """Append unless ``spec`` already records ``txn`` (:func:`pipelines.runner.append_once`)."""
        return append_once(self._store, self._mine(spec), data, txn)

    def merge(
        self, spec: TableSpec, source: DataFrame, on: Predicate, update: Mapping[str, str], txns: Sequence[AppTxn]
    ) -> int:
        return self._store.merge(self._mine(spec), source, on=on, update=update, txns=txns)

    def stream(self, df: DataFrame) -> AbstractContextManager[pa.RecordBatchReader]:
        """``df``'s rows as Arrow batches in the driver, one at a time (for the sink)."""
        return self._store.stream(df)

    def stream_added(
        self, spec: TableSpec, version: int, columns: Sequence[str]
    ) -> AbstractContextManager[pa.RecordBatchReader]:
        return self._store.stream_added(self._mine(spec), version, columns)


@dataclass(frozen=True)
class ExportRun:
    """What an export's code gets besides its config and record."""

    tables: DeclaredTables
    #: Treat every window as closed (the end of a backfill).
    drain: bool
    #: The gate of a frame written under ``txn`` by a table's (or dataset's) suite, checked by
    #: the write where the suite allows (:func:`pipelines.quality.gate_in_write`).
    gate: Callable[[str, DataFrame, AppTxn], quality.WriteGate]


def run_export(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of an export flow (see the module's docstring)."""
    code, config, skip = configured(ctx, flow)
    declared = (*flow.sources, *flow.targets)

    def body(record: RunRecord) -> None:
        if skip is not None:
            record.noop(skip)
            return
        for spec in declared:
            ctx.store.ensure(spec)
        figures = FlowRecord(record, ctx.say)
        run = ExportRun(
            DeclaredTables(ctx.store, flow.name, declared),
            options.drain,
            lambda table, df, txn: quality.gate_in_write(ctx, record, table, df, txn),
        )
        try:
            code(run, config, figures)
        finally:
            figures.release()

    return run_job(ctx, flow.name, body)
