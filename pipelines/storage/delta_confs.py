"""The confs and statements of Delta on Spark that the delta-spark engine sets: its writes' file
sizes, a commit's app transaction, and a clustered table's layout (``TableSpec.cluster_by``)."""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.errors import StorageError
from pipelines.storage.bloom import bloom_filter_confs
from pipelines.storage.spark_sql import quote
from pipelines.storage.specs import AppTxn, TableSpec

TXN_APP_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
AUTO_COMPACT_CONF = "spark.databricks.delta.autoCompact.enabled"
MAX_RECORDS_PER_FILE_CONF = "spark.sql.files.maxRecordsPerFile"
#: The size OPTIMIZE cuts files at (1 GB by default).
OPTIMIZE_MAX_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
#: File sizes under control: writes bin-pack by partition, and tables that grow by small commits
#: are compacted after a write once they have enough small files.
WRITE_CONFS = {"spark.databricks.delta.optimizeWrite.enabled": "true", AUTO_COMPACT_CONF: "true"}


def layout_confs(spec: TableSpec) -> dict[str, str]:
    """A clustered table's writes skip the compaction after a write (which would pack its files'
    ranges together; the session's conf outranks the table's property): ``maintain`` compacts it.
    Its MERGEs cut the files they write at ``file_rows`` too (Spark's writer takes the session's
    conf where no write option says it)."""
    confs = {AUTO_COMPACT_CONF: "false"} if spec.cluster_by else {}
    confs.update(bloom_filter_confs(spec.bloom_filter))  # Delta's writer hands the session's confs to Parquet's
    if spec.cluster_by and spec.file_rows:
        confs[MAX_RECORDS_PER_FILE_CONF] = str(spec.file_rows)
    return confs


def optimize_sql(ident: str, spec: TableSpec, file_bytes: int | None) -> tuple[str, dict[str, str]]:
    """The OPTIMIZE of table ``ident`` and the confs it runs with: a clustered table's is a ZORDER
    BY its columns, cutting files at ``file_bytes`` (:func:`pipelines.storage.base.layout_bytes`)."""
    sql, confs = f"OPTIMIZE {ident}", bloom_filter_confs(spec.bloom_filter)
    if spec.cluster_by:
        sql += " ZORDER BY (" + ", ".join(quote(c) for c in spec.cluster_by) + ")"
        if file_bytes is not None:
            confs[OPTIMIZE_MAX_FILE_SIZE] = str(file_bytes)
    return sql, confs


def one_txn(txns: Sequence[AppTxn]) -> AppTxn | None:
    """The one app transaction a delta-spark commit records (none: None); more is an error."""
    if len(txns) > 1:
        raise StorageError(
            "the delta-spark engine records one app transaction per commit; "
            f"got {len(txns)} ({', '.join(t.app_id for t in txns)})"
        )
    return txns[0] if txns else None
