"""Files are read and split into records by Spark: each case's records are written out by hand."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import cramjam
import pytest
from pyspark.sql import SparkSession

from pipelines.config.settings import Settings
from pipelines.config.spark import session_confs
from pipelines.errors import InputError
from pipelines.runtime import ingest
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_EVENTS, BRONZE_QUARANTINE
from pipelines.sources import files as files_module
from pipelines.sources.files import compression_of, file_digests, landing_rows
from pipelines.storage import open_store
from tests.pipelines.test_jobs import uuid, write_events

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
    "zero bytes.jsonl": (b"", []),  # Spark's binaryFile source lists no such file
    # Names Spark keeps as they are in its file paths (no percent-encoding): each file keeps its own rows.
    "a%20b.jsonl": (b'{"n": "percent"}\n', [b'{"n": "percent"}']),
    "a b.jsonl": (b'{"n": "space"}\n', [b'{"n": "space"}']),
    "a+b #1 \xe9t\xe9.jsonl": (b'{"n": "plus"}\n', [b'{"n": "plus"}']),
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, (content, _) in CASES.items():
        (tmp_path / name).write_bytes(content)
        out[name] = tmp_path / name
    return out


def test_spark_splits_each_kind_of_file_into_its_records(spark: SparkSession, files: dict[str, Path]) -> None:
    landing = file_digests(list(files.values()))
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


def test_a_json_lines_file_is_read_in_splits_and_each_record_keeps_its_place(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Written by hand: blank lines and a CRLF line across the splits of a file Spark reads in
    # 64-byte pieces (several per task, and two files in one task), and a plain text file
    # named like a compressed one, which is read whole.
    records = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * (i % 7)) for i in range(40)]
    content = b""
    for i, r in enumerate(records):
        content += r + (b"\r\n" if i % 5 == 0 else b"\n") + (b"  \n\n" if i % 3 == 0 else b"")
    big = tmp_path / "big.jsonl"
    big.write_bytes(content)
    small = tmp_path / "small.jsonl"
    small.write_bytes(b'{"s": 1}\n\n{"s": 2}\n')
    named = tmp_path / "named.jsonl.gz"
    named.write_bytes(b'{"g": 1}\n{"g": 2}\n')
    landing = file_digests([big, small, named])
    assert [f.lines for f in landing] == [True, True, False]
    confs = {"spark.sql.files.maxPartitionBytes": "64", "spark.sql.files.openCostInBytes": "0"}
    with session_confs(spark, confs):
        rows = landing_rows(spark, landing, NOW).collect()
    got: dict[str, list[tuple[int, bytes]]] = {str(p): [] for p in (big, small, named)}
    for r in rows:
        got[r["source_file"]].append((r["offset"], bytes(r["value"])))
    assert sorted(got[str(big)]) == list(enumerate(records))
    assert sorted(got[str(small)]) == [(0, b'{"s": 1}'), (1, b'{"s": 2}')]
    assert sorted(got[str(named)]) == [(0, b'{"g": 1}'), (1, b'{"g": 2}')]


def test_a_file_spark_names_otherwise_fails_the_read_rather_than_losing_its_rows(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    monkeypatch.setattr(files_module, "_FILE_SCHEME", "^$")  # as if Spark named it another way
    rows = landing_rows(spark, file_digests([path]), NOW)
    with pytest.raises(Exception, match=f"Spark read a file as file:{path}, which names no file to land"):
        rows.collect()


def test_digests_are_the_sha256_of_each_file_in_the_order_given(files: dict[str, Path]) -> None:
    paths = list(files.values())[::-1]
    landing = file_digests([*paths, paths[0]])  # a path given twice is read once
    assert [f.path for f in landing] == [p.absolute() for p in paths]
    assert [f.digest for f in landing] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_a_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        file_digests([tmp_path / "nope.jsonl"])


@pytest.fixture
def ctx(spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path) -> Context:
    settings = engine_settings(tmp_path / "lake")
    return Context(settings=settings, spark=spark, store=open_store(settings, spark))


def test_an_empty_file_lands_as_a_file_of_no_records_beside_the_others(ctx: Context, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    good = write_events(tmp_path / "good.jsonl", 1, 3)
    record = ingest.ingest_files(ctx, "events", [empty, good])
    assert (record.status, record.rows_in, record.rows_out, record.metrics["files"]) == ("ok", 3, 3, 2)
    again = ingest.ingest_files(ctx, "events", [empty, good])  # both recorded: nothing to do
    assert (again.status, again.metrics["files_skipped"]) == ("noop", 2)
    assert ctx.store.read(BRONZE_EVENTS).count() == 3


def test_a_file_s_rows_quarantine_and_repeated_keys_are_counted(ctx: Context, tmp_path: Path) -> None:
    # Written by hand: two events that repeat a key (at the top, inside properties) land, as
    # PostHog lands them, and are counted; a line that is not JSON is quarantined.
    base = '"event": "e", "team_id": 1, "distinct_id": "d", "timestamp": "2024-06-01T00:00:00Z"'
    lines = [
        f'{{"uuid": "{uuid(1, 1)}", {base}, "event": "again", "properties": {{"a": 1}}}}',
        f'{{"uuid": "{uuid(1, 2)}", {base}, "properties": {{"a": 1, "b": 2, "a": 3}}}}',
        f'{{"uuid": "{uuid(1, 3)}", {base}, "properties": {{"a": 1}}}}',
        "not json",
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    record = ingest.ingest_files(ctx, "events", [path])
    figures = (record.rows_in, record.rows_out, record.metrics["quarantined"], record.metrics["duplicate_keys"])
    assert figures == (4, 3, 1, 2)
    assert ctx.store.read(BRONZE_EVENTS).count() == 3
    assert ctx.store.read(BRONZE_QUARANTINE).count() == 1


def zipped(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("events.jsonl", data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("compress", "reason"),
    [
        (gzip.compress, "gzip-compressed: gunzip it first"),
        (lambda b: bytes(cramjam.zstd.compress(b)), "zstd-compressed: unzstd it first"),
        (bz2.compress, "bzip2-compressed: bunzip2 it first"),
        (lzma.compress, "xz-compressed: unxz it first"),
        (zipped, "zip-compressed: unzip it first"),
        (lambda b: b, None),
    ],
)
def test_compressed_files_are_told_by_their_first_bytes(
    tmp_path: Path, compress: Callable[[bytes], bytes], reason: str | None
) -> None:
    path = tmp_path / "events.jsonl"  # the name says nothing; the bytes do
    path.write_bytes(compress(b'{"a": 1}\n'))
    assert compression_of(path) == reason


def test_a_compressed_file_is_refused_by_name_and_the_others_land(ctx: Context, tmp_path: Path) -> None:
    good = write_events(tmp_path / "good.jsonl", 1, 2)
    packed = tmp_path / "more.jsonl.gz"
    packed.write_bytes(gzip.compress(write_events(tmp_path / "more.jsonl", 1, 5).read_bytes()))
    with pytest.raises(InputError) as refused:
        ingest.ingest_files(ctx, "events", [packed, good])
    assert (
        str(refused.value)
        == f"{packed}: not landed, gzip-compressed: gunzip it first; the other files were landed (ok)"
    )
    assert refused.value.exit_code == 2
    assert ctx.store.read(BRONZE_EVENTS).count() == 2
    assert ctx.store.read(BRONZE_QUARANTINE).count() == 0
