"""The table store as a flow's code sees it: only the tables its flow declares."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from pipelines.runtime.progress import Increment, append_once, pending
from pipelines.storage import AppTxn, Predicate, TableSpec, TableStore
from pipelines.storage.parquet_files import AddedStats


class DeclaredTables:
    """The table store as a flow's code uses it: reads and writes of the tables its flow declares
    (sources, targets and lookups: :attr:`Flow.reads_tables`), and no other (asking for another
    is a bug in the flow: declare it, so the report's graph and the bundle see it)."""

    def __init__(self, store: TableStore, flow: str, declared: Sequence[TableSpec]) -> None:
        self._store, self._flow = store, flow
        self._keys = frozenset(s.key for s in declared)

    def _mine(self, spec: TableSpec) -> TableSpec:
        if spec.key not in self._keys:
            raise AssertionError(f"{self._flow} does not declare {spec.key}: add it to its sources, targets or lookups")
        return spec

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        return self._store.read(self._mine(spec), where)

    def read_since(self, spec: TableSpec, column: str, since: datetime) -> DataFrame:
        return self._store.read_since(self._mine(spec), column, since)

    def held_since(
        self, spec: TableSpec, column: str, since: datetime, columns: Sequence[str], max_rows: int
    ) -> pa.Table | None:
        return self._store.held_since(self._mine(spec), column, since, columns, max_rows)

    def read_windows(self, spec: TableSpec, column: str, after: datetime | None, values: list[datetime]) -> DataFrame:
        return self._store.read_windows(self._mine(spec), column, after, values)

    def read_changes(self, spec: TableSpec, start: int, end: int | None = None) -> DataFrame:
        return self._store.read_changes(self._mine(spec), start, end)

    def held_changes(self, spec: TableSpec, start: int, end: int, columns: Sequence[str]) -> pa.Table | None:
        return self._store.held_changes(self._mine(spec), start, end, columns)

    def change_rows(self, spec: TableSpec, start: int, end: int) -> int | None:
        return self._store.change_rows(self._mine(spec), start, end)

    def version(self, spec: TableSpec) -> int | None:
        return self._store.version(self._mine(spec))

    def pending(self, source: TableSpec, target: TableSpec, app: str) -> Increment | None:
        """The source versions ``app`` has not recorded on ``target`` (:func:`~pipelines.runtime.progress.pending`)."""
        return pending(self._store, self._mine(source), self._mine(target), app)

    def txn_version(self, spec: TableSpec, app: str) -> int | None:
        return self._store.txn_version(self._mine(spec), app)

    def commit_of(self, spec: TableSpec, txn: AppTxn) -> int:
        return self._store.commit_of(self._mine(spec), txn)

    def append(
        self,
        spec: TableSpec,
        data: pa.Table | DataFrame,
        txns: Sequence[AppTxn],
        before_commit: Callable[[], None] | None = None,
    ) -> int:
        return self._store.append(self._mine(spec), data, txns, before_commit=before_commit)

    def append_once(self, spec: TableSpec, data: pa.Table | DataFrame, txn: AppTxn) -> bool:
        """Append unless ``spec`` already records ``txn`` (:func:`pipelines.runtime.progress.append_once`)."""
        return append_once(self._store, self._mine(spec), data, txn)

    def merge(
        self,
        spec: TableSpec,
        source: pa.Table | DataFrame,
        on: Predicate,
        update: Mapping[str, str],
        txns: Sequence[AppTxn],
    ) -> int:
        return self._store.merge(self._mine(spec), source, on=on, update=update, txns=txns)

    def to_spark(self, table: pa.Table, schema: StructType | None = None) -> DataFrame:
        return self._store.to_spark(table, schema)  # rows born in the driver (few), as a frame

    def stream(self, df: DataFrame) -> AbstractContextManager[pa.RecordBatchReader]:
        return self._store.stream(df)  # its rows as Arrow batches in the driver, one at a time (for the sink)

    def streams_commit_files(self, spec: TableSpec) -> bool:
        return self._store.streams_commit_files(self._mine(spec))

    @property
    def writes_in_driver(self) -> bool:
        return self._store.writes_in_driver

    @property
    def checks_before_commit(self) -> bool:
        return self._store.checks_before_commit

    def inserted_stats(self, spec: TableSpec, start: int, end: int) -> AddedStats | None:
        return self._store.inserted_stats(self._mine(spec), start, end)

    def added_local_paths(self, spec: TableSpec, version: int) -> list[str] | None:
        """The local paths of the files commit ``version`` added, where the table is read by path
        on the local file system (None otherwise): for a sink that reads them itself."""
        store = self._store
        if not store.streams_commit_files(self._mine(spec)):
            return None
        return store.files.added_local_paths(store.path(spec), version)

    def stream_added(
        self, spec: TableSpec, version: int, columns: Sequence[str]
    ) -> AbstractContextManager[pa.RecordBatchReader]:
        return self._store.stream_added(self._mine(spec), version, columns)
