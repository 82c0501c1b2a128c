"""The in-process event parser against the Spark one, which defines a bronze event.

Every message the in-process parser accepts, Spark must accept with the same fields (the message
itself among them, as ``raw``); what it is unsure of it must defer. The messages: the real PostHog fixture events, hand-written edge cases, and a few
thousand seeded mutations of the fixtures.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bronze.event_values import parse_event_values
from bronze.events import parse_events
from pipelines.demo.data import posthog_events
from tests.helpers import landing

MAX_BYTES = 1 << 20
FIXTURES = list(posthog_events())


def dumps(obj: Any, **kw: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, **kw).encode()


def base(**fields: Any) -> dict[str, Any]:
    event = {
        "uuid": "0190c6ec-7e4f-7000-8000-000000000001",
        "event": "$pageview",
        "team_id": 7,
        "distinct_id": "u1",
        "timestamp": "2024-06-01T12:00:00Z",
        "properties": {"$browser": "Firefox", "n": 1.50},
    }
    event.update(fields)
    return {k: v for k, v in event.items() if v is not ...}


#: Messages the in-process parser must accept (and Spark agree on).
ACCEPT = [
    dumps(base()),
    dumps(base(), indent=2),  # whitespace everywhere
    b'{"uuid":"0190c6ec7e4f70008000000000000002","event":"e","team_id":-3,"distinct_id":"",'
    b'"timestamp":"2024-06-01T12:00:00.5+05:30","properties":{"x":1.50,"y":1e21,"z":[1,{"a":null}]}}',
    dumps(base(timestamp="2024-02-29T23:59:59.999999-11:00")),
    dumps(base(properties=json.dumps({"as": "a string"}))),
    dumps(base(properties=None)),
    dumps(base(properties=...)),
    dumps(base(person_properties={"plan": "pro", "seats": 12345678901234})),
    dumps(base(person_properties=None)),
    dumps(base(event="Ünïcødé 🎉", distinct_id="Пётр")),
    dumps(base(properties={"": "", "k": "\u0000 escaped nul", "deep": {"a": {"b": {"c": [True, False]}}}})),
    # Nested values as Spark writes them: decimals without trailing zeros, Jackson's escapes, keys in
    # UTF-16 order (an astral character before U+FFFF).
    b'{"uuid":"0190c6ec-7e4f-7000-8000-000000000003","event":"e","team_id":1,"distinct_id":"d",'
    b'"timestamp":"2024-06-01T12:00:00Z","properties":{"o":{"b":[1.50,877.0,-0.0,0.000,-0,12],'
    b'"a":"x\\u0001\\u001f\\n\\"\\\\\u007f","\xef\xbf\xbf":1,"\xf0\x9f\x98\x80":2,"B":null}}}',
    dumps(base(properties={"$set": {"plan": "pro", "n": 2.0}, "$set_once": {"first": "x"}, "$group_set": {}})),
    dumps(base(properties={"whole": 2.0, "small": 1e-7, "big": 1.2345678901234568e23, "neg": -0.0})),
    # Nested numbers Spark holds as doubles: bronze keeps the message, and gold writes them.
    dumps(base(properties={"o": [1e-7]})),
    dumps(base(properties={"o": {"x": 1.0e21}})),
    dumps(base(properties={"o": [1.5]})).replace(b"1.5", b"0." + b"1" * 39),
]

#: Messages the in-process parser must leave to Spark (whatever Spark then decides).
DEFER = [
    None,
    b"",
    b"not json",
    b"[1, 2]",
    b' {"uuid": 1}',  # Spark trims spaces only before checking for an object
    b"\xef\xbb\xbf" + dumps(base()),  # a byte-order mark
    b"\xff\xfe",
    dumps(base())[:-1],
    dumps(base()) + b" {}",
    dumps(base()).replace(b'"team_id": 7', b'"team_id": 7, "team_id": 8'),
    dumps(base(properties={"a": 1})).replace(b'{"a": 1}', b'{"a": 1, "a": 2}'),
    dumps(base(properties={"a": float("nan")})),
    dumps(base(properties={"a": 1})).replace(b'{"a": 1}', b'{"a": 1e400}'),
    dumps(base(properties={"a": 10**30})),
    dumps(base(properties={"a": 1})).replace(b'"a": 1', b'"a": 1, "b": 1' + b"0" * 101 + b".5"),
    dumps(base(extra=10**18)),  # a field no column keeps, read by Spark all the same
    dumps(base(extra={"a": 1, "a ": 2})).replace(b'"a "', b'"a"'),
    dumps(base(team_id=1.0)),
    dumps(base(team_id="7")),
    dumps(base(team_id=True)),
    dumps(base(team_id=10**19)),
    dumps(base(uuid="not-a-uuid")),
    dumps(base(uuid="0190c6ec-7e4f-7000-8000-000000000001\n")),
    dumps(base(event="")),
    dumps(base(event=...)),
    dumps(base(distinct_id=5)),
    dumps(base(timestamp="2024-06-01 12:00:00Z")),
    dumps(base(timestamp="2024-06-01T12:00:00")),
    dumps(base(timestamp="2024-02-30T12:00:00Z")),
    dumps(base(timestamp="2024-06-01T12:00:00.1234567Z")),
    dumps(base(timestamp="٢٠٢٤-06-01T12:00:00Z")),  # Arabic-Indic digits
    dumps(base(properties=[1, 2])),
    dumps(base(properties="not an object")),
    dumps(base(properties=' {"a": 1}')),
    dumps(base(person_properties=3)),
    dumps(base()).replace(b'"u1"', b'"\\ud800"'),  # a lone surrogate
    json.dumps(base(properties={"k": "\U0001f600"})).encode(),  # an escaped surrogate pair
    b"x" * (MAX_BYTES + 1),
]


def mutations(n: int, seed: int = 20261123) -> list[bytes]:
    """Seeded mutations of the fixture events: fields dropped, retyped or bent, text reshaped."""
    rng = random.Random(seed)
    odd_values: list[Any] = [None, 0, -1, 2**63, 1.5, "", "x", True, [], {}, "2024-06-01T00:00:00Z", "\u0661"]
    out = []
    for i in range(n):
        event = dict(FIXTURES[i % len(FIXTURES)])
        for _ in range(rng.randint(0, 2)):
            field = rng.choice(
                ["uuid", "event", "team_id", "distinct_id", "timestamp", "properties", "person_properties"]
            )
            action = rng.random()
            if action < 0.3:
                event.pop(field, None)
            elif action < 0.7:
                event[field] = rng.choice(odd_values)
            elif field == "timestamp":
                event[field] = rng.choice(
                    ["2024-06-01T00:00:00+01:00", "2024-13-01T00:00:00Z", "2024-06-01T00:00:00.1Z", "2024-06-01"]
                )
            elif field == "properties":
                event[field] = json.dumps(event.get(field) or {})
        text = json.dumps(event, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1]))
        if rng.random() < 0.1:
            text = text.replace('"event"', '"event": "dup", "event"', 1)
        out.append(text.encode())
    return out


def spark_rows(spark: SparkSession, values: list[bytes | None]) -> dict[int, Any]:
    """Spark's parse of each message by position: its reason and fields."""
    rows = [v if v is not None else None for v in values]
    df = landing(spark, rows)  # type: ignore[arg-type]
    parsed = df.transform(parse_events(MAX_BYTES))
    return {r["offset"]: r.asDict() for r in parsed.collect()}  # a few thousand test rows


FIELDS = ("uuid", "event", "team_id", "distinct_id", "timestamp", "raw")


def assert_agrees(spark: SparkSession, values: list[bytes | None]) -> list[int]:
    """Hold the in-process parse of ``values`` to Spark's; returns the positions it deferred."""
    ours = parse_event_values(values, MAX_BYTES)
    assert sorted(ours.accepted + ours.deferred) == list(range(len(values)))
    theirs = spark_rows(spark, values)
    for position, row in zip(ours.accepted, ours.rows.to_pylist(), strict=True):
        spark_row = theirs[position]
        assert spark_row["reason"] is None, (values[position], spark_row["reason"])
        spark_row["timestamp"] = spark_row["timestamp"].replace(tzinfo=UTC)
        assert [row[c] for c in FIELDS] == [spark_row[c] for c in FIELDS], values[position]
    return ours.deferred


def test_hand_written_cases_are_accepted_or_deferred_as_written(spark: SparkSession) -> None:
    deferred = assert_agrees(spark, [*ACCEPT, *DEFER])
    assert deferred == list(range(len(ACCEPT), len(ACCEPT) + len(DEFER)))


def test_every_real_fixture_event_is_accepted_with_sparks_fields(spark: SparkSession) -> None:
    values = [dumps(e) for e in FIXTURES]
    assert assert_agrees(spark, values) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_fixture_events_never_disagree_with_spark(spark: SparkSession, seed: int) -> None:
    values: list[bytes | None] = list(mutations(1500, seed))
    deferred = assert_agrees(spark, values)
    assert 0 < len(deferred) < len(values)  # the mutations reach both sides


def test_times_are_read_as_utc_microseconds() -> None:
    rows = parse_event_values([dumps(base(timestamp="2024-06-01T12:00:00.25+02:00"))], MAX_BYTES).rows
    assert rows["timestamp"].to_pylist() == [datetime(2024, 6, 1, 10, 0, 0, 250000, tzinfo=UTC)]
