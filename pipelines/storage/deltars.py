"""The ``delta-rs`` engine (package ``deltalake``): the local default.

Spark moves the data and delta-rs keeps the log. DataFrames are written by Spark as Parquet into
the table folder and committed by delta-rs as add actions with statistics (see
:mod:`pipelines.storage.parquet_files`); reads are Spark's Parquet reader over the files of the
snapshot delta-rs names; change-feed reads take the files each commit added (or its change-data
files). Rows born in the driver (a Kafka flush, remote-write samples, log rows) are written by
delta-rs directly as Arrow, with no Spark job. A MERGE source is staged by Spark as Parquet and
streamed to delta-rs as Arrow batches; the target never passes through Python.

App transactions go into ``CommitProperties(app_transactions=...)`` so they land in the same
commit as the rows.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.errors import CommitConflictError, StorageError
from pipelines.storage import deltars_changes, deltars_stats
from pipelines.storage.base import Data, Predicate, TableStore, windows_condition
from pipelines.storage.bloom import bloom_writer_properties
from pipelines.storage.file_stats import MayHold, from_time, in_windows, kept_actions, kept_files, rows_since
from pipelines.storage.parquet_files import DataFile, scan
from pipelines.storage.predicates import predicate_sql
from pipelines.storage.specs import AppTxn, Greatest, TableSpec, TableStats, TxnSnapshot, layout_bytes

#: A MERGE source of at most this many rows is handed to delta-rs whole (a few MB in the driver),
#: so that it prunes the target by the source's values; a larger one is streamed.
SMALL_MERGE_SOURCE_ROWS = 100_000

# delta-rs resolves non-conflicting concurrent commits itself; these are its retries.
MAX_COMMIT_RETRIES = 15
#: Reader features whose files a plain Parquet read would get wrong.
UNSUPPORTED_READER_FEATURES = ("deletionVectors", "columnMapping")


def _commit_properties(txns: Sequence[AppTxn], operation: str | None = None) -> CommitProperties:
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return CommitProperties(
        app_transactions=[Transaction(t.app_id, t.version, now_ms) for t in txns] or None,
        max_commit_retries=MAX_COMMIT_RETRIES,
        custom_metadata={"medallion.operation": operation} if operation else None,
    )


class DeltaRsStore(TableStore):
    engine = "delta-rs"
    checks_before_commit = True
    writes_in_driver = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One loaded DeltaTable per table per thread (a DeltaTable is not safe to share between
        # threads): each use loads only the log versions committed since the last one, instead
        # of replaying the log from its last checkpoint. A Kafka flush asks for its table three
        # times (the snapshot, the append, the version), and the log grows with every flush.
        # A store therefore assumes nobody removes a table and creates it again under the same
        # path while it is open (a new store loads afresh).
        self._loaded = threading.local()

    def _table(self, spec: TableSpec, version: int | None = None) -> DeltaTable:
        path = self.path(spec)
        cache: dict[str, DeltaTable] = self._loaded.__dict__.setdefault("tables", {})
        cached = cache.get(path)
        if cached is not None:
            try:
                if version is None:
                    cached.update_incremental()
                    return cached
                if cached.version() == version:
                    return cached
            except (DeltaError, OSError):  # the table was removed or replaced since: load it anew
                cache.pop(path, None)
        try:
            dt = DeltaTable(path, version=version, storage_options=self.storage_options or None)
        except TableNotFoundError as exc:
            cache.pop(path, None)
            raise StorageError(f"table {spec.key} does not exist at {path}") from exc
        if version is None or cached is None:
            cache[path] = dt
        return dt

    def exists(self, spec: TableSpec) -> bool:
        return DeltaTable.is_deltatable(self.path(spec), storage_options=self.storage_options or None)

    def ensure(self, spec: TableSpec) -> bool:
        if self.exists(spec):
            return False
        try:
            DeltaTable.create(
                self.path(spec),
                schema=spec.arrow_schema,
                mode="error",
                partition_by=list(spec.partition_by) or None,
                name=spec.name,
                description=spec.description or None,
                configuration=spec.table_properties(),
                storage_options=self.storage_options or None,
            )
        except (DeltaError, CommitFailedError):
            if self.exists(spec):  # another process created it first
                return False
            raise
        return True

    # -- writes ----------------------------------------------------------------------------
    def append(
        self,
        spec: TableSpec,
        data: Data,
        txns: Sequence[AppTxn] = (),
        read_version: int | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> int:
        # Committing through the snapshot at read_version makes delta-rs check the commits after
        # it for the same app ids.
        return self._write(spec, data, txns, "append", read_version, before_commit)

    def overwrite(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = ()) -> int:
        return self._write(spec, data, txns, "overwrite", None)

    def _write(
        self,
        spec: TableSpec,
        data: Data,
        txns: Sequence[AppTxn],
        mode: Literal["append", "overwrite"],
        read_version: int | None,
        before_commit: Callable[[], None] | None = None,
    ) -> int:
        if isinstance(data, pa.Table):
            if before_commit is not None:
                before_commit()
            return self._write_arrow(spec, data, txns, mode, read_version)
        written = self.files.write(
            data, self.path(spec), spec.schema, spec.partition_by, spec.cluster_by, spec.file_rows, spec.bloom_filter
        )
        if before_commit is not None:
            try:
                before_commit()
            except BaseException:
                self.files.delete_files(self.path(spec), written)  # written, never committed
                raise
        self._commit_files(spec, written, txns, mode, read_version)
        return self._table(spec).version()

    def _write_arrow(
        self,
        spec: TableSpec,
        data: pa.Table,
        txns: Sequence[AppTxn],
        mode: Literal["append", "overwrite"],
        read_version: int | None,
    ) -> int:
        """Rows that were born in the driver (a Kafka flush, samples, log rows): no Spark job.

        The table is loaded once: delta-rs commits through it and moves it to the version it
        committed, so no second load is needed to say which one that was.
        """
        target = self._table(spec, read_version)
        try:
            write_deltalake(
                target,
                self.to_arrow(spec, data),
                mode=mode,
                partition_by=list(spec.partition_by) or None,
                storage_options=self.storage_options or None,
                commit_properties=_commit_properties(txns, mode),
            )
        except CommitFailedError as exc:
            raise CommitConflictError(f"{mode} of {spec.key} conflicted: {exc}") from exc
        return target.version()

    def _commit_files(
        self,
        spec: TableSpec,
        files: Sequence[DataFile],
        txns: Sequence[AppTxn],
        mode: Literal["append", "overwrite"],
        read_version: int | None,
    ) -> None:
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True, f.stats) for f in files
        ]
        try:
            self._table(spec, read_version).create_write_transaction(
                actions,
                mode,
                schema=spec.arrow_schema,
                partition_by=list(spec.partition_by) or None,
                commit_properties=_commit_properties(txns, mode),
            )
        except CommitFailedError as exc:
            self.files.delete_files(self.path(spec), files)
            raise CommitConflictError(f"{mode} of {spec.key} conflicted: {exc}") from exc
        except BaseException:
            self.files.delete_files(self.path(spec), files)
            raise

    def merge(
        self,
        spec: TableSpec,
        source: Data,
        on: Predicate,
        update: Mapping[str, str] | None = None,
        insert: Mapping[str, str] | None = None,
        txns: Sequence[AppTxn] = (),
        update_when: str | None = None,
        before_commit: Callable[[], None] | None = None,
        read_version: int | None = None,
    ) -> int:
        # Merged through the snapshot at read_version: delta-rs checks the commits after it.
        at = read_version
        on = predicate_sql(self.spark, on, spec.schema, source, standard=True)
        if isinstance(source, pa.Table):
            if before_commit is not None:
                before_commit()
            if source.num_rows == 0:
                return self._write_arrow(spec, spec.arrow_schema.empty_table(), txns, "append", at)
            return self._merge(spec, source, on, update, insert, txns, update_when, at)
        # The source (an aggregated batch) reaches delta-rs as a stream of Arrow batches staged
        # by Spark, so the driver holds one batch at a time, never the whole. A small source is
        # held whole instead: delta-rs then derives a pruning predicate from its values (which
        # buckets, which windows) and reads only the target files they can match, where a stream
        # makes it read every file of the table. Spark has written the whole source once the
        # stream opens: the check runs there, before the MERGE reads a batch of it.
        with self.stream(source) as reader:
            if before_commit is not None:
                before_commit()
            head: list[pa.RecordBatch] = []
            rows = 0
            for batch in reader:
                head.append(batch)
                rows += batch.num_rows
                if rows > SMALL_MERGE_SOURCE_ROWS:
                    rest = pa.RecordBatchReader.from_batches(reader.schema, itertools.chain(head, reader))
                    return self._merge(spec, rest, on, update, insert, txns, update_when, at)
            if rows == 0:
                return self._write_arrow(spec, spec.arrow_schema.empty_table(), txns, "append", at)
            whole = pa.Table.from_batches(head, schema=reader.schema)
            return self._merge(spec, whole, on, update, insert, txns, update_when, at)

    def _merge(
        self,
        spec: TableSpec,
        source: pa.Table | pa.RecordBatchReader,
        on: str,
        update: Mapping[str, str] | None,
        insert: Mapping[str, str] | None,
        txns: Sequence[AppTxn],
        update_when: str | None,
        read_version: int | None,
    ) -> int:
        merger = self._table(spec, read_version).merge(
            source=source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            # A table in memory is merged with the pruning its values allow; a stream as a stream.
            streamed_exec=not isinstance(source, pa.Table),
            commit_properties=_commit_properties(txns, "merge"),
        )
        merger = (
            merger.when_matched_update_all(predicate=update_when)
            if update is None
            else merger.when_matched_update(dict(update), predicate=update_when)
        )
        merger = (
            merger.when_not_matched_insert_all() if insert is None else merger.when_not_matched_insert(dict(insert))
        )
        try:
            merger.execute()
        except CommitFailedError as exc:
            raise CommitConflictError(f"merge into {spec.key} conflicted: {exc}") from exc
        return self._table(spec).version()

    def replace(
        self, spec: TableSpec, data: Data, where: str, txns: Sequence[AppTxn] = (), read_version: int | None = None
    ) -> int:
        """delta-rs's overwrite with a predicate: it rewrites only the files that hold rows where
        ``where`` holds (their statistics say which), and writes the change feed of both sides.
        A frame's rows reach it as a stream of Arrow batches staged by Spark."""
        target = self._table(spec, read_version)
        rows = nullcontext(self.to_arrow(spec, data)) if isinstance(data, pa.Table) else self.stream(data)
        try:
            with rows as source:
                write_deltalake(
                    target,
                    source,
                    mode="overwrite",
                    predicate=where,
                    partition_by=list(spec.partition_by) or None,
                    storage_options=self.storage_options or None,
                    commit_properties=_commit_properties(txns, "replace"),
                )
        except CommitFailedError as exc:
            raise CommitConflictError(f"replace in {spec.key} conflicted: {exc}") from exc
        return target.version()

    def delete(self, spec: TableSpec, predicate: Predicate, txns: Sequence[AppTxn] = ()) -> int:
        predicate = predicate_sql(self.spark, predicate, spec.schema, standard=True)
        dt = self._table(spec)
        try:
            dt.delete(predicate, commit_properties=_commit_properties(txns, "delete"))
        except CommitFailedError as exc:
            raise CommitConflictError(f"delete from {spec.key} conflicted: {exc}") from exc
        return self._table(spec).version()

    # -- reads -----------------------------------------------------------------------------
    def _readable(self, spec: TableSpec, dt: DeltaTable) -> DeltaTable:
        features = set(dt.protocol().reader_features or [])
        unsupported = features & set(UNSUPPORTED_READER_FEATURES)
        if unsupported:
            raise StorageError(
                f"table {spec.key} uses {', '.join(sorted(unsupported))}, which the delta-rs engine's Spark reads "
                "do not apply: read it with delta_engine=delta-spark"
            )
        return dt

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        dt = self._readable(spec, self._table(spec))
        df = scan(self.spark, spec.schema, self.path(spec), dt.file_uris())
        return df.where(where) if where else df

    def read_at(self, spec: TableSpec, version: int) -> DataFrame:
        dt = self._readable(spec, self._table(spec, version))
        uris = dt.file_uris()
        if not self.files.all_exist(uris):
            raise StorageError(f"version {version} of {spec.key} is no longer readable: its files were vacuumed")
        return scan(self.spark, spec.schema, self.path(spec), uris)

    def least(self, spec: TableSpec, column: str) -> Any:
        known, value = deltars_stats.least(self._table(spec), column)
        if not known:
            return super().least(spec, column)
        if isinstance(value, datetime):  # statistics are UTC: as pyspark would collect it
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone().replace(tzinfo=None)
        return value

    def read_since(self, spec: TableSpec, column: str, since: datetime) -> DataFrame:
        return self._pruned(spec, column, from_time(since)).where(F.col(column) >= F.lit(since))

    def held_since(
        self, spec: TableSpec, column: str, since: datetime, columns: Sequence[str], max_rows: int
    ) -> pa.Table | None:
        dt = self._readable(spec, self._table(spec))
        kept = kept_actions(pa.table(dt.get_add_actions(flatten=True)), column, from_time(since))
        counts = kept["num_records"] if "num_records" in kept.column_names else None
        if counts is None or counts.null_count or (pc.sum(counts).as_py() or 0) > max_rows:
            return None
        data = pa.schema([f for f in spec.arrow_schema if f.name in columns and f.name not in spec.partition_by])
        paths = [str(p) for p in kept["path"].to_pylist()]
        return rows_since(self.files.read_columns(self.path(spec), paths, data), column, since)

    def read_windows(
        self, spec: TableSpec, column: str, after: datetime | None, values: Sequence[datetime] = ()
    ) -> DataFrame:
        return self._pruned(spec, column, in_windows(after, values)).where(windows_condition(column, after, values))

    def _pruned(self, spec: TableSpec, column: str, may_hold: MayHold) -> DataFrame:
        """The current files that may hold the rows asked for (:func:`kept_files`), scanned."""
        dt = self._readable(spec, self._table(spec))
        kept = kept_files(pa.table(dt.get_add_actions(flatten=True)), column, may_hold)
        # Data files have unique names (a uuid each): the kept ones are picked out of the URIs
        # delta-rs resolves by name, whatever the encoding of their partition folders.
        names = {p.rsplit("/", 1)[-1] for p in kept}
        uris = [u for u in dt.file_uris() if u.rsplit("/", 1)[-1] in names]
        return scan(self.spark, spec.schema, self.path(spec), uris)

    def read_changes(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> DataFrame:
        """The change feed as Delta defines it (:func:`~pipelines.storage.deltars_changes.read_changes`)."""
        return deltars_changes.read_changes(
            self.spark, spec, self.path(spec), self._files_of_changes(spec, start_version, end_version)
        )

    def held_changes(self, spec: TableSpec, start_version: int, end_version: int, columns: Sequence[str]) -> pa.Table:
        """The change feed in the driver, no Spark job (:func:`~pipelines.storage.deltars_changes.held_changes`)."""
        files = self._files_of_changes(spec, start_version, end_version)
        return deltars_changes.held_changes(self.files, spec, self.path(spec), files, columns)

    def _files_of_changes(
        self, spec: TableSpec, start_version: int, end_version: int | None
    ) -> deltars_changes.ChangeFiles:
        end = self.version(spec) if end_version is None else end_version
        if end is None:
            raise StorageError(f"table {spec.key} does not exist")
        self._readable(spec, self._table(spec))
        return deltars_changes.change_files(self.files.commits(self.path(spec), start_version, end))

    def version(self, spec: TableSpec) -> int | None:
        if not self.exists(spec):
            return None
        return self._table(spec).version()

    def history(self, spec: TableSpec, limit: int | None = None) -> list[dict[str, Any]]:
        return self._table(spec).history(limit)

    def txn_version(self, spec: TableSpec, app_id: str) -> int | None:
        if not self.exists(spec):
            return None
        return self._table(spec).transaction_version(app_id)

    def txn_snapshot(self, spec: TableSpec, app_ids: Sequence[str]) -> TxnSnapshot:
        dt = self._table(spec)
        return TxnSnapshot(dt.version(), {a: dt.transaction_version(a) for a in app_ids})

    def greatest(self, spec: TableSpec, column: str, buckets: Sequence[int] | None = None) -> Greatest | None:
        if not self.exists(spec):
            return Greatest(None)
        return deltars_stats.greatest(self._table(spec), spec, column, buckets)

    def stats(self, spec: TableSpec) -> TableStats:
        if not self.exists(spec):
            return TableStats(spec.key, None, 0, 0, None, None)
        return deltars_stats.table_stats(self._table(spec), spec)

    # -- maintenance -------------------------------------------------------------------------
    def optimize(self, spec: TableSpec) -> dict[str, Any]:
        dt, props = self._table(spec), bloom_writer_properties(spec.bloom_filter)  # rewritten files keep their filters
        if not spec.cluster_by:
            return dict(dt.optimize.compact(writer_properties=props))
        size = layout_bytes(spec, self.stats(spec))
        return dict(dt.optimize.z_order(list(spec.cluster_by), target_size=size, writer_properties=props))

    def vacuum(self, spec: TableSpec, retention_hours: int = 168) -> list[str]:
        removed = self._table(spec).vacuum(retention_hours=retention_hours, dry_run=False)
        return removed + self.files.clean_staging(self.path(spec), timedelta(hours=retention_hours))
