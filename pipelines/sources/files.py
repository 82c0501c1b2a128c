"""Files to land: JSON lines, a JSON array, or one JSON object per file.

Spark reads the files (its ``binaryFile`` source) and splits them into records on the executors,
so no file's rows pass through the Python driver: the driver only hashes each file, streaming, for
the digest that lands it once.

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

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

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
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as e:  # removed or made unreadable since the check above
            raise InputError(f"{p}: could not be read ({e.strerror or e})") from e
        found.append(LandingFile(Path(p), digest))
    return found


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
    names = spark.createDataFrame([(str(f.path), f.batch_id) for f in files], "source_file string, batch_id string")
    read = _read(spark, [str(f.path) for f in files])
    local = read.select(F.regexp_replace("path", _FILE_SCHEME, "").alias("source_file"), "path", "content")
    # A file Spark names otherwise than expected fails the read: its rows must not go unlanded
    # while its digest is recorded as landed.
    unmatched = F.concat(F.lit("Spark read a file as "), F.col("path"), F.lit(", which names no file to land"))
    content = local.join(F.broadcast(names), "source_file", "left").where(
        F.when(F.col("batch_id").isNull(), F.raise_error(unmatched)).isNull()
    )
    split = content.select("source_file", "batch_id", _records(F.col("content")).alias("_r"))
    rows = split.select(
        "source_file",
        "batch_id",
        F.col("_r.encoding").alias("_encoding"),
        F.posexplode("_r.records").alias("offset", "_record"),
    ).select(
        _record_bytes(F.col("_encoding"), F.col("_record")).alias("value"),
        F.lit("file").alias("source"),
        "offset",
        "source_file",
        F.lit(now).alias("ingest_time"),
        "batch_id",
    )
    return conform_df(rows, LANDING_SCHEMA)
