"""The ``delta-spark`` engine: the ``delta.tables`` API, for clusters whose classpath has Delta.

App transactions use Delta's idempotent-write options: ``txnAppId``/``txnVersion`` on the
DataFrame writer for appends, and the ``spark.databricks.delta.write.txnAppId``/``txnVersion``
session confs for MERGE and DELETE. Delta records one app transaction per commit this way, so a
writer that must record several (one per Kafka partition) is given one combined id by its caller.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.errors import CommitConflictError, EngineUnavailableError, StorageError
from pipelines.spark import has_delta_classes
from pipelines.storage.base import AppTxn, Data, TableSpec, TableStats, TableStore, conform_df

TXN_APP_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
#: File sizes under control: writes bin-pack by partition, and tables that grow by small commits
#: are compacted after a write once they have enough small files.
WRITE_CONFS = {
    "spark.databricks.delta.optimizeWrite.enabled": "true",
    "spark.databricks.delta.autoCompact.enabled": "true",
}


def _one_txn(txns: Sequence[AppTxn]) -> AppTxn | None:
    if len(txns) > 1:
        raise StorageError(
            "the delta-spark engine records one app transaction per commit; "
            f"got {len(txns)} ({', '.join(t.app_id for t in txns)})"
        )
    return txns[0] if txns else None


class DeltaSparkStore(TableStore):
    engine = "delta-spark"
    max_txns_per_commit = 1

    def __init__(self, spark: SparkSession | None, lake_root: str, storage_options: Mapping[str, str] | None = None):
        if spark is None:
            raise EngineUnavailableError("the delta-spark engine needs a SparkSession")
        super().__init__(spark, lake_root, storage_options)
        if not has_delta_classes(spark):
            raise EngineUnavailableError(
                "delta_engine=delta-spark needs the Delta Lake jars on the JVM classpath: set "
                "MEDALLION_DELTA_JARS to the delta-spark and delta-storage jars "
                "(on Databricks they are built in)"
            )
        from delta.tables import DeltaTable

        self._DeltaTable = DeltaTable
        for key, value in WRITE_CONFS.items():
            spark.conf.set(key, value)

    def _table(self, spec: TableSpec) -> Any:
        return self._DeltaTable.forPath(self.spark, self.path(spec))

    def _df(self, spec: TableSpec, data: Data) -> DataFrame:
        if isinstance(data, DataFrame):
            return conform_df(data, spec.schema)
        return self.to_spark(self.to_arrow(spec, data), spec.schema)

    @contextmanager
    def _txn_confs(self, txn: AppTxn | None) -> Iterator[None]:
        if txn is None:
            yield
            return
        self.spark.conf.set(TXN_APP_CONF, txn.app_id)
        self.spark.conf.set(TXN_VERSION_CONF, str(txn.version))
        try:
            yield
        finally:
            self.spark.conf.unset(TXN_APP_CONF)
            self.spark.conf.unset(TXN_VERSION_CONF)

    @contextmanager
    def _conflicts(self, what: str) -> Iterator[None]:
        from delta.exceptions import (
            ConcurrentAppendException,
            ConcurrentDeleteReadException,
            ConcurrentTransactionException,
            ConcurrentWriteException,
            MetadataChangedException,
        )

        try:
            yield
        except (
            ConcurrentAppendException,
            ConcurrentDeleteReadException,
            ConcurrentTransactionException,
            ConcurrentWriteException,
            MetadataChangedException,
        ) as exc:
            raise CommitConflictError(f"{what} conflicted: {exc}") from exc

    def exists(self, spec: TableSpec) -> bool:
        return bool(self._DeltaTable.isDeltaTable(self.spark, self.path(spec)))

    def ensure(self, spec: TableSpec) -> bool:
        if self.exists(spec):
            return False
        builder = self._DeltaTable.createIfNotExists(self.spark).location(self.path(spec)).addColumns(spec.schema)
        if spec.partition_by:
            builder = builder.partitionedBy(*spec.partition_by)
        for key, value in spec.table_properties().items():
            builder = builder.property(key, value)
        if spec.description:
            builder = builder.comment(spec.description)
        builder.execute()
        return True

    def append(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = (), read_version: int | None = None) -> int:
        # Delta reads the app id's version inside the write's own transaction, so a concurrent
        # commit of the same app id fails with ConcurrentTransactionException; read_version adds
        # nothing here.
        return self._write(spec, data, txns, "append")

    def overwrite(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = ()) -> int:
        return self._write(spec, data, txns, "overwrite")

    def _write(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn], mode: str) -> int:
        txn = _one_txn(txns)
        writer = self._df(spec, data).write.format("delta").mode(mode)
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        with self._conflicts(f"{mode} of {spec.key}"):
            writer.save(self.path(spec))
        return self._version(spec)

    def merge(
        self,
        spec: TableSpec,
        source: Data,
        on: str,
        update: Mapping[str, str] | None = None,
        insert: Mapping[str, str] | None = None,
        txns: Sequence[AppTxn] = (),
        update_when: str | None = None,
    ) -> int:
        src = source if isinstance(source, DataFrame) else self.to_spark(source)
        builder = self._table(spec).alias("t").merge(src.alias("s"), on)
        builder = (
            builder.whenMatchedUpdateAll(condition=update_when)
            if update is None
            else builder.whenMatchedUpdate(condition=update_when, set=dict(update))
        )
        builder = (
            builder.whenNotMatchedInsertAll() if insert is None else builder.whenNotMatchedInsert(values=dict(insert))
        )
        with self._txn_confs(_one_txn(txns)), self._conflicts(f"merge into {spec.key}"):
            builder.execute()
        return self._version(spec)

    def delete(self, spec: TableSpec, predicate: str, txns: Sequence[AppTxn] = ()) -> int:
        with self._txn_confs(_one_txn(txns)), self._conflicts(f"delete from {spec.key}"):
            self._table(spec).delete(predicate)
        return self._version(spec)

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        df = self.spark.read.format("delta").load(self.path(spec))
        return df.where(where) if where else df

    def read_changes(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> DataFrame:
        reader = (
            self.spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start_version)
        )
        if end_version is not None:
            reader = reader.option("endingVersion", end_version)
        return reader.load(self.path(spec))

    def _snapshot(self, spec: TableSpec) -> Any:
        """The JVM DeltaLog's current snapshot: the version and app transactions without a Spark job."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, self.path(spec))
        return delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())

    def _version(self, spec: TableSpec) -> int:
        return int(self._snapshot(spec).version())

    def version(self, spec: TableSpec) -> int | None:
        return self._version(spec) if self.exists(spec) else None

    def history(self, spec: TableSpec, limit: int | None = None) -> list[dict[str, Any]]:
        df = self._table(spec).history(limit) if limit else self._table(spec).history()
        return [row.asDict(recursive=True) for row in df.collect()]

    def txn_version(self, spec: TableSpec, app_id: str) -> int | None:
        if not self.exists(spec):
            return None
        # Delta keeps the latest version of every app id in the snapshot's SetTransaction actions;
        # the Python API does not expose them, so ask the JVM DeltaLog for the current snapshot.
        found = self._snapshot(spec).transactions().get(app_id)
        return int(found.get()) if found.isDefined() else None

    def stats(self, spec: TableSpec) -> TableStats:
        if not self.exists(spec):
            return TableStats(spec.key, None, 0, 0, None, None)
        last = self._table(spec).history(1).first()
        ts = last["timestamp"].replace(tzinfo=UTC) if last and last["timestamp"] else None
        # Rows and files from the log's add actions (their numRecords statistics), never a scan.
        files = DataFrame(self._snapshot(spec).allFiles().toDF(), self.spark)
        counted = files.agg(
            F.coalesce(F.sum(F.get_json_object("stats", "$.numRecords").cast("long")), F.lit(0)).alias("n"),
            F.count(F.lit(1)).alias("f"),
        ).first()
        n_rows, n_files = (int(counted["n"]), int(counted["f"])) if counted else (0, 0)
        return TableStats(
            spec.key,
            int(last["version"]) if last else None,
            n_rows,
            n_files,
            ts if isinstance(ts, datetime) else None,
            last["operation"] if last else None,
        )

    def optimize(self, spec: TableSpec) -> dict[str, Any]:
        rows = self._table(spec).optimize().executeCompaction().collect()
        return rows[0].asDict(recursive=True) if rows else {}

    def vacuum(self, spec: TableSpec, retention_hours: int = 168) -> list[str]:
        self._table(spec).vacuum(float(retention_hours))
        return []
