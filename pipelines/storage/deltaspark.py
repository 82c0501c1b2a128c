"""The ``delta-spark`` engine: Delta Lake on Spark, driven by Spark SQL and the DataFrame API only.

Everything goes through the session (SQL ``MERGE``/``DELETE``/``DESCRIBE``, DataFrame readers and
writers), never through the ``delta.tables`` JVM wrapper, so it runs the same on a classic session,
over Spark Connect and on Databricks. On a classic session with open-source Delta, a table's newest
version comes from Delta's log in the JVM (about 13 ms, against 0.3 s for ``DESCRIBE HISTORY``).

App transactions use Delta's idempotent-write options (``txnAppId``/``txnVersion`` on the writer
for appends, session confs for MERGE and DELETE), one per commit: a writer that records several
is given one combined id by its caller. Each such commit also writes its progress in its commit
info (:mod:`pipelines.storage.commit_progress`). Reading them back, Delta has no SQL for a
snapshot's app transactions: tables by name read that commit info through ``DESCRIBE HISTORY``,
never a path under ``_delta_log`` (Unity Catalog's managed tables keep commits a listing can
miss). By path, on a classic session with open-source Delta, the JVM's snapshot answers; elsewhere
the latest checkpoint and the commits after it (:class:`~pipelines.storage.delta_log.PathTxns`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pyarrow as pa
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config.spark import has_delta_classes, session_confs
from pipelines.errors import CommitConflictError, EngineUnavailableError, StorageError
from pipelines.storage import deltaspark_guards
from pipelines.storage.base import Data, Predicate, TableStore
from pipelines.storage.conform import clustered, conform_df
from pipelines.storage.delta_confs import (
    TXN_APP_CONF,
    TXN_VERSION_CONF,
    USER_METADATA_CONF,
    WRITE_CONFS,
    layout_confs,
    one_txn,
    optimize_sql,
)
from pipelines.storage.delta_log import jvm_delta_log
from pipelines.storage.deltaspark_txns import SparkTxns
from pipelines.storage.predicates import predicate_sql
from pipelines.storage.spark_sql import column_ddl, is_delta_conflict, merge_sql, quote, sql_string
from pipelines.storage.specs import AppTxn, TableSpec, TableStats, TxnSnapshot, layout_bytes

#: How long ensure() waits for a table another task is creating to show its first version.
ENSURE_WAIT_S = 30.0


class DeltaSparkStore(TableStore):
    engine = "delta-spark"
    max_txns_per_commit = 1

    def __init__(
        self,
        spark: SparkSession | None,
        lake_root: str,
        storage_options: Mapping[str, str] | None = None,
        catalog: str | None = None,
        schema: str | None = None,
        managed: bool = False,
    ):
        if (catalog is None) != (schema is None):
            raise StorageError("tables by name need both a catalog and a schema")
        if managed and catalog is None:
            raise StorageError("managed tables are tables by name: set a catalog and a schema")
        if spark is None:
            raise EngineUnavailableError("the delta-spark engine needs a SparkSession")
        super().__init__(spark, lake_root, storage_options)
        if not has_delta_classes(spark):
            raise EngineUnavailableError(
                "delta_engine=delta-spark needs the Delta Lake jars on the JVM classpath: set "
                "MEDALLION_DELTA_JARS to the delta-spark and delta-storage jars "
                "(on Databricks they are built in)"
            )
        for key, value in WRITE_CONFS.items():
            spark.conf.set(key, value)
        self.catalog, self.schema = catalog, schema
        #: Managed: the catalog creates and keeps the tables' files (no LOCATION, nothing under
        #: lake_root); external: the files are at <lake_root>/<layer>/<name>, named in the catalog.
        self.managed = managed
        self._registered: set[str] = set()
        self._existing: set[str] = set()  # locations that had a version: a table is not dropped under a run
        # Tables by name are read through the catalog only: Unity Catalog's managed tables keep
        # their commits where a listing of _delta_log can miss them (catalog-managed commits).
        self._delta_log = jvm_delta_log(spark) if catalog is None else None
        self.txns = SparkTxns(
            spark, catalog is not None, self.ident, self.location, self.version, self._history, lambda: self._delta_log
        )

    # -- naming -----------------------------------------------------------------------------
    def name(self, spec: TableSpec) -> str | None:
        """The table's catalog name, ``<catalog>.<schema>.<layer>_<name>`` (None: tables by path)."""
        if self.catalog is None or self.schema is None:
            return None
        return f"{quote(self.catalog)}.{quote(self.schema)}.{quote(spec.view_name)}"

    def ident(self, spec: TableSpec) -> str:
        """How SQL names the table: its catalog name, registered on first use, else its path."""
        name = self.name(spec)
        if name is None:
            return self._by_path(spec)
        if name not in self._registered:
            self._register(spec, name)
        return name

    def _by_path(self, spec: TableSpec) -> str:
        return f"delta.{quote(self.path(spec))}"

    def _register(self, spec: TableSpec, name: str) -> None:
        """Name the table in the catalog if its files exist but the catalog does not know it yet:
        an external table over ``<lake_root>/<layer>/<name>`` (a metastore that persists, Unity
        Catalog or Hive, knows it from then on; Spark's in-memory one, per session). A managed
        table is the catalog's own: nothing to register."""
        if not self.managed and not self.spark.catalog.tableExists(name.replace("`", "")):
            if self._newest_version(spec, self._by_path(spec)) is None:
                return  # no table yet: ensure() creates it by name
            self._ensure_schema()
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION {sql_string(self.path(spec))}")
        self._registered.add(name)

    def _ensure_schema(self) -> None:
        self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {quote(self.catalog or '')}.{quote(self.schema or '')}")

    def location(self, spec: TableSpec) -> str:
        """Where the table's files (and ``_delta_log``) are; for a managed table, which the
        catalog keeps where it chooses, its name."""
        name = self.name(spec)
        return name if self.managed and name is not None else self.path(spec)

    def _df(self, spec: TableSpec, data: Data) -> DataFrame:
        if isinstance(data, DataFrame):
            return conform_df(data, spec.schema)
        return self.to_spark(self.to_arrow(spec, data), spec.schema)

    def _txn_confs(self, spec: TableSpec, txn: AppTxn | None) -> Any:
        """The confs of a commit into ``spec`` that records ``txn`` (none: no app transaction)."""
        confs = layout_confs(spec)
        if txn is not None:
            confs.update(
                {
                    TXN_APP_CONF: txn.app_id,
                    TXN_VERSION_CONF: str(txn.version),
                    USER_METADATA_CONF: self.txns.metadata(spec, txn),
                }
            )
        return session_confs(self.spark, confs)

    @contextmanager
    def _conflicts(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            if is_delta_conflict(exc):
                raise CommitConflictError(f"{what} conflicted: {exc}") from exc
            raise

    def _history(self, ident: str, limit: int | None = None) -> DataFrame:
        """Commits of the table SQL calls ``ident``, newest first."""
        return self.spark.sql(f"DESCRIBE HISTORY {ident}" + (f" LIMIT {int(limit)}" if limit else ""))

    # -- lifecycle --------------------------------------------------------------------------
    def exists(self, spec: TableSpec) -> bool:
        # Asked once per table: by name a version() is a DESCRIBE HISTORY query, and every flow run ensures its tables.
        if self.location(spec) not in self._existing and self.version(spec) is not None:
            self._existing.add(self.location(spec))
        return self.location(spec) in self._existing

    def ensure(self, spec: TableSpec) -> bool:
        if self.exists(spec):
            return False
        name = self.name(spec)
        if name is not None:
            self._ensure_schema()
        parts = [f"CREATE TABLE IF NOT EXISTS {name or self._by_path(spec)} ({column_ddl(spec.schema)}) USING DELTA"]
        if spec.partition_by:
            parts.append("PARTITIONED BY (" + ", ".join(quote(c) for c in spec.partition_by) + ")")
        if spec.description:
            parts.append(f"COMMENT {sql_string(spec.description)}")
        props = spec.table_properties()
        if props:
            parts.append(
                "TBLPROPERTIES (" + ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in props.items()) + ")"
            )
        if name is not None and not self.managed:
            # External: the files stay at the lake path, whichever metastore names them.
            parts.append(f"LOCATION {sql_string(self.path(spec))}")
        # Tasks that start together (a for_each over buckets) race to create a table: a loser finds
        # it there, or (IF NOT EXISTS passing on a bare directory) waits for the winner's commit.
        deadline = time.monotonic() + ENSURE_WAIT_S
        while True:
            try:
                self.spark.sql(" ".join(parts))
            except Exception:
                if not self.exists(spec) and time.monotonic() > deadline:
                    raise
            if self.exists(spec):
                break
            if time.monotonic() > deadline:
                raise StorageError(f"table {spec.key}: CREATE TABLE passed but no version appeared")
            time.sleep(0.1)
        if name is not None:
            self._registered.add(name)
        return True

    # -- writes -----------------------------------------------------------------------------
    def append(
        self,
        spec: TableSpec,
        data: Data,
        txns: Sequence[AppTxn] = (),
        read_version: int | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> int:
        # A commit of the same app id after the write's snapshot fails in its own transaction, one
        # since read_version just before it; Delta commits inside the write (no before_commit).
        assert before_commit is None, "Delta on Spark commits inside its write (checks_before_commit)"
        deltaspark_guards.unmoved(self, self.txns, spec, txns, read_version)
        return self._write(spec, data, txns, "append")

    def overwrite(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = ()) -> int:
        return self._write(spec, data, txns, "overwrite")

    def _write(
        self, spec: TableSpec, data: Data, txns: Sequence[AppTxn], mode: str, replace_where: str | None = None
    ) -> int:
        txn = one_txn(txns)
        df = self._df(spec, data)
        if spec.cluster_by:  # the table's layout: sorted in files of file_rows (an optimized write would shuffle)
            df = clustered(df, spec.partition_by, spec.cluster_by)
        writer = df.write.format("delta").mode(mode)
        if replace_where is not None:
            writer = writer.option("replaceWhere", replace_where)
        if spec.cluster_by:
            writer = writer.option("optimizeWrite", "false")
        if spec.file_rows:
            writer = writer.option("maxRecordsPerFile", spec.file_rows)
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
            writer = writer.option("userMetadata", self.txns.metadata(spec, txn))
        what = f"{mode} of {spec.key}" if replace_where is None else f"replace in {spec.key}"
        with session_confs(self.spark, layout_confs(spec)), self._conflicts(what):
            self._save(spec, writer)
        return self._version(spec)

    def _save(self, spec: TableSpec, writer: Any) -> None:
        name = self.name(spec)
        if name is None:
            writer.save(self.path(spec))
        else:
            writer.saveAsTable(self.ident(spec))

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
        assert before_commit is None, "Delta on Spark commits inside its MERGE (checks_before_commit)"
        deltaspark_guards.unmoved(self, self.txns, spec, txns, read_version)  # as append's
        on = predicate_sql(self.spark, on, spec.schema, source)
        src = source if isinstance(source, DataFrame) else self.to_spark(source)
        if src.isEmpty():  # an empty MERGE may not commit: the progress is recorded alone
            return self.append(spec, spec.arrow_schema.empty_table(), txns)
        view = f"medallion_merge_source_{uuid4().hex}"
        src.createOrReplaceTempView(view)
        try:
            with self._txn_confs(spec, one_txn(txns)), self._conflicts(f"merge into {spec.key}"):
                self.spark.sql(merge_sql(self.ident(spec), view, on, update, insert, update_when))
        finally:
            self.spark.catalog.dropTempView(view)
        return self._version(spec)

    def replace(
        self, spec: TableSpec, data: Data, where: str, txns: Sequence[AppTxn] = (), read_version: int | None = None
    ) -> int:
        """Delta's ``replaceWhere``, recording the first of ``txns``. Delta on Spark records one app
        transaction per commit, so the others (guards) are checked, not recorded: read just before
        the write and again after it, a guard another writer moved since ``read_version`` fails the
        replace (after its commit, if it moved during the write: the caller's retry replaces again)."""
        mine, guards = list(txns[:1]), list(txns[1:])
        deltaspark_guards.hold(self, spec, guards, read_version)
        version = self._write(spec, data, mine, "overwrite", replace_where=where)
        deltaspark_guards.hold(self, spec, guards, read_version)
        if mine:
            deltaspark_guards.written(self, spec, mine[0])
        return version

    def delete(self, spec: TableSpec, predicate: Predicate, txns: Sequence[AppTxn] = ()) -> int:
        predicate = predicate_sql(self.spark, predicate, spec.schema)
        with self._txn_confs(spec, one_txn(txns)), self._conflicts(f"delete from {spec.key}"):
            self.spark.sql(f"DELETE FROM {self.ident(spec)} WHERE {predicate}")
        return self._version(spec)

    # -- reads ------------------------------------------------------------------------------
    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        if self.name(spec) is None:
            df = self.spark.read.format("delta").load(self.path(spec))
        else:
            df = self.spark.table(self.ident(spec))
        return df.where(where) if where else df

    def read_at(self, spec: TableSpec, version: int) -> DataFrame:
        pinned = self.spark.sql(f"SELECT * FROM {self.ident(spec)} VERSION AS OF {int(version)}")
        try:
            pinned.schema  # noqa: B018  (resolves the version: a vacuumed one fails here, not in a job)
        except AnalysisException as exc:
            raise StorageError(f"version {version} of {spec.key} is no longer readable: {exc}") from exc
        return pinned

    def read_since(self, spec: TableSpec, column: str, since: datetime) -> DataFrame:
        version = self._version(spec)
        pinned = self.spark.sql(f"SELECT * FROM {self.ident(spec)} VERSION AS OF {version}")
        return pinned.where(F.col(column) >= F.lit(since))

    def read_changes(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> DataFrame:
        end = self._version(spec) if end_version is None else end_version
        if start_version > end:  # nothing since: Delta's change feed refuses a start past the newest
            return self.read_changes(spec, end, end).where(F.lit(False))
        reader = (
            self.spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start_version)
        )
        reader = reader.option("endingVersion", end)
        return reader.load(self.path(spec)) if self.name(spec) is None else reader.table(self.ident(spec))

    def _last_commit_of(self, ident: str) -> Any:
        try:
            return self._history(ident, 1).first()
        except AnalysisException as exc:
            missing = ("DELTA_MISSING_DELTA_TABLE", "PATH_NOT_FOUND", "not a Delta table", "TABLE_OR_VIEW_NOT_FOUND")
            if any(s in str(exc) for s in missing):
                return None
            raise

    def _newest_version(self, spec: TableSpec, ident: str) -> int | None:
        """The newest version of the table SQL calls ``ident`` (at ``spec``'s location), None if
        there is none: from Delta's log in the JVM where it is at hand, else its newest commit."""
        if self._delta_log is not None:
            try:
                version = self._delta_log.version_of(self.location(spec))
            except Py4JJavaError:
                pass  # a Delta error (a log it cannot read): the SQL below says it as it would
            except Py4JError:
                self._delta_log = None  # not this Delta's API (another build): SQL from here on
            else:
                return None if version < 0 else version  # -1: no commit at that location
        last = self._last_commit_of(ident)
        return None if last is None else int(last["version"])

    def _version(self, spec: TableSpec) -> int:
        version = self.version(spec)
        if version is None:
            raise StorageError(f"table {spec.key} does not exist")
        return version

    def version(self, spec: TableSpec) -> int | None:
        # ident() first: a table by name is registered in the catalog on first use.
        return self._newest_version(spec, self.ident(spec))

    def history(self, spec: TableSpec, limit: int | None = None) -> list[dict[str, Any]]:
        # Commit metadata, newest first: one row per commit, not row data.
        return [row.asDict(recursive=True) for row in self._history(self.ident(spec), limit).collect()]

    def txn_version(self, spec: TableSpec, app_id: str) -> int | None:
        return self.txn_versions(spec, [app_id])[app_id]

    def txn_snapshot(self, spec: TableSpec, app_ids: Sequence[str]) -> TxnSnapshot:
        version = self.version(spec)
        if version is None:
            raise StorageError(f"table {spec.key} does not exist")
        return TxnSnapshot(version, self.txns.at(spec, version, app_ids))

    def txn_versions(self, spec: TableSpec, app_ids: Sequence[str]) -> dict[str, int | None]:
        version = self.version(spec)
        if version is None:
            return dict.fromkeys(app_ids)
        return self.txns.at(spec, version, app_ids)

    def streams_commit_files(self, spec: TableSpec) -> bool:
        return self.name(spec) is None  # by name, never through the log by path

    def stream_added(
        self, spec: TableSpec, version: int, columns: Sequence[str]
    ) -> AbstractContextManager[pa.RecordBatchReader]:
        if self.name(spec) is not None:
            raise StorageError(f"{spec.key} is read by name: a commit's files are not read from its log by path")
        return super().stream_added(spec, version, columns)

    def commit_of(self, spec: TableSpec, txn: AppTxn) -> int:
        if self.name(spec) is None:
            return super().commit_of(spec, txn)
        return self.txns.commit_of(spec, txn, self._version(spec))

    def stats(self, spec: TableSpec) -> TableStats:
        last = self._last_commit_of(self.ident(spec))  # Delta reads only the newest commit file
        if last is None:
            return TableStats(spec.key, None, 0, 0, None, None)
        ts = last["timestamp"].replace(tzinfo=UTC) if last["timestamp"] else None
        # Files from DESCRIBE DETAIL, rows from COUNT(*), which Delta answers from the log's
        # numRecords statistics without scanning data (spark.databricks.delta.optimizeMetadataQuery).
        detail = self.spark.sql(f"DESCRIBE DETAIL {self.ident(spec)}").select("numFiles", "sizeInBytes").first()
        counted = self.spark.sql(f"SELECT COUNT(*) AS n FROM {self.ident(spec)}").first()
        return TableStats(
            spec.key,
            int(last["version"]),
            int(counted["n"]) if counted else 0,
            int(detail["numFiles"]) if detail and detail["numFiles"] is not None else 0,
            ts if isinstance(ts, datetime) else None,
            last["operation"],
            int(detail["sizeInBytes"] or 0) if detail else 0,
        )

    def optimize(self, spec: TableSpec) -> dict[str, Any]:
        file_bytes = layout_bytes(spec, self.stats(spec)) if spec.cluster_by else None
        sql, confs = optimize_sql(self.ident(spec), spec, file_bytes)
        with session_confs(self.spark, confs):
            rows = self.spark.sql(sql).collect()  # one row of metrics
        return rows[0].asDict(recursive=True) if rows else {}

    def vacuum(self, spec: TableSpec, retention_hours: int = 168) -> list[str]:
        self.spark.sql(f"VACUUM {self.ident(spec)} RETAIN {int(retention_hours)} HOURS")
        return []
