"""Files to land: JSON lines, a JSON array, or one JSON object per file.

Spark reads the files (its ``binaryFile`` source) and splits them into records on the executors,
so no file's bytes pass through the Python driver: the driver sees one digest per file.

- **JSON lines:** a record per non-blank line, its bytes as they came (a trailing ``\\r`` off).
- **One JSON object** (the whole file, pretty-printed or not): one record, the file's bytes
  without the whitespace around them.
- **A JSON array** (the whole file): a record per element, re-serialised compactly, since the
  array only delimits them. A ``null`` element is the record ``null``; a string element arrives
  without its quotes (it is not an object either way, so bronze quarantines it).

A line that is not JSON is still a record: bronze quarantines it. Each record keeps its position
among the file's records as its ``offset``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bronze.landing import LANDING_SCHEMA
from pipelines.errors import InputError
from pipelines.storage.base import conform_df

#: What Python's ``bytes.strip()`` strips: a line of only these is blank.
WHITESPACE = " \t\n\r\x0b\x0c"
#: Hadoop reads these as glob syntax in a path; file names with them are escaped.
_GLOB = re.compile(r"([\\\[\]{}*?])")


@dataclass(frozen=True)
class LandingFile:
    path: Path  # absolute, as the landing rows name it (source_file)
    uri: str  # as Spark names it
    digest: str  # sha256 of the content: a file is landed once per content

    @property
    def batch_id(self) -> str:
        return f"file:{self.digest[:16]}"


def _local(uri: str) -> str:
    return os.path.abspath(unquote(urlparse(uri).path)) if uri.startswith("file:") else uri


def _read(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    return spark.read.format("binaryFile").load([_GLOB.sub(r"\\\1", p) for p in paths])


def file_digests(spark: SparkSession, paths: Sequence[Path]) -> list[LandingFile]:
    """The files to land with the sha256 of their content, in the order given (each path once).

    Spark reads and hashes the files where they are; one small row per file comes back.
    """
    wanted = list(dict.fromkeys(os.path.abspath(p) for p in paths))
    missing = [p for p in wanted if not Path(p).is_file()]
    if missing:
        raise InputError(f"{missing[0]}: no such file")
    if not wanted:
        return []
    # One row per file (its path and digest): bookkeeping, not row data.
    rows = _read(spark, wanted).select("path", F.sha2("content", 256).alias("digest")).collect()
    by_path = {_local(r["path"]): (r["path"], r["digest"]) for r in rows}
    return [LandingFile(Path(p), *by_path[p]) for p in wanted]


def _records(content: Column) -> Column:
    """The records of a file's content, as an array of byte strings (see the module docstring)."""
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
    lines = F.filter(F.split(text, "\n"), lambda line: F.btrim(line, F.lit(WHITESPACE)) != "")
    return (
        F.when(
            one_value & (first == "["),
            F.transform(
                F.from_json(whole[0], "array<string>"),
                lambda e: F.encode(F.coalesce(e, F.lit("null")), "UTF-8"),
            ),
        )
        .when(one_value & (first == "{"), F.array(F.encode(stripped, "ISO-8859-1")))
        .otherwise(F.transform(lines, lambda line: F.encode(F.rtrim(line, F.lit("\r")), "ISO-8859-1")))
    )


def landing_rows(spark: SparkSession, files: Sequence[LandingFile], now: datetime) -> DataFrame:
    """The landing rows (bronze input) of ``files``: one row per record with its file and position."""
    names = spark.createDataFrame(
        [(f.uri, str(f.path), f.batch_id) for f in files], "path string, source_file string, batch_id string"
    )
    content = _read(spark, [str(f.path) for f in files]).join(F.broadcast(names), "path")
    rows = content.select(
        "source_file",
        "batch_id",
        F.posexplode(_records(F.col("content"))).alias("offset", "value"),
    ).select(
        "value",
        F.lit("file").alias("source"),
        "offset",
        "source_file",
        F.lit(now).alias("ingest_time"),
        "batch_id",
    )
    return conform_df(rows, LANDING_SCHEMA)
