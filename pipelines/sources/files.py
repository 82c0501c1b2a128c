"""Files to land: JSON lines, a JSON array, or one JSON object per file.

Spark reads the files and splits them into records on the executors, so no file's rows pass
through the Python driver: the driver only hashes each file, streaming, for the digest that lands it
once, and looks at its first line to tell how Spark reads it:

- a file of JSON lines (its first non-blank line an object on a line of its own, and more after
  it) is read by Spark's text source, in splits that run side by side (a large file on every core);
- any other file (a JSON array, one object over several lines, one line, a file whose first line is
  no JSON) is read whole, by the ``binaryFile`` source, and split by one task.

- **JSON lines:** a record per non-blank line, its bytes as they came (a trailing ``\\r`` off).
- **One JSON object** (the whole file, pretty-printed or not): one record, the file's bytes
  without the whitespace around them.
- **A JSON array** (the whole file): a record per element, re-serialised compactly, since the
  array only delimits them. A ``null`` element is the record ``null``; a string element arrives
  without its quotes (it is not an object either way, so bronze quarantines it).

A line that is not JSON is still a record: bronze quarantines it. Each record keeps its position
among the file's records as its ``offset``. An empty file has no records: it is landed as a file
of none, so landing it again is a no-op. A compressed file (gzip, zstd, bzip2, xz, zip, by its
first bytes) is not read: :func:`compression_of` names it so the caller can refuse it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bronze.landing import LANDING_SCHEMA
from pipelines.errors import InputError
from pipelines.storage.conform import conform_df

#: What Python's ``bytes.strip()`` strips: a line of only these is blank.
WHITESPACE = " \t\n\r\x0b\x0c"
#: Hadoop reads these as glob syntax in a path; file names with them are escaped.
_GLOB = re.compile(r"([\\\[\]{}*?])")


@dataclass(frozen=True)
class LandingFile:
    path: Path  # absolute, as the landing rows name it (source_file)
    digest: str  # sha256 of the content: a file is landed once per content
    #: Whether the file is JSON lines that Spark's text source splits as :func:`_records` would
    #: (:func:`_is_json_lines`): read in splits side by side rather than whole.
    lines: bool = False

    @property
    def batch_id(self) -> str:
        return f"file:{self.digest[:16]}"


#: The first bytes of the compressed formats a data file may come in, and how to undo each.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"PK\x03\x04", "zip", "unzip"),
)


def compression_of(path: Path) -> str | None:
    """Why ``path`` cannot be landed as it is (``"gzip-compressed: gunzip it first"``), or None.

    Reads the file's first six bytes: a signature, not row data. A path that is not a file is
    :func:`file_digests`' to report."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except (FileNotFoundError, IsADirectoryError):
        return None
    for magic, name, undo in _COMPRESSED:
        if head.startswith(magic):
            return f"{name}-compressed: {undo} it first"
    return None


def _read(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    # file: and the path as it is (Hadoop takes it unencoded): the local files the driver hashed,
    # whatever the session's default file system is.
    return spark.read.format("binaryFile").load(["file://" + _GLOB.sub(r"\\\1", p) for p in paths])


#: Spark names a local file ``file:<absolute path>`` (``file:///<path>`` on some file systems),
#: the path as it is: not percent-encoded (a file named ``a%20b`` is ``file:/…/a%20b``).
_FILE_SCHEME = r"^file:(//)?"


def file_digests(paths: Sequence[Path]) -> list[LandingFile]:
    """The files to land with the sha256 of their content, in the order given (each path once).

    Hashed in the driver, streaming (nothing kept): the files are the driver's own, named by local
    path, and sha256 reads them at GB/s, where a Spark job to hash them was a query of its own on
    every ingest (1.4 s on a cold session). Spark reads their content for the rows.
    """
    wanted = list(dict.fromkeys(os.path.abspath(p) for p in paths))
    missing = [p for p in wanted if not Path(p).is_file()]
    if missing:
        raise InputError(f"{missing[0]}: no such file")
    found = []
    for p in wanted:
        try:
            with open(p, "rb") as f:
                digest, lines = _digest_and_form(f, p)
        except OSError as e:  # removed or made unreadable since the check above
            raise InputError(f"{p}: could not be read ({e.strerror or e})") from e
        found.append(LandingFile(Path(p), digest, lines))
    return found


#: How much of a file's start is looked at for its first line: a longer first line (a record of
#: over 1 MiB) leaves the file to be read whole.
_FIRST_LINE_BYTES = 1 << 20
#: File name endings Hadoop's text reader decompresses by (its codecs): such a file is read whole,
#: byte for byte, as any other.
_CODEC_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst", ".br", ".lzo", ".xz")


def _digest_and_form(f: BinaryIO, name: str) -> tuple[str, bool]:
    """The sha256 of a file's content, and whether it is JSON lines for Spark's text source, in one
    read of it: 1 MiB chunks, nothing kept but the first (a signature, not row data)."""
    sha = hashlib.sha256()
    head = b""
    first_end = -1  # where the first non-blank line ends in ``head`` (-1: not found yet)
    more = False  # a non-blank byte after it
    while chunk := f.read(1 << 20):
        sha.update(chunk)
        if first_end < 0 and len(head) < _FIRST_LINE_BYTES:
            head += chunk
            first_end = _first_line_end(head)
            if first_end >= 0:
                more = bool(head[first_end:].strip(WHITESPACE.encode()))
        elif first_end >= 0 and not more:
            more = bool(chunk.strip(WHITESPACE.encode()))
    if first_end < 0 or not more or name.lower().endswith(_CODEC_SUFFIXES):
        return sha.hexdigest(), False
    return sha.hexdigest(), _is_json_lines(head[:first_end])


def _first_line_end(head: bytes) -> int:
    """The end (at its ``\n``) of the first non-blank line of ``head``; -1 when ``head`` ends first."""
    start = 0
    while (end := head.find(b"\n", start)) >= 0:
        if head[start:end].strip(WHITESPACE.encode()):
            return end
        start = end + 1
    return -1


def _is_json_lines(first: bytes) -> bool:
    """Whether a file whose first non-blank line is ``first``, with more after it, is JSON lines to
    :func:`_records`: that line one JSON object. The file then cannot be one JSON value (a whole value
    followed by more), so it is split at every ``\n`` whatever a line holds; anything else (an array,
    an object over several lines) is left to :func:`_records` whole."""
    line = first.strip(WHITESPACE.encode())
    if not line.startswith(b"{"):
        return False
    try:
        json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return False
    return True


def _records(content: Column) -> Column:
    """The records of a file's content, as ``struct<encoding, records>``: an array of strings and
    the charset that turns each back into its bytes (see the module docstring).

    Built with as little per-record work as the forms allow: the records come out as text, split
    by one native function, and are turned back into bytes after they are exploded into rows,
    where the projection is compiled, not in a higher-order function per file."""
    # Latin-1 maps every byte to one character and back, so splitting and trimming the text keep
    # the bytes exactly as they came, invalid UTF-8 included (bronze quarantines those).
    text = F.decode(content, "ISO-8859-1")
    stripped = F.btrim(text, F.lit(WHITESPACE))
    # Spark's JSON readers stop after the first value, so "is the whole file one JSON value" is
    # asked by wrapping it in brackets: JSON lines then lack the commas and give null.
    whole = F.from_json(
        F.concat(F.lit("["), F.btrim(content.cast("string"), F.lit(WHITESPACE)), F.lit("]")), "array<string>"
    )
    one_value = F.size(whole) == 1
    first = F.substring(stripped, 1, 1)
    array = one_value & (first == "[")
    lines = F.filter(F.split(text, "\n"), lambda line: F.btrim(line, F.lit(WHITESPACE)) != "")
    elements = F.transform(F.from_json(whole[0], "array<string>"), lambda e: F.coalesce(e, F.lit("null")))
    records = F.when(array, elements).when(one_value & (first == "{"), F.array(stripped)).otherwise(lines)
    # An array's elements are text Spark re-serialised (UTF-8); the other records are Latin-1 bytes.
    encoding = F.when(array, F.lit("UTF-8")).otherwise(F.lit("ISO-8859-1"))
    return F.struct(encoding.alias("encoding"), records.alias("records"))


def _record_bytes(encoding: Column, record: Column) -> Column:
    """A record's bytes, from its text as :func:`_records` gives it (a JSON-lines record without
    the ``\r`` of a CRLF line end)."""
    return F.when(encoding == "UTF-8", F.encode(record, "UTF-8")).otherwise(
        F.encode(F.rtrim(record, F.lit("\r")), "ISO-8859-1")
    )


def landing_rows(spark: SparkSession, files: Sequence[LandingFile], now: datetime) -> DataFrame:
    """The landing rows (bronze input) of ``files``: one row per record with its file and position."""
    lines = [f for f in files if f.lines]
    whole = [f for f in files if not f.lines]
    parts = [rows(spark, group, now) for rows, group in ((_line_rows, lines), (_whole_rows, whole)) if group]
    return functools.reduce(DataFrame.unionByName, parts)


def _named(spark: SparkSession, files: Sequence[LandingFile]) -> DataFrame:
    return spark.createDataFrame([(str(f.path), f.batch_id) for f in files], "source_file string, batch_id string")


def _landing(rows: DataFrame, now: datetime) -> DataFrame:
    """Rows of ``value``, ``offset``, ``source_file`` and ``batch_id`` -> landing rows."""
    return conform_df(
        rows.select(
            "value", F.lit("file").alias("source"), "offset", "source_file", F.lit(now).alias("ingest_time"), "batch_id"
        ),
        LANDING_SCHEMA,
    )


def _whole_rows(spark: SparkSession, files: Sequence[LandingFile], now: datetime) -> DataFrame:
    """Files read whole (``binaryFile``), each split into its records by one task."""
    read = _read(spark, [str(f.path) for f in files])
    local = read.select(F.regexp_replace("path", _FILE_SCHEME, "").alias("source_file"), "path", "content")
    # A file Spark names otherwise than expected fails the read: its rows must not go unlanded
    # while its digest is recorded as landed.
    unmatched = F.concat(F.lit("Spark read a file as "), F.col("path"), F.lit(", which names no file to land"))
    content = local.join(F.broadcast(_named(spark, files)), "source_file", "left").where(
        F.when(F.col("batch_id").isNull(), F.raise_error(unmatched)).isNull()
    )
    split = content.select("source_file", "batch_id", _records(F.col("content")).alias("_r"))
    rows = split.select(
        "source_file",
        "batch_id",
        F.col("_r.encoding").alias("_encoding"),
        F.posexplode("_r.records").alias("offset", "_record"),
    ).select(_record_bytes(F.col("_encoding"), F.col("_record")).alias("value"), "offset", "source_file", "batch_id")
    return _landing(rows, now)


#: Where a line was read: the task, the file (as Spark names it) and the split of it.
_SPLIT = ("_task", "_path", "_block")


def _line_rows(spark: SparkSession, files: Sequence[LandingFile], now: datetime) -> DataFrame:
    """JSON-lines files read by Spark's text source, in splits that run side by side.

    Each non-blank line is a record; its ``offset``, its place among its file's records, is its
    split's first record's place plus its place in the split. Spark numbers the rows each task
    reads (``monotonically_increasing_id``: the task, then the row), and the same plan reads the
    same splits in the same tasks, so a first query counts each split's lines (one row per split,
    no line data) and the landing query adds them up: the read is the text scan twice, never a
    shuffle or a sort of the lines."""
    read = spark.read.option("lineSep", "\n").text(["file://" + _GLOB.sub(r"\\\1", str(f.path)) for f in files])
    text = F.decode(F.col("value").cast("binary"), "ISO-8859-1")  # a byte a character: bytes kept
    lines = read.where(F.btrim(text, F.lit(WHITESPACE)) != "").select(
        F.spark_partition_id().alias("_task"),
        F.col("_metadata.file_path").alias("_path"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_n"),
        F.col("value"),
    )
    # One row per split of a file: figures, not line data.
    splits = lines.groupBy(*_SPLIT).agg(F.min("_n").alias("_first"), F.count(F.lit(1)).alias("_lines")).collect()
    by_path = {str(f.path): f for f in files}
    placed = []
    for (task, path, block), first, n in sorted(
        ((r["_task"], r["_path"], r["_block"]), r["_first"], r["_lines"]) for r in splits
    ):
        local = unquote(re.sub(_FILE_SCHEME, "", path))  # a URI here, percent-encoded
        if local not in by_path:
            raise InputError(f"Spark read a file as {path}, which names no file to land")
        placed.append([task, path, block, first, n, local, by_path[local].batch_id])
    records_before: dict[str, int] = {}
    for split in sorted(placed, key=lambda p: (p[5], p[2])):  # a file's splits in the order of their bytes
        n, source = split[4], split[5]
        split[4] = records_before.get(source, 0)  # the records of the file's splits before this one
        records_before[source] = split[4] + n
    bases = spark.createDataFrame(
        placed, "_task int, _path string, _block long, _first long, _base long, source_file string, batch_id string"
    )
    raw = F.col("value").cast("binary")
    cr = F.encode(F.rtrim(F.decode(raw, "ISO-8859-1"), F.lit("\r")), "ISO-8859-1")  # a CRLF line's \r off
    return _landing(
        lines.join(F.broadcast(bases), list(_SPLIT)).select(
            F.when(F.col("value").endswith("\r"), cr).otherwise(raw).alias("value"),
            (F.col("_base") + F.col("_n") - F.col("_first")).alias("offset"),
            "source_file",
            "batch_id",
        ),
        now,
    )
