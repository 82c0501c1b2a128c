"""Repeats by event identity, on hand-made rows: which copy is kept and which are dropped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import SparkSession

from silver.dedup import (
    REPEAT,
    first_copies,
    held_repeats,
    held_suspects,
    mark_repeats,
    recent_identities,
    suspects,
)

T0 = datetime(2024, 6, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
COLUMNS = "team_id long, uuid string, timestamp timestamp, _commit_version long, source_file string, " + (
    "partition int, offset long, raw string, tag string"
)
SILVER = "team_id long, uuid string, event_time timestamp"


def row(team: int, uuid: str, at: timedelta, version: int, file: str | None, offset: int | None, tag: str) -> tuple:
    return (team, uuid, T0 + at, version, file, None if offset is None else 0, offset, "{}", tag)


def test_the_first_landed_copy_is_kept_and_later_ones_within_the_horizon_are_repeats(spark: SparkSession) -> None:
    batch = spark.createDataFrame(
        [
            row(1, "a", timedelta(0), 2, None, 7, "a: first, by offset"),
            row(1, "a", timedelta(0), 2, None, 9, "a: kafka retry"),
            row(1, "a", timedelta(minutes=5), 1, "f.jsonl", None, "a: first, by commit (earlier)"),
            row(2, "a", timedelta(0), 2, None, 3, "same uuid, other team: another event"),
            row(1, "b", timedelta(0), 1, "f.jsonl", None, "b: first"),
            row(1, "b", 3 * HOUR, 2, "g.jsonl", None, "b: beyond the horizon of the first: counted again"),
            row(1, "c", timedelta(minutes=1), 1, "f.jsonl", None, "c: silver holds it"),
            row(1, "d", 5 * HOUR, 1, "f.jsonl", None, "d: silver's copy is outside the horizon"),
        ],
        COLUMNS,
    )
    silver = spark.createDataFrame([(1, "c", T0), (1, "d", T0), (3, "z", T0)], SILVER)
    marked = batch.transform(mark_repeats(recent_identities(silver), HOUR, time="timestamp"))
    got = {r["tag"]: r[REPEAT] for r in marked.collect()}
    assert got == {
        "a: first, by commit (earlier)": False,
        "a: first, by offset": True,
        "a: kafka retry": True,
        "same uuid, other team: another event": False,
        "b: first": False,
        "b: beyond the horizon of the first: counted again": False,
        "c: silver holds it": True,
        "d: silver's copy is outside the horizon": False,
    }
    assert sorted(r["tag"] for r in first_copies(marked).collect()) == sorted(t for t, rep in got.items() if not rep)
    assert REPEAT not in first_copies(marked).columns


def test_copies_landed_together_keep_the_same_one_every_time(spark: SparkSession) -> None:
    """Two copies with the same identity that tie on the landing order: their text decides."""
    rows = [
        (1, "a", T0, 1, "f.jsonl", None, None, '{"uuid": "a", "v": 2}', "second by content"),
        (1, "a", T0, 1, "f.jsonl", None, None, '{"uuid": "a", "v": 1}', "first by content"),
    ]
    for order in (rows, rows[::-1]):
        kept = spark.createDataFrame(order, COLUMNS).transform(mark_repeats(None, HOUR, time="timestamp"))
        assert [r["tag"] for r in first_copies(kept).collect()] == ["first by content"]


def test_without_silver_only_the_batch_is_consulted(spark: SparkSession) -> None:
    batch = spark.createDataFrame(
        [row(1, "a", timedelta(0), 1, "f", None, "one"), row(1, "a", timedelta(0), 2, "g", None, "two")], COLUMNS
    )
    kept = first_copies(batch.transform(mark_repeats(None, HOUR, time="timestamp")))
    assert [r["tag"] for r in kept.collect()] == ["one"]


def test_suspects_are_the_identities_held_twice_in_the_batch_or_held_by_silver(spark: SparkSession) -> None:
    batch = spark.createDataFrame(
        [
            row(1, "a", timedelta(0), 2, None, 7, "a twice in the batch"),
            row(1, "a", timedelta(0), 2, None, 9, "a again"),
            row(1, "b", timedelta(0), 1, "f.jsonl", None, "b once"),
            row(1, "c", timedelta(0), 1, "f.jsonl", None, "c once, silver holds it"),
            row(2, "c", timedelta(0), 1, "f.jsonl", None, "same uuid, other team, once"),
            row(1, None, timedelta(0), 1, "f.jsonl", None, "no uuid"),
            row(1, None, timedelta(0), 1, "f.jsonl", None, "no uuid again: never a suspect"),
        ],
        COLUMNS,
    )
    silver = spark.createDataFrame([(1, "c", T0 - HOUR), (1, "c", T0), (3, "z", T0)], SILVER)
    # Spark hands timestamps back as naive local times: the session and the tests run in UTC.
    naive = T0.replace(tzinfo=None)
    for few in (False, True):  # silver's identities narrowed to the batch's first, or not
        got = {(r["team_id"], r["uuid"]): (r["_first"], r["_last"]) for r in suspects(batch, silver, few=few).collect()}
        assert got == {(1, "a"): (None, None), (1, "c"): (naive - HOUR, naive)}, few
    assert {(r["team_id"], r["uuid"]) for r in suspects(batch, None).collect()} == {(1, "a")}


def test_suspects_held_in_the_driver_are_the_identities_held_twice_in_the_batch_or_held_by_silver() -> None:
    """The batch and silver of the test above, as Arrow identity columns in the driver."""
    batch = pa.table(
        {
            "team_id": pa.array([1, 1, 1, 1, 2, 1, 1], pa.int64()),
            "uuid": ["a", "a", "b", "c", "c", None, None],  # a twice; c of team 1 held by silver
        }
    )
    times = pa.array([T0 - HOUR, T0, T0], pa.timestamp("us", "UTC"))
    silver = pa.table({"team_id": pa.array([1, 1, 3], pa.int64()), "uuid": ["c", "c", "z"], "event_time": times})
    got = {(r["team_id"], r["uuid"]): (r["_first"], r["_last"]) for r in held_suspects(batch, silver).to_pylist()}
    assert got == {(1, "a"): (None, None), (1, "c"): (T0 - HOUR, T0)}
    alone = held_suspects(batch, None)
    assert alone.to_pylist() == [{"team_id": 1, "uuid": "a", "_first": None, "_last": None}]
    assert alone.schema.field("_first").type == pa.timestamp("us", "UTC")
    assert held_suspects(batch.slice(0, 3), silver.slice(2)).num_rows == 1  # a; silver holds only z


#: The batch of the first test, its rows as Arrow columns in the driver (``row``'s fields), with
#: the repeats it marks there (hand-written: see that test).
HELD_ROWS = [
    row(1, "a", timedelta(0), 2, None, 7, "repeat: a, first by offset in a later commit"),
    row(1, "a", timedelta(0), 2, None, 9, "repeat: a, kafka retry"),
    row(1, "a", timedelta(minutes=5), 1, "f.jsonl", None, "kept: a, first by commit"),
    row(2, "a", timedelta(0), 2, None, 3, "kept: same uuid, other team"),
    row(1, "b", timedelta(0), 1, "f.jsonl", None, "kept: b, first"),
    row(1, "b", 3 * HOUR, 2, "g.jsonl", None, "kept: b, beyond the horizon of the first"),
    row(1, "c", timedelta(minutes=1), 1, "f.jsonl", None, "repeat: c, silver holds it"),
    row(1, "d", 5 * HOUR, 1, "f.jsonl", None, "kept: d, silver's copy outside the horizon"),
    row(1, "e", timedelta(0), 1, "f.jsonl", None, "kept: e, once and silver holds none"),
]
LANDED = ("team_id", "uuid", "_commit_version", "source_file", "partition", "offset")


def held_batch(rows: list[tuple]) -> pa.Table:
    names = [c.split()[0] for c in COLUMNS.split(", ")]
    types = {"team_id": pa.int64(), "timestamp": pa.timestamp("us", "UTC"), "_commit_version": pa.int64()}
    types |= {"partition": pa.int32(), "offset": pa.int64()}
    return pa.table({c: pa.array([r[i] for r in rows], types.get(c, pa.string())) for i, c in enumerate(names)})


def test_repeats_decided_in_the_driver_are_the_rows_spark_s_window_marks() -> None:
    batch = held_batch(HELD_ROWS)
    silver = pa.table(
        {"team_id": pa.array([1, 1, 3], pa.int64()), "uuid": ["c", "d", "z"], "event_time": pa.array([T0] * 3)}
    )
    got = held_repeats(batch, held_suspects(batch, silver), HOUR)
    assert got is not None and got.column_names == list(LANDED)
    want = [{c: r[c] for c in LANDED} for r in batch.to_pylist() if r["tag"].startswith("repeat")]
    key = lambda r: tuple(str(v) for v in r.values())  # noqa: E731
    assert sorted(got.to_pylist(), key=key) == sorted(want, key=key)
    alone = held_repeats(batch, held_suspects(batch, None), HOUR)  # silver not consulted: c is kept
    assert alone is not None and alone.num_rows == 2


def test_repeats_are_left_to_spark_where_where_rows_landed_does_not_decide_them() -> None:
    same_place = [
        (1, "a", T0, 1, "f.jsonl", None, None, '{"v": 2}', "one line of a file"),
        (1, "a", T0, 1, "f.jsonl", None, None, '{"v": 1}', "the same place again"),
    ]
    batch = held_batch(same_place)
    assert held_repeats(batch, held_suspects(batch, None), HOUR) is None
    no_time = held_batch([HELD_ROWS[0], (*HELD_ROWS[1][:2], None, *HELD_ROWS[1][3:])])
    assert held_repeats(no_time, held_suspects(no_time, None), HOUR) is None
    once = held_batch(HELD_ROWS[-1:])
    assert held_repeats(once, held_suspects(once, None), HOUR).num_rows == 0  # type: ignore[union-attr]
