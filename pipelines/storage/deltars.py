"""The ``delta-rs`` engine (package ``deltalake``): the local default and what CI tests.

Spark computes; rows cross to and from delta-rs as Arrow tables. App transactions go into
``CommitProperties(app_transactions=...)`` so they land in the same commit as the rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from pyspark.sql import DataFrame

from pipelines.errors import CommitConflictError, StorageError
from pipelines.storage.base import (
    AppTxn,
    Data,
    TableSpec,
    TableStats,
    TableStore,
    TxnSnapshot,
    arrow_for_spark,
    conform,
)

# delta-rs resolves non-conflicting concurrent commits itself; these are its retries.
MAX_COMMIT_RETRIES = 15


def _commit_properties(txns: Sequence[AppTxn], operation: str | None = None) -> CommitProperties:
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return CommitProperties(
        app_transactions=[Transaction(t.app_id, t.version, now_ms) for t in txns] or None,
        max_commit_retries=MAX_COMMIT_RETRIES,
        custom_metadata={"medallion.operation": operation} if operation else None,
    )


class DeltaRsStore(TableStore):
    engine = "delta-rs"

    def _table(self, spec: TableSpec) -> DeltaTable:
        try:
            return DeltaTable(self.path(spec), storage_options=self.storage_options or None)
        except TableNotFoundError as exc:
            raise StorageError(f"table {spec.key} does not exist at {self.path(spec)}") from exc

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

    def append(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = (), read_version: int | None = None) -> int:
        target: str | DeltaTable = self.path(spec)
        if read_version is not None:
            # Writing through a snapshot makes delta-rs check later commits for the same app ids.
            target = DeltaTable(self.path(spec), version=read_version, storage_options=self.storage_options or None)
        return self._write(spec, data, txns, "append", target)

    def overwrite(self, spec: TableSpec, data: Data, txns: Sequence[AppTxn] = ()) -> int:
        return self._write(spec, data, txns, "overwrite", self.path(spec))

    def _write(
        self, spec: TableSpec, data: Data, txns: Sequence[AppTxn], mode: Literal["append", "overwrite"], target: Any
    ) -> int:
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
        return self._table(spec).version()

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
        src = source if isinstance(source, pa.Table) else source.toArrow()
        merger = self._table(spec).merge(
            source=src,
            predicate=on,
            source_alias="s",
            target_alias="t",
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

    def delete(self, spec: TableSpec, predicate: str, txns: Sequence[AppTxn] = ()) -> int:
        dt = self._table(spec)
        try:
            dt.delete(predicate, commit_properties=_commit_properties(txns, "delete"))
        except CommitFailedError as exc:
            raise CommitConflictError(f"delete from {spec.key} conflicted: {exc}") from exc
        return self._table(spec).version()

    def read(self, spec: TableSpec, where: str | None = None) -> DataFrame:
        return self.to_spark(self.read_arrow(spec, where), spec.schema)

    def read_arrow(self, spec: TableSpec, where: str | None = None) -> pa.Table:
        dt = self._table(spec)
        if where is None:
            table = dt.to_pyarrow_dataset().to_table()
        else:
            reader = QueryBuilder().register("t", dt).execute(f"SELECT * FROM t WHERE {where}")
            table = pa.table(reader)
        return conform(arrow_for_spark(table), spec.arrow_schema)

    def read_changes(self, spec: TableSpec, start_version: int, end_version: int | None = None) -> DataFrame:
        dt = self._table(spec)
        table = arrow_for_spark(pa.table(dt.load_cdf(starting_version=start_version, ending_version=end_version)))
        data = conform(table, spec.arrow_schema)
        for name in ("_change_type", "_commit_version", "_commit_timestamp"):
            data = data.append_column(table.schema.field(name), table.column(name))
        from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

        schema = StructType(
            [
                *spec.schema.fields,
                StructField("_change_type", StringType()),
                StructField("_commit_version", LongType()),
                StructField("_commit_timestamp", TimestampType()),
            ]
        )
        return self.to_spark(data, schema)

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

    def stats(self, spec: TableSpec) -> TableStats:
        if not self.exists(spec):
            return TableStats(spec.key, None, 0, 0, None, None)
        dt = self._table(spec)
        actions = dt.get_add_actions(flatten=True)
        actions_t = pa.table(actions)
        rows = actions_t.column("num_records").to_pylist() if "num_records" in actions_t.column_names else []
        last = dt.history(1)
        ts = datetime.fromtimestamp(last[0]["timestamp"] / 1000, tz=UTC) if last else None
        return TableStats(
            spec.key,
            dt.version(),
            sum(r or 0 for r in rows),
            actions_t.num_rows,
            ts,
            last[0].get("operation") if last else None,
        )

    def optimize(self, spec: TableSpec) -> dict[str, Any]:
        return dict(self._table(spec).optimize.compact())

    def vacuum(self, spec: TableSpec, retention_hours: int = 168) -> list[str]:
        return self._table(spec).vacuum(retention_hours=retention_hours, dry_run=False)
