"""The storage contract: Delta tables at ``<lake_root>/<layer>/<table>``, behind one interface.

Two engines implement it: ``delta-rs`` (the ``deltalake`` package; Spark DataFrames cross via
Arrow) and ``delta-spark`` (the ``delta.tables`` API on the JVM). Jobs only ever talk to
:class:`TableStore`, so a job written once runs on a laptop and on a cluster.

Exactly-once bookkeeping uses Delta *app transactions*: a writer records ``app_id -> version``
in the same commit as its rows, and reads it back with :meth:`TableStore.txn_version` before
deciding what still needs doing.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines.errors import StorageError
from pipelines.storage.conform import conform
from pipelines.storage.parquet_files import AddedStats, TableFiles
from pipelines.storage.predicates import Predicate
from pipelines.storage.specs import (
    CHANGE_TYPE,
    COMMIT_VERSION,
    INSERTED,
    STATS_COMMITS,
    AppTxn,
    Greatest,
    TableSpec,
    TableStats,
    TxnSnapshot,
    is_replace,
)

T = TypeVar("T")

Data: TypeAlias = DataFrame | pa.Table


def windows_condition(column: str, after: datetime | None, values: Sequence[datetime]) -> Column:
    """``column`` later than ``after`` (None: never) or one of ``values`` (:meth:`TableStore.read_windows`)."""
    cond = F.col(column).isin(list(values)) if values else F.lit(False)
    return cond if after is None else cond | (F.col(column) > F.lit(after))


class TableStore(ABC):
    """Operations on the lake's Delta tables. Engines differ only in how they do them."""

    engine: str = ""
    #: How many app transactions one commit can record (None: any number).
    max_txns_per_commit: int | None = None
    #: Whether :meth:`append` can run a check after it has written a batch's files and before it
    #: commits them, and :meth:`merge` one after it has read its source and before it changes the
    #: table (``before_commit``): delta-rs commits files Spark wrote and merges a source Spark
    #: staged, while Delta on Spark commits inside the write or the MERGE, and its public API has
    #: no step between the two.
    checks_before_commit: bool = False
    #: Whether rows held in the driver (Arrow) are written there, with no Spark job (delta-rs).
    writes_in_driver: bool = False

    def __init__(self, spark: SparkSession | None, lake_root: str, storage_options: Mapping[str, str] | None = None):
        self._spark = spark
        # Spark and the driver's readers must name the same files: a local root is made absolute.
        self.lake_root = (lake_root if "://" in lake_root else os.path.abspath(lake_root)).rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.files = TableFiles(self.lake_root)

    @property
    def spark(self) -> SparkSession:
        """The session reads return DataFrames on (a store made without one can only write Arrow)."""
        if self._spark is None:
            raise StorageError("this storage operation needs a SparkSession; the store was opened without one")
        return self._spark

    def path(self, spec: TableSpec) -> str:
        return f"{self.lake_root}/{spec.layer}/{spec.name}"

    # -- lifecycle -------------------------------------------------------------------------
    @abstractmethod
    def exists(self, spec: TableSpec) -> bool: ...

    @abstractmethod
    def ensure(self, spec: TableSpec) -> bool:
        """Create the table if missing (schema, partitioning, CDF on). True when created now."""

    # -- writes ----------------------------------------------------------------------------
    @abstractmethod
    def append(
        self,
        spec: TableSpec,
        data: Data,
        txns: Sequence[AppTxn] = (),
        read_version: int | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> int:
        """Append rows and record ``txns`` in the same commit; return the new table version.

        With ``read_version`` the commit is checked against everything committed after that
        version: if another writer recorded one of the same app ids since, it fails with
        :class:`CommitConflictError`, so a check made at ``read_version`` still holds at commit.
        ``before_commit`` (only where :attr:`checks_before_commit`) runs once the rows are written
        and before they are committed: if it raises, the written files are removed and nothing is
        committed (a quality gate that counted the batch as it was written).
        """

    @abstractmethod
    def overwrite(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = ()) -> int:
        """Replace every row with ``data`` in one commit that also records ``txns`` (for small
        state tables that a job rewrites each run); return the new table version."""

    @abstractmethod
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
        """MERGE ``source`` (alias ``s``) into the table (alias ``t``) on ``on``: SQL text or a
        Column, as Delta's API takes it (see :func:`predicate_sql`). With ``read_version``, a writer
        that recorded one of ``txns``' app ids since fails it, as :meth:`append`'s.

        ``update`` maps target columns to SQL expressions for matched rows (``None``: update all
        columns from the source); ``insert`` likewise for unmatched rows (``None``: insert all).
        ``update_when`` updates only the matched rows where it holds (the others stay as they are).
        A source with no rows records ``txns`` alone (an empty MERGE may not commit).
        ``before_commit`` (only where :attr:`checks_before_commit`) runs once the source has been
        read, before the MERGE changes anything: if it raises, nothing is committed (a quality
        gate that counted the source as the MERGE read it, one pass instead of a cached one).
        """

    @abstractmethod
    def replace(
        self, spec: TableSpec, data: Data, where: str, txns: Sequence[AppTxn] = (), read_version: int | None = None
    ) -> int:
        """Replace the rows where ``where`` holds (SQL over the table's columns) with ``data``, whose
        rows all satisfy it, in one commit that records ``txns``; the change feed shows each row
        removed (``delete``) and added (``insert``). The new version.

        With ``read_version`` the commit is checked as :meth:`append`'s is: if a writer recorded one
        of ``txns``' app ids since, it fails with :class:`CommitConflictError`. A txn after the first
        may be another writer's, recorded again at the version read (a guard, not progress)."""

    @abstractmethod
    def delete(self, spec: TableSpec, predicate: Predicate, txns: Sequence[AppTxn] = ()) -> int:
        """Delete the rows where ``predicate`` holds (SQL text or a Column over the table's columns)."""

    # -- reads -----------------------------------------------------------------------------
    @abstractmethod
    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        """The current rows as a Spark DataFrame (``where``: an SQL predicate over the table)."""

    @abstractmethod
    def read_at(self, spec: TableSpec, version: int) -> DataFrame:
        """The rows as of ``version`` (time travel); :class:`StorageError` where that version's files
        are gone (vacuumed) or its log is."""

    def least(self, spec: TableSpec, column: str) -> Any:
        """The least ``column`` the table holds (None: no rows); one value, from the files'
        statistics where the engine has them. A timestamp is naive, in local time, as pyspark
        collects one."""
        found = self.read(spec).agg(F.min(column)).first()
        return found[0] if found else None

    def read_since(self, spec: TableSpec, column: str, since: datetime) -> DataFrame:
        """The current rows whose ``column`` is ``since`` or later, read from only the files whose
        statistics say they may hold such rows (Delta's data skipping on delta-spark). The frame
        stays at the version read: computed again after a later commit, it gives the same rows."""
        return self.read(spec).where(F.col(column) >= F.lit(since))

    def held_since(
        self, spec: TableSpec, column: str, since: datetime, columns: Sequence[str], max_rows: int
    ) -> pa.Table | None:
        """:meth:`read_since`'s rows, ``columns`` only (data columns, not partition ones), read
        into the driver with no Spark job where the files its statistics keep hold at most
        ``max_rows`` rows by the log's counts. None where they may hold more, where a kept file's
        count is unknown, or where the engine reads through Spark only (here)."""
        return None

    def read_windows(
        self, spec: TableSpec, column: str, after: datetime | None, values: Sequence[datetime] = ()
    ) -> DataFrame:
        """The current rows whose ``column`` is later than ``after`` (None: none is) or one of
        ``values``, read from only the files whose statistics say they may hold such rows (Delta's
        data skipping on delta-spark): a read of a few windows of a table laid out by window."""
        return self.read(spec).where(windows_condition(column, after, values))

    @abstractmethod
    def read_changes(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> DataFrame:
        """Change data feed rows of versions ``start..end`` (inclusive), with ``_change_type``,
        ``_commit_version`` and ``_commit_timestamp``."""

    def held_changes(
        self, spec: TableSpec, start_version: int, end_version: int, columns: Sequence[str]
    ) -> pa.Table | None:
        """The change feed of commits ``start..end``, ``columns`` only (data columns, not partition
        ones, ``_change_type``, and ``_commit_version`` where named), read into the driver with no
        Spark job: for a feed known to be small (:meth:`change_rows`). None where the engine reads
        it through Spark only (here)."""
        return None

    def read_inserted(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> DataFrame:
        """Rows that arrived (inserted, or the new image of updated rows) in ``start..end``: not
        those a :meth:`replace` put in, which were computed again from rows that had arrived before
        (a backfill's: it carries its range on to the tables downstream itself)."""
        changes = self.read_changes(spec, start_version, end_version)
        rows = changes.where(changes[CHANGE_TYPE].isin(*INSERTED))
        replaced = self.replaces(spec, start_version, end_version)
        return rows.where(~F.col(COMMIT_VERSION).isin(replaced)) if replaced else rows

    def replaces(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> list[int]:
        """The versions in ``start..end`` whose commits are replaces (:meth:`replace`), from the
        log's commit infos (one small file a commit; the history where the table is read by name)."""
        latest = self.version(spec)
        end = latest if end_version is None else end_version
        if latest is None or end is None or start_version > end:
            return []
        if self.streams_commit_files(spec):
            commits = self.files.commits(self.path(spec), start_version, end)
            infos: list[tuple[int, Mapping[str, Any]]] = [
                (v, next((a["commitInfo"] for a in actions if "commitInfo" in a), {})) for v, actions in commits
            ]
        else:  # newest first, one row per commit
            infos = [(int(h["version"]), h) for h in self.history(spec, latest - start_version + 1)]
        return sorted(v for v, info in infos if start_version <= v <= end and is_replace(info))

    def inserted_stats(self, spec: TableSpec, start_version: int, end_version: int) -> AddedStats | None:
        """What the statistics of the files commits ``start..end`` added say of the rows they
        inserted (how many, the earliest of each timestamp column), read from the log with no Spark
        job. None where the log does not say it cheaply: a table read through a catalog, a range of
        more than :data:`STATS_COMMITS` commits (one log file each), a commit that removed rows or
        wrote change files, an added file without statistics, a commit no longer in the log."""
        return self._from_log(
            spec,
            start_version,
            end_version,
            lambda uri: self.files.added_stats(uri, start_version, end_version, spec.schema),
        )

    def change_rows(self, spec: TableSpec, start_version: int, end_version: int) -> int | None:
        """The rows a read of the changes of commits ``start..end`` handles (a MERGE's change files,
        not the files it rewrote whole; an append's added rows), from the log and the change files'
        footers with no Spark job. None where the log does not say it cheaply, as for
        :meth:`inserted_stats`."""
        return self._from_log(
            spec, start_version, end_version, lambda uri: self.files.change_rows(uri, start_version, end_version)
        )

    def _from_log(
        self, spec: TableSpec, start_version: int, end_version: int, read: Callable[[str], T | None]
    ) -> T | None:
        """``read`` of the table's folder, where its log says commits ``start..end`` cheaply (a table
        by path, at most :data:`STATS_COMMITS` commits), else None; None too where it could not."""
        if not self.streams_commit_files(spec) or end_version - start_version + 1 > STATS_COMMITS:
            return None
        try:
            return read(self.path(spec))
        except (StorageError, OSError, ValueError, TypeError, KeyError):  # a commit gone or unread, statistics unread
            return None

    def greatest(self, spec: TableSpec, column: str, buckets: Sequence[int] | None = None) -> Greatest | None:
        """A bound no value of ``column`` in the table's rows is above (in ``buckets``' partitions
        only, when the table is partitioned by bucket; none or empty: every bucket), read from the
        files' statistics with no Spark job. None where the engine cannot tell without reading rows
        (here: always)."""
        return None

    @abstractmethod
    def version(self, spec: TableSpec) -> int | None:
        """The latest version, or None when the table does not exist."""

    @abstractmethod
    def history(self, spec: TableSpec, limit: int | None = None) -> list[dict[str, Any]]: ...

    @abstractmethod
    def txn_version(self, spec: TableSpec, app_id: str) -> int | None:
        """The version last recorded by ``app_id`` on this table, or None."""

    def txn_snapshot(self, spec: TableSpec, app_ids: Sequence[str]) -> TxnSnapshot:
        """The versions of ``app_ids`` read from one table version (see ``append(read_version=)``)."""
        version = self.version(spec)
        if version is None:
            raise StorageError(f"table {spec.key} does not exist")
        return TxnSnapshot(version, {a: self.txn_version(spec, a) for a in app_ids})

    @abstractmethod
    def stats(self, spec: TableSpec) -> TableStats: ...

    # -- maintenance -----------------------------------------------------------------------
    @abstractmethod
    def optimize(self, spec: TableSpec) -> dict[str, Any]:
        """Compact the table's small files; a clustered table's (``cluster_by``) files are
        rewritten sorted by its columns, in files of about ``file_rows`` rows, as its writes lay
        them out. Returns the engine's metrics."""

    @abstractmethod
    def vacuum(self, spec: TableSpec, retention_hours: int = 168) -> list[str]: ...

    def stream(self, df: DataFrame) -> AbstractContextManager[pa.RecordBatchReader]:
        """``df``'s rows as Arrow batches in the driver, one batch at a time (for driver-side sinks)."""
        return self.files.staged(df)

    def streams_commit_files(self, spec: TableSpec) -> bool:
        """Whether :meth:`stream_added` can read ``spec``'s commits: they are read from its log by
        path, which a table read through a catalog does not allow."""
        return True

    def stream_added(
        self, spec: TableSpec, version: int, columns: Sequence[str]
    ) -> AbstractContextManager[pa.RecordBatchReader]:
        """The rows commit ``version`` added, as Arrow batches in the driver, always in the same
        order (its files by path, each file's rows in order), with no Spark job: for a
        driver-side sink that must cut the same rows into the same chunks on a retry. Only where
        :meth:`streams_commit_files`."""
        return self.files.added(self.path(spec), version, columns)

    def commit_of(self, spec: TableSpec, txn: AppTxn) -> int:
        """The version whose commit recorded ``txn``, searched from the newest back (for a retry
        of the table's latest work, so a few commits at most)."""
        latest = self.version(spec)
        for version in range(-1 if latest is None else latest, -1, -1):
            ((_, actions),) = self.files.commits(self.path(spec), version, version)
            for a in actions:
                if a.get("txn", {}).get("appId") == txn.app_id and a["txn"].get("version") == txn.version:
                    return version
        raise StorageError(f"no commit of {spec.key} records {txn.app_id} at {txn.version}")

    # -- helpers shared by engines -----------------------------------------------------------
    def to_arrow(self, spec: TableSpec, data: Data) -> pa.Table:
        """Data conformed to the table's Arrow schema (column order and types)."""
        table = data if isinstance(data, pa.Table) else data.toArrow()
        return conform(table, spec.arrow_schema)

    def to_spark(self, table: pa.Table, schema: StructType | None = None) -> DataFrame:
        if table.num_rows == 0:
            if schema is None:
                from pyspark.sql.pandas.types import from_arrow_schema

                schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=False)
            return self.spark.createDataFrame([], schema)
        return self.spark.createDataFrame(table)
