"""Files are read and split into records by Spark: each case's records are written out by hand."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.errors import InputError
from pipelines.sources.files import file_digests, landing_rows

NOW = datetime(2026, 1, 1, tzinfo=UTC)

CASES: dict[str, tuple[bytes, list[bytes]]] = {
    # name: (content, the records it holds, in order)
    "lines.jsonl": (
        b'{"a": 1}\r\n\n   \n  {"b":2}  \n\xff\xfe not utf-8\n{"c":3}',
        [b'{"a": 1}', b'  {"b":2}  ', b"\xff\xfe not utf-8", b'{"c":3}'],
    ),
    "array.json": (
        b'\n[\n  {"a": 1, "b": "\xc3\xa9"},\n  null,\n  {"c": [1, 2]}\n]\n',
        [b'{"a":1,"b":"\xc3\xa9"}', b"null", b'{"c":[1,2]}'],
    ),
    "object.json": (
        b'\n  {\n  "a": {"b": 1},\n  "c": "d"\n}\n\n',
        [b'{\n  "a": {"b": 1},\n  "c": "d"\n}'],
    ),
    # Lines that each hold an array or an object are lines, not one document.
    "first line an array.jsonl": (b'[1, 2]\n{"a": 1}\n', [b"[1, 2]", b'{"a": 1}']),
    "objects on lines [1].jsonl": (b'{"a": 1}\n{"b": 2}\n', [b'{"a": 1}', b'{"b": 2}']),
    "empty.jsonl": (b"\n \n", []),
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, (content, _) in CASES.items():
        (tmp_path / name).write_bytes(content)
        out[name] = tmp_path / name
    return out


def test_spark_splits_each_kind_of_file_into_its_records(spark: SparkSession, files: dict[str, Path]) -> None:
    landing = file_digests(spark, list(files.values()))
    rows = landing_rows(spark, landing, NOW).collect()

    got: dict[str, list[tuple[int, bytes]]] = {str(p): [] for p in files.values()}
    for r in rows:
        assert (r["source"], r["topic"], r["partition"], r["kafka_timestamp"]) == ("file", None, None, None)
        assert r["ingest_time"] == NOW.replace(tzinfo=None) or r["ingest_time"].astimezone(UTC) == NOW
        got[r["source_file"]].append((r["offset"], bytes(r["value"])))
    for name, (_, records) in CASES.items():
        assert sorted(got[str(files[name])]) == list(enumerate(records)), name
    batch_ids = {r["source_file"]: r["batch_id"] for r in rows}
    for f in landing:
        if str(f.path) in batch_ids:
            assert batch_ids[str(f.path)] == f"file:{f.digest[:16]}"


def test_digests_are_the_sha256_of_each_file_in_the_order_given(spark: SparkSession, files: dict[str, Path]) -> None:
    paths = list(files.values())[::-1]
    landing = file_digests(spark, [*paths, paths[0]])  # a path given twice is read once
    assert [f.path for f in landing] == [p.absolute() for p in paths]
    assert [f.digest for f in landing] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_a_missing_file_is_an_input_error(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        file_digests(spark, [tmp_path / "nope.jsonl"])
