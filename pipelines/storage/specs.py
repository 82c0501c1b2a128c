"""What a table is (:class:`TableSpec`) and what the store says of one: app transactions, their
snapshot, a table's figures, the change feed's columns, and which commits are replaces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

CDF_PROPERTY = "delta.enableChangeDataFeed"
#: Off for a clustered table: delta-spark's compaction after a write would pack its files' ranges
#: together (``maintain`` compacts it as it is laid out).
AUTO_COMPACT_PROPERTY = "delta.autoOptimize.autoCompact"
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
INSERTED = ("insert", "update_postimage")
#: :meth:`TableStore.inserted_stats` reads at most this many commits' log files; a longer range
#: (a job catching up) is bounded by a query of its rows instead.
STATS_COMMITS = 32


@dataclass(frozen=True)
class TableSpec:
    """What a table is: where it lives in the lake, its schema, partitioning and properties."""

    layer: str
    name: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    #: Columns each partition's rows are written sorted by, in files of at most ``file_rows`` rows
    #: (0: one file per writer task), so that each file holds a narrow range of them: a MERGE or
    #: a read for some windows skips the others' files (and row groups) by their statistics, and a
    #: MERGE rewrites a file of that range, not a partition whole. ``maintain`` keeps the layout.
    cluster_by: tuple[str, ...] = ()
    file_rows: int = 0
    #: Columns each Parquet row group carries a Bloom filter of (:mod:`pipelines.storage.bloom`),
    #: so that a read for a few of their values skips the row groups that hold none.
    bloom_filter: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.layer}/{self.name}"

    @property
    def view_name(self) -> str:
        return f"{self.layer.lstrip('_')}_{self.name}"

    @property
    def arrow_schema(self) -> pa.Schema:
        return to_arrow_schema(self.schema, timezone="UTC")

    def table_properties(self) -> dict[str, str]:
        laid_out = {AUTO_COMPACT_PROPERTY: "false"} if self.cluster_by else {}
        return {CDF_PROPERTY: "true", **laid_out, **self.properties}


@dataclass(frozen=True)
class AppTxn:
    """An app transaction: ``app_id`` has processed everything up to ``version``. ``once``: an id
    written once and never advanced (a landed file's content), which need not be carried forward."""

    app_id: str
    version: int
    once: bool = False


@dataclass(frozen=True)
class Greatest:
    """What a table's statistics bound a column by: ``value`` (None: the files hold no rows), as
    of ``version`` (None: the table does not exist yet)."""

    value: Any | None
    version: int | None = None


@dataclass(frozen=True)
class TxnSnapshot:
    """App-transaction versions as of one table version (the read version of a later write)."""

    table_version: int
    versions: Mapping[str, int | None]


@dataclass(frozen=True)
class TableStats:
    key: str
    version: int | None
    rows: int
    files: int
    last_write: datetime | None
    last_operation: str | None
    #: The size of the current version's data files.
    bytes: int = 0


def is_replace(commit_info: Mapping[str, Any]) -> bool:
    """Whether a commit's info (as the log or the history gives it) is a :meth:`TableStore.replace`:
    an overwrite of the rows where a predicate holds, on either engine."""
    params = commit_info.get("operationParameters") or {}
    return (
        commit_info.get("operation") == "WRITE"
        and params.get("mode") == "Overwrite"
        and params.get("predicate") not in (None, "", "[]")
    )


def layout_bytes(spec: TableSpec, stats: TableStats) -> int | None:
    """The size compaction cuts a clustered table's files at: ``file_rows`` rows at the bytes a row
    takes in its files now; None where the table sets no file size (or holds no rows)."""
    if not spec.file_rows or not stats.rows:
        return None
    return max(1, round(stats.bytes / stats.rows * spec.file_rows))
