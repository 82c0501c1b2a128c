"""The change feed of a table the delta-rs engine keeps, read from the files its commits name.

Delta's change feed: a commit that wrote change-data files is read from them (they carry each row's
change type); any other commit's added files are its inserts and its removed files its deletes.
Spark reads the files (:func:`read_changes`); a feed known to be small is read into the driver with
no Spark job (:func:`held_changes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from pipelines.storage.parquet_files import TableFiles, scan, with_file_columns
from pipelines.storage.specs import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, TableSpec

CHANGE_FIELDS = [StructField(COMMIT_VERSION, LongType()), StructField(COMMIT_TIMESTAMP, TimestampType())]
#: The files a change feed reads, by kind (``cdc``, ``insert``, ``delete``), each with its
#: commit's version and time.
ChangeFiles = dict[str, dict[str, tuple[int, datetime]]]


def change_files(commits: Iterable[tuple[int, list[dict[str, Any]]]]) -> ChangeFiles:
    """Commits (version, actions) -> the files their change feed reads (:data:`ChangeFiles`)."""
    groups: ChangeFiles = {"cdc": {}, "insert": {}, "delete": {}}
    for version, actions in commits:
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        ts = datetime.fromtimestamp(info.get("timestamp", 0) / 1000, tz=UTC)
        cdc = [a["cdc"] for a in actions if "cdc" in a]
        if cdc:
            for c in cdc:
                groups["cdc"][c["path"]] = (version, ts)
            continue
        for kind, action in (("insert", "add"), ("delete", "remove")):
            for a in actions:
                if action in a and a[action].get("dataChange", True):
                    groups[kind][a[action]["path"]] = (version, ts)
    return groups


def read_changes(spark: SparkSession, spec: TableSpec, table_uri: str, groups: ChangeFiles) -> DataFrame:
    """The change feed's rows, with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``."""
    parts = []
    data_fields = spec.schema.fields
    for kind, files in groups.items():
        if not files:
            continue
        base = table_uri + ("/_change_data" if kind == "cdc" else "")
        schema = spec.schema
        if kind == "cdc":  # change-data files carry their change type
            schema = StructType([*data_fields, StructField(CHANGE_TYPE, StringType())])
        uris = [f"{table_uri}/{p}" for p in files]
        rows = scan(spark, schema, base, uris)
        if kind != "cdc":
            rows = rows.withColumn(CHANGE_TYPE, F.lit(kind))
        by_name = {p.rsplit("/", 1)[-1]: v for p, v in files.items()}
        parts.append(with_file_columns(rows, spark, by_name, CHANGE_FIELDS))
    out_schema = StructType([*data_fields, StructField(CHANGE_TYPE, StringType()), *CHANGE_FIELDS])
    if not parts:
        return spark.createDataFrame([], out_schema)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.select(*out_schema.fieldNames())


def held_changes(
    files: TableFiles, spec: TableSpec, table_uri: str, groups: ChangeFiles, columns: Sequence[str]
) -> pa.Table:
    """The change feed's rows as :func:`read_changes` reads them, ``columns`` only (data columns,
    not partition ones, ``_change_type``, and ``_commit_version`` where asked for), read into the
    driver from the same files."""
    data = [f for f in spec.arrow_schema if f.name in columns and f.name not in spec.partition_by]
    schema = pa.schema([*data, pa.field(CHANGE_TYPE, pa.string())])
    versioned = COMMIT_VERSION in columns
    out = schema.append(pa.field(COMMIT_VERSION, pa.int64())) if versioned else schema
    parts = []
    for kind, named in groups.items():
        if not named:
            continue
        # A file at a time where each row says its commit's version, else a kind's files at once.
        for paths in [[p] for p in sorted(named)] if versioned else [sorted(named)]:
            read = files.read_columns(table_uri, paths, schema)
            if kind != "cdc":  # a commit's added or removed files: its inserts or deletes
                read = read.set_column(len(data), CHANGE_TYPE, pa.array([kind] * read.num_rows, pa.string()))
            if versioned:
                read = read.append_column(COMMIT_VERSION, pa.array([named[paths[0]][0]] * read.num_rows, pa.int64()))
            parts.append(read)
    return pa.concat_tables(parts) if parts else out.empty_table()
