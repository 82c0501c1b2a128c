"""Data files of a Delta table, moved by Spark and described for a log that someone else writes.

The ``delta-rs`` engine keeps the Delta log with the ``deltalake`` package but lets Spark move the
rows, so no batch passes through the Python driver: Spark writes Parquet into a staging folder of
the table, the files are moved beside the table's other files (hive-style partition folders), and
their add actions carry the statistics Delta readers skip files with, taken from the Parquet
footers. Reads go the other way: Spark's Parquet reader over the files a snapshot names, with the
partition values restored from the folders and, for change-feed reads, each file's commit version
joined on by file name (file names in a Delta table are unique: they carry a UUID).

Only metadata (file lists, footers, commit JSON lines) is handled in Python here.
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines.errors import StorageError
from pipelines.storage.bloom import bloom_filter_confs
from pipelines.storage.conform import clustered, conform, conform_df
from pipelines.storage.footers import footer_stats, partition_values

STAGING = "_staging"
#: Spark writes timestamps as INT96 by default; Delta (and delta-rs) want TIMESTAMP_MICROS.
PARQUET_CONFS = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
#: How the driver reads a stream of Parquet batches: one at a time. Arrow's scanner reads ahead 16
#: batches of 4 files by default, in threads: reading 12,800,000 rows in 8 files peaked at 816-856 MB
#: that way, 494-502 MB with no read-ahead (1,280,000 rows: 250 MB, 181 MB), in about the same time.
ONE_BATCH_AT_A_TIME: dict[str, Any] = {"use_threads": False, "batch_readahead": 0, "fragment_readahead": 0}


@dataclass(frozen=True)
class DataFile:
    """One Parquet file placed in a table, as its add action describes it."""

    path: str  # relative to the table root, with '/' separators
    size: int
    modification_time: int  # epoch milliseconds
    partition_values: Mapping[str, str | None]
    stats: str  # Delta statistics JSON


@dataclass(frozen=True)
class AddedStats:
    """What the statistics of the files some commits added say of the rows they added."""

    rows: int
    #: Per timestamp column, the least minimum of the files with rows (absent: one of them has none).
    earliest: Mapping[str, datetime]
    #: Per timestamp column, the greatest maximum of the files with rows (absent: one of them has none).
    latest: Mapping[str, datetime] = field(default_factory=dict)


def _timestamp(text: str) -> datetime:
    """A timestamp statistic as Delta writes it (``2026-11-26T10:00:00.123Z``, or with an offset)."""
    ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


class TableFiles:
    """The file system under one lake root, as pyarrow reaches it (local folders or object stores)."""

    def __init__(self, lake_root: str):
        self.fs: pafs.FileSystem
        self.root: str
        self.fs, self.root = pafs.FileSystem.from_uri(lake_root) if "://" in lake_root else _local(lake_root)
        self.root_uri = lake_root if "://" in lake_root else self.root

    def _fs_path(self, uri: str) -> str:
        return pafs.FileSystem.from_uri(uri)[1] if "://" in uri else uri

    def all_exist(self, uris: Iterable[str]) -> bool:
        """Whether every file of ``uris`` is still there (one listing of their metadata)."""
        paths = [self._fs_path(u) for u in uris]
        return all(i.type != pafs.FileType.NotFound for i in self.fs.get_file_info(paths)) if paths else True

    # -- writes -------------------------------------------------------------------------------
    def write(
        self,
        df: DataFrame,
        table_uri: str,
        schema: StructType,
        partition_by: Sequence[str],
        cluster_by: Sequence[str] = (),
        file_rows: int = 0,
        bloom_filter: Sequence[str] = (),
    ) -> list[DataFile]:
        """Write ``df`` as Parquet files of the table at ``table_uri``; return their add descriptions.

        Spark writes into a staging folder of its own (two concurrent writers of one table would
        otherwise share Hadoop's ``_temporary`` folder, and the first to finish deletes it), then
        the files move beside the table's others. Nothing is committed here: until the caller
        commits the add actions, the files are invisible to every Delta reader. ``cluster_by`` and
        ``file_rows``: the table's layout (:func:`clustered`); ``bloom_filter``: the columns whose
        row groups carry a Bloom filter (:mod:`pipelines.storage.bloom`).
        """
        staging = f"{table_uri}/{STAGING}/{uuid.uuid4().hex}"
        out = clustered(conform_df(df, schema), partition_by, cluster_by)
        writer = out.write.mode("overwrite")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if file_rows:
            writer = writer.option("maxRecordsPerFile", file_rows)
        writer = writer.options(**bloom_filter_confs(bloom_filter))
        _set_parquet_confs(df.sparkSession)
        try:
            writer.parquet(staging)
            return self._place(staging, table_uri, schema, partition_by)
        finally:
            self.delete_tree(staging)

    def _place(
        self, staging_uri: str, table_uri: str, schema: StructType, partition_by: Sequence[str]
    ) -> list[DataFile]:
        staging, table = self._fs_path(staging_uri), self._fs_path(table_uri)
        placed: list[DataFile] = []
        for info in self.fs.get_file_info(pafs.FileSelector(staging, recursive=True)):
            name = posixpath.basename(info.path)
            if info.type != pafs.FileType.File or not name.endswith(".parquet") or name.startswith((".", "_")):
                continue  # _SUCCESS, checksums
            rel = posixpath.relpath(info.path, staging)
            meta = pq.read_metadata(info.path, filesystem=self.fs)
            if meta.num_rows == 0:
                continue  # Spark writes one empty file for an empty frame; it would only be noise
            dest = f"{table}/{rel}"
            self.fs.create_dir(posixpath.dirname(dest), recursive=True)
            self.fs.move(info.path, dest)
            moved = self.fs.get_file_info(dest)
            placed.append(
                DataFile(
                    path=rel,
                    size=int(moved.size or 0),
                    modification_time=int((moved.mtime_ns or time.time_ns()) // 1_000_000),
                    partition_values=partition_values(rel, partition_by),
                    stats=json.dumps(footer_stats(meta, schema, partition_by)),
                )
            )
        return placed

    @contextmanager
    def staged(self, df: DataFrame, batch_rows: int = 65_536) -> Iterator[pa.RecordBatchReader]:
        """``df`` as a stream of Arrow batches in the driver, in ``df``'s order, one batch at a time.

        For the few consumers that must run in the driver (a MERGE by delta-rs, an insert into an
        embedded ClickHouse): Spark writes the rows as Parquet under the lake's staging folder and
        the driver reads them back batch by batch, so memory holds one batch, never the whole.
        """
        uri = f"{self.root_uri}/{STAGING}/stream-{uuid.uuid4().hex}"
        _set_parquet_confs(df.sparkSession)
        try:
            df.write.mode("overwrite").parquet(uri)
            path = self._fs_path(uri)
            names = sorted(
                i.path
                for i in self.fs.get_file_info(pafs.FileSelector(path))
                if i.path.endswith(".parquet") and not posixpath.basename(i.path).startswith((".", "_"))
            )
            if not names:
                yield pa.RecordBatchReader.from_batches(to_arrow_schema(df.schema, timezone="UTC"), [])
                return
            schema = pq.read_schema(names[0], filesystem=self.fs)
            dataset = pads.dataset(names, schema=schema, filesystem=self.fs, format="parquet")
            yield dataset.scanner(batch_size=batch_rows, **ONE_BATCH_AT_A_TIME).to_reader()
        finally:
            self.delete_tree(uri)

    def delete_files(self, table_uri: str, files: Iterable[DataFile]) -> None:
        """Remove written files that were never committed (the commit failed)."""
        table = self._fs_path(table_uri)
        for f in files:
            try:
                self.fs.delete_file(f"{table}/{f.path}")
            except (FileNotFoundError, OSError):
                pass

    def delete_tree(self, uri: str) -> None:
        try:
            self.fs.delete_dir(self._fs_path(uri))
        except (FileNotFoundError, OSError):
            pass

    def clean_staging(self, table_uri: str, older_than: timedelta) -> list[str]:
        """Staging folders left by writers that died before moving their files; returns those removed."""
        base = f"{self._fs_path(table_uri)}/{STAGING}"
        cutoff = time.time_ns() - int(older_than.total_seconds() * 1e9)
        removed = []
        for info in self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and (info.mtime_ns or 0) < cutoff:
                self.fs.delete_dir(info.path)
                removed.append(info.path)
        return removed

    @contextmanager
    def added(
        self, table_uri: str, version: int, columns: Sequence[str], batch_rows: int = 65_536
    ) -> Iterator[pa.RecordBatchReader]:
        """The rows commit ``version`` added to the table, as Arrow batches in the driver: its
        files in path order, each file's rows in their order, ``columns`` only.

        A table's files never change once written, so the same commit always streams the same
        rows in the same order (until VACUUM removes files it no longer holds), with no sort and
        no copy: a driver-side sink can cut it into chunks that a retry cuts alike.
        """
        base = self._fs_path(table_uri)
        names = [self._fs_path(p) if "://" in p else f"{base}/{p}" for p in self._added_paths(table_uri, version)]
        if not names:
            yield pa.RecordBatchReader.from_batches(pa.schema([]), [])
            return
        dataset = pads.dataset(names, filesystem=self.fs, format="parquet")
        yield dataset.scanner(columns=list(columns), batch_size=batch_rows, **ONE_BATCH_AT_A_TIME).to_reader()

    def added_local_paths(self, table_uri: str, version: int) -> list[str] | None:
        """The local paths of the files commit ``version`` added, in path order (None where the
        table is not on the local file system): for a reader that opens them itself."""
        if "://" in table_uri and not table_uri.startswith("file://"):
            return None
        paths = self._added_paths(table_uri, version)
        if any("://" in p for p in paths):
            return None
        return [f"{self._fs_path(table_uri)}/{p}" for p in paths]

    def _added_paths(self, table_uri: str, version: int) -> list[str]:
        """The paths commit ``version``'s add actions name (relative to the table, or absolute URIs),
        in path order."""
        ((_, actions),) = self.commits(table_uri, version, version)
        return sorted(unquote(a["add"]["path"]) for a in actions if "add" in a)

    def read_columns(self, table_uri: str, paths: Sequence[str], schema: pa.Schema) -> pa.Table:
        """The rows of the table's files ``paths`` (as its log names them) in the driver, conformed
        to ``schema`` (a column a file lacks is null): for a read known to be small, with no Spark
        job. Partition columns are not restored from their folders: leave them out of ``schema``."""
        base = self._fs_path(table_uri)
        tables = []
        for p in paths:
            name = self._fs_path(unquote(p)) if "://" in p else f"{base}/{unquote(p)}"
            file = pq.ParquetFile(name, filesystem=self.fs)
            tables.append(conform(file.read(columns=[c for c in schema.names if c in file.schema_arrow.names]), schema))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def added_stats(self, table_uri: str, start: int, end: int, schema: StructType) -> AddedStats | None:
        """The rows commits ``start..end`` added and the earliest of each timestamp column, from
        their add actions' statistics (no file is opened); None when the commits do not say it: a
        commit that removed rows or wrote change files, or an added file without statistics."""
        added = self._added_files(table_uri, start, end)
        if added is None:
            return None
        times = [f.name for f in schema.fields if isinstance(f.dataType, TimestampType)]
        bounds: tuple[dict[str, datetime], dict[str, datetime]] = ({}, {})
        unbounded: tuple[set[str], set[str]] = (set(), set())
        for stats in added:
            if not stats["numRecords"]:
                continue
            only_nulls = {n for n, c in (stats.get("nullCount") or {}).items() if c == stats["numRecords"]}
            for side, (key, pick) in enumerate((("minValues", min), ("maxValues", max))):
                values = stats.get(key) or {}
                for name in times:
                    if values.get(name) is not None:
                        at = _timestamp(values[name])
                        bounds[side][name] = pick(bounds[side].get(name, at), at)
                    elif name not in only_nulls:  # not only nulls (which no bound counts)
                        unbounded[side].add(name)
        rows = sum(int(stats["numRecords"]) for stats in added)
        earliest, latest = ({k: v for k, v in b.items() if k not in u} for b, u in zip(bounds, unbounded, strict=True))
        return AddedStats(rows, earliest, latest)

    def change_rows(self, table_uri: str, start: int, end: int) -> int | None:
        """The rows a read of the change feed of commits ``start..end`` handles: a commit's change
        files where it wrote any (a MERGE's updated rows, twice, and its inserts and deletes; their
        footers' row counts), else the rows its added files hold and its removed files held (their
        statistics). None when a file's count is not known."""
        base, total = self._fs_path(table_uri), 0
        for _, actions in self.commits(table_uri, start, end):
            changes = [unquote(a["cdc"]["path"]) for a in actions if "cdc" in a]
            if changes:  # the change feed reads these alone: not the whole files the commit rewrote
                names = [self._fs_path(p) if "://" in p else f"{base}/{p}" for p in changes]
                total += sum(pq.read_metadata(name, filesystem=self.fs).num_rows for name in names)
                continue
            for action in actions:
                file = action.get("add") or action.get("remove")
                if file is None or not file.get("dataChange", True):
                    continue
                stats = json.loads(file["stats"]) if file.get("stats") else {}
                if "numRecords" not in stats:
                    return None
                total += int(stats["numRecords"])
        return total

    def _added_files(self, table_uri: str, start: int, end: int) -> list[dict[str, Any]] | None:
        """The statistics of each data file commits ``start..end`` added; None when one has none
        (no ``numRecords``) or a commit removed rows or wrote change files."""
        added = []
        for _, actions in self.commits(table_uri, start, end):
            for action in actions:
                removes = "cdc" in action or ("remove" in action and action["remove"].get("dataChange", True))
                if removes:
                    return None
                add = action.get("add")
                if add is None or not add.get("dataChange", True):
                    continue
                stats = json.loads(add["stats"]) if add.get("stats") else {}
                if "numRecords" not in stats:
                    return None
                added.append(stats)
        return added

    # -- the log ------------------------------------------------------------------------------
    def commits(self, table_uri: str, start: int, end: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """The actions of each commit ``start..end`` (inclusive), read from the JSON log files."""
        log = f"{self._fs_path(table_uri)}/_delta_log"
        for version in range(start, end + 1):
            path = f"{log}/{version:020d}.json"
            try:
                with self.fs.open_input_stream(path) as stream:
                    text = stream.read().decode("utf-8")
            except FileNotFoundError as exc:
                raise StorageError(
                    f"commit {version} of {table_uri} is no longer in its log (log retention removed it); "
                    "a job that fell this far behind must be restarted from a full read"
                ) from exc
            yield version, [json.loads(line) for line in text.splitlines() if line.strip()]


def _set_parquet_confs(spark: SparkSession) -> None:
    for key, value in PARQUET_CONFS.items():
        spark.conf.set(key, value)


def _local(lake_root: str) -> tuple[pafs.FileSystem, str]:
    import os

    return pafs.LocalFileSystem(), os.path.abspath(lake_root)


# -- reads ------------------------------------------------------------------------------------
def scan(spark: SparkSession, schema: StructType, base_uri: str, files: Sequence[str]) -> DataFrame:
    """Spark's Parquet reader over ``files`` (absolute), partition columns restored from their
    hive-style folders under ``base_uri``, columns in ``schema``'s order."""
    if not files:
        return spark.createDataFrame([], schema)
    # delta-rs hands out URIs percent-encoded (a space as %20), while Hadoop's Path takes a path as
    # written and would look for a folder named "a%20b": decoded, a lake under any folder name reads.
    paths = [unquote(f) for f in files]
    df = spark.read.schema(schema).option("basePath", base_uri).parquet(*paths)
    return df.select(*schema.fieldNames())


def with_file_columns(
    df: DataFrame, spark: SparkSession, by_name: Mapping[str, tuple[Any, ...]], fields: Sequence[StructField]
) -> DataFrame:
    """``df`` plus ``fields`` looked up per row by the name of the file it came from."""
    lookup = spark.createDataFrame(
        [(name, *values) for name, values in by_name.items()],
        StructType([StructField("_file_name", StringType(), False), *fields]),
    )
    tagged = df.withColumn("_file_name", F.col("_metadata.file_name"))
    return tagged.join(F.broadcast(lookup), "_file_name").drop("_file_name")
