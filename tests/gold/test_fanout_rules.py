"""The fan-out's rules, case by case, as PostHog's property-vals-rs documents them.

Each case is an input event (its JSON text written out by hand) and the exact multiset of
``(property_type, key, value, skip_reason)`` rows it must give. Number texts were checked against
JavaScript's ``String(JSON.parse(token))``; one test asks Node itself when it is installed.

Every case goes through bronze's parse as the pipeline runs it, in each lane: Spark's
(:func:`bronze.events.parse_events`, files) and the Kafka ingest process's
(:func:`bronze.event_values.parse_event_values`, which leaves what it is unsure of to Spark). Stage
1's counts (:func:`tuple_counts`) are held to the entries on every case at once.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from bronze.event_values import parse_event_values
from bronze.events import BRONZE_EVENTS_COLUMNS, parse_events
from bronze.landing import valid
from bronze.properties import JAVASCRIPT, SERDE_JSON
from gold.property_values import (
    FanoutRules,
    counted_partials,
    fan_out,
    merge_source,
    partials,
    tuple_counts,
)
from tests.helpers import landing

T = datetime(2024, 6, 1, 0, 0, 10, tzinfo=UTC)
ROW = "property_type string, property_key string, property_value string, skip_reason string"
Row = tuple[str | None, str, str | None, str | None]
DEFAULT = FanoutRules()
MAX_BYTES = 1 << 20
#: (team_id, event, event time, bronze batch, properties' JSON text or None, person_properties' or None)
Event = tuple[int, str, datetime, str, str | None, str | None]


@pytest.fixture(params=["spark", "in-process"])
def lane(request: pytest.FixtureRequest) -> str:
    """Which parser lands the events: Spark's, or the Kafka ingest process's (Spark for the rest)."""
    return str(request.param)


def entries(df: DataFrame, rules: FanoutRules, lane: str, notation: str = JAVASCRIPT) -> DataFrame:
    """Silver events -> one row per entry, as :func:`fan_out` gives them."""
    return df.transform(fan_out(rules, notation))


def counted(df: DataFrame, rules: FanoutRules, notation: str = JAVASCRIPT) -> DataFrame:
    """Silver events -> the entries as stage 1 counts them (:func:`tuple_counts`), each tuple
    repeated as many times as it counted: the same multiset as :func:`entries`."""
    counts = df.transform(tuple_counts(rules, timedelta(seconds=30), notation))
    one = F.struct("team_id", "property_type", "property_key", "property_value", "skip_reason")
    return counts.select(F.inline(F.array_repeat(one, F.col("count").cast("int"))))


def message(i: int, e: Event) -> bytes:
    team, event, time, _, properties, person = e
    fields = [
        f'"uuid":"00000000-0000-4000-8000-{i:012d}"',
        f'"event":{json.dumps(event)}',
        f'"team_id":{team}',
        '"distinct_id":"d1"',
        f'"timestamp":"{time.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"',
        *([f'"properties":{properties}'] if properties is not None else []),
        *([f'"person_properties":{person}'] if person is not None else []),
    ]
    return ("{" + ",".join(fields) + "}").encode()


def silver_events(spark: SparkSession, events: list[Event], lane: str) -> DataFrame:
    """The events as bronze lands them in ``lane`` (a message that is not JSON is quarantined),
    with the columns gold reads from silver (bucket 0; the batch as given)."""
    values = [message(i, e) for i, e in enumerate(events)]
    batches = spark.createDataFrame([(i, e[3]) for i, e in enumerate(events)], "i long, batch string")
    rest = list(range(len(values)))
    lanes = []
    if lane == "in-process":
        parsed = parse_event_values(values, MAX_BYTES)
        if parsed.accepted:
            rows = parsed.rows.append_column("offset", pa.array(parsed.accepted, pa.int64()))
            lanes.append(spark.createDataFrame(rows))
        rest = parsed.deferred
    if rest:
        spark_rows = landing(spark, [values[i] for i in rest]).transform(parse_events(MAX_BYTES))
        positions = spark.createDataFrame([(k, i) for k, i in enumerate(rest)], "k long, offset long")
        good = valid(spark_rows, BRONZE_EVENTS_COLUMNS).withColumnRenamed("offset", "k").join(positions, "k")
        lanes.append(good)
    landed = lanes[0]
    for more in lanes[1:]:
        landed = landed.unionByName(more, allowMissingColumns=True)
    return landed.join(batches, F.col("offset") == F.col("i")).select(
        "team_id",
        F.lit(0).alias("bucket"),
        "event",
        F.col("timestamp").alias("event_time"),
        F.col("batch").alias("batch_id"),
        "raw",
    )


def fanned(
    spark: SparkSession,
    lane: str,
    properties: str | None,
    event: str = "$pageview",
    person: str | None = None,
    rules: FanoutRules = DEFAULT,
    notation: str = JAVASCRIPT,
) -> DataFrame:
    events = silver_events(spark, [(7, event, T, "b1", properties, person)], lane)
    return entries(events, rules, lane, notation).select(
        "property_type", "property_key", "property_value", "skip_reason"
    )


def expect(spark: SparkSession, got: DataFrame, rows: list[Row]) -> None:
    assertDataFrameEqual(got, spark.createDataFrame(rows, ROW))  # as multisets: order is not checked


# -- values -----------------------------------------------------------------------------------------
NUMBERS = {
    "1e21": "1e+21",
    "1e16": "10000000000000000",
    "1e7": "10000000",
    "1.25e-5": "0.0000125",
    "-1.25e-5": "-0.0000125",
    "-0": "0",
    "-0.0": "0",
    "1.0": "1",
    "2.5e3": "2500",
    "0.000001": "0.000001",
    "1e-7": "1e-7",
    "0.1": "0.1",
    "-1.5": "-1.5",
    "100": "100",
    "123.456e5": "12345600",
    "5.684341886080802E-14": "5.684341886080802e-14",  # Java 17 writes ...8015E-14: not the shortest
    "2.82879384806159E17": "282879384806159000",
    "1E400": "Infinity",
    "5e-324": "5e-324",  # Java writes 4.9E-324: at least two digits
    "1e-323": "1e-323",  # Java: 9.9E-324
    # Integers keep every digit, past 2^53 and past 64 bits.
    "9007199254740993": "9007199254740993",
    "123456789012345678901234567890": "123456789012345678901234567890",
    "-9223372036854775808": "-9223372036854775808",
}


def test_numbers_have_one_canonical_text(spark: SparkSession, lane: str) -> None:
    properties = "{" + ",".join(f'"k{i}":{token}' for i, token in enumerate(NUMBERS)) + "}"
    expect(
        spark,
        fanned(spark, lane, properties),
        [("event", f"k{i}", text, None) for i, text in enumerate(NUMBERS.values())],
    )


def test_the_same_number_written_two_ways_is_one_value(spark: SparkSession, lane: str) -> None:
    a = fanned(spark, lane, '{"price":2.5e3,"ratio":1.50}')
    b = fanned(spark, lane, '{"price":2500.0,"ratio":1.5}')
    assert (
        sorted(a.collect())
        == sorted(b.collect())
        == [("event", "price", "2500", None), ("event", "ratio", "1.5", None)]
    )


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js as the independent model")
def test_fractional_numbers_are_written_as_javascript_writes_them(spark: SparkSession, lane: str) -> None:
    rng = random.Random(17)
    doubles = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(300)]
    doubles += [rng.uniform(-1e6, 1e6) for _ in range(200)] + [
        rng.random() * 10 ** rng.randint(-12, 25) for _ in range(200)
    ]
    tokens = [repr(d) for d in doubles if d == d and abs(d) != float("inf")]
    tokens = [t if ("." in t or "e" in t) else t + ".0" for t in tokens]  # fractional tokens only
    node = subprocess.run(
        ["node", "-e", "process.stdin.on('data', d => console.log(JSON.stringify(JSON.parse(d).map(x => String(x)))))"],
        input=json.dumps([float(t) for t in tokens]),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    want = json.loads(node.stdout)
    properties = "{" + ",".join(f'"k{i}":{t}' for i, t in enumerate(tokens)) + "}"
    got = {r["property_key"]: r["property_value"] for r in fanned(spark, lane, properties).collect()}
    wrong = [(t, got[f"k{i}"], w) for i, (t, w) in enumerate(zip(tokens, want, strict=True)) if got[f"k{i}"] != w]
    assert not wrong, wrong[:10]


# -- serde_json's notation (silver.number_notation: serde_json) --------------------------------------
#: Each token -> the text serde_json 1.0 (default features, ryu) writes for it, as property-vals-rs
#: stores a number (``Value::to_string()``). Every text was produced by a build of serde_json 1.0.146
#: (``serde_json::from_str::<Value>`` then ``to_string``), not by this project's code.
SERDE_NUMBERS = {
    # integers within u64 / i64: their digits, past 2^53 too
    "0": "0",
    "1": "1",
    "-1": "-1",
    "42": "42",
    "100000": "100000",
    "9007199254740993": "9007199254740993",
    "123456789012345678": "123456789012345678",
    "9223372036854775807": "9223372036854775807",
    "12345678901234567890": "12345678901234567890",
    "18446744073709551615": "18446744073709551615",
    "-9223372036854775808": "-9223372036854775808",
    # integers past 64 bits: an f64
    "18446744073709551616": "1.8446744073709552e19",
    "20000000000000000000": "2e19",
    "100000000000000000000": "1e20",
    "-9223372036854775809": "-9.223372036854776e18",
    # a fraction or an exponent: an f64, plain from 1e-5 to under 1e16 (a whole one ends .0)
    "1.0": "1.0",
    "0.0": "0.0",
    "-0": "-0.0",
    "-0.0": "-0.0",
    "-0e0": "-0.0",
    "1.5": "1.5",
    "-42.5": "-42.5",
    "100000.0": "100000.0",
    "1e5": "100000.0",
    "1E5": "100000.0",
    "2.5E+10": "25000000000.0",
    "123456.789e3": "123456789.0",
    "1e15": "1000000000000000.0",
    "1727000000000.5": "1727000000000.5",
    "0.1": "0.1",
    "0.30000000000000004": "0.30000000000000004",
    "0.1234567890123456789": "0.12345678901234568",
    "0.00001": "0.00001",
    "1.23e-4": "0.000123",
    # else d.ddde<n>, no plus sign
    "0.000001": "1e-6",
    "-0.000001": "-1e-6",
    "0.000009999": "9.999e-6",
    "1e-7": "1e-7",
    "2.5e-10": "2.5e-10",
    "1e16": "1e16",
    "1e21": "1e21",
    "1e+22": "1e22",
    "1.2345678901234568e+23": "1.2345678901234569e23",
    "1.5e300": "1.5e300",
    "1.7976931348623157e308": "1.7976931348623157e308",
    "5e-324": "5e-324",
}


def test_serde_json_notation_writes_each_number_as_serde_json_does(spark: SparkSession, lane: str) -> None:
    properties = "{" + ",".join(f'"k{i}":{token}' for i, token in enumerate(SERDE_NUMBERS)) + "}"
    got = {
        r["property_key"]: r["property_value"] for r in fanned(spark, lane, properties, notation=SERDE_JSON).collect()
    }
    wrong = [(t, got.get(f"k{i}"), w) for i, (t, w) in enumerate(SERDE_NUMBERS.items()) if got.get(f"k{i}") != w]
    assert not wrong, wrong


#: property-vals-rs's fan-out unit tests (rust/property-vals-rs/src/fan_out.rs): its input blob, and
#: the (key, value) tuples it asserts, with its caps (key 400, value 255 code points).
PROPERTY_VALS_RS_CASES = [
    ('{"$browser":"Chrome"}', [("$browser", "Chrome")]),
    ('{"nullable_field":null}', []),
    ('{"blank":""}', []),
    ('{"a_bool":true}', [("a_bool", "true")]),
    ('{"a_number":42}', [("a_number", "42")]),
    ("not valid json", []),
    ("{}", []),
    ('{"$browser":"Chrome","email":"a@b.com"}', [("$browser", "Chrome"), ("email", "a@b.com")]),
    ('{"k":"' + "a" * 255 + '"}', [("k", "a" * 255)]),
    ('{"k":"' + "a" * 256 + '"}', []),
    ('{"' + "k" * 400 + '":"v"}', [("k" * 400, "v")]),
    ('{"' + "k" * 401 + '":"v"}', []),
    ('{"k":"' + "あ" * 255 + '"}', [("k", "あ" * 255)]),
    ('{"' + "あ" * 401 + '":"v"}', []),
    ('{"' + "k" * 401 + '":"ok","k":"' + "v" * 256 + '","ok":"yes"}', [("ok", "yes")]),
]


@pytest.mark.parametrize("notation", [JAVASCRIPT, SERDE_JSON])
def test_property_vals_rs_fan_out_cases_give_its_tuples(spark: SparkSession, lane: str, notation: str) -> None:
    # One event per case (its team is the case's index), and its excluded-keys case on event and
    # person properties alike; all fanned out in one query.
    excluded = ("$insert_id", "distinct_id", "$session_id")
    cases = [(blob, None, tuples) for blob, tuples in PROPERTY_VALS_RS_CASES] + [
        (
            '{"$insert_id":"abc-123","$browser":"Chrome","distinct_id":"u1","$session_id":"s1"}',
            '{"email":"a@b.com","$session_id":"s1","plan":"enterprise"}',
            [("$browser", "Chrome"), ("email", "a@b.com"), ("plan", "enterprise")],
        )
    ]
    # A blob that is not JSON makes its message none either: bronze quarantines it, and it counts nothing.
    events = silver_events(
        spark,
        [(team, "$pageview", T, "b1", blob, person) for team, (blob, person, _) in enumerate(cases)],
        lane,
    )
    rows = (
        entries(events, FanoutRules(excluded_keys=excluded), lane, notation)
        .where("skip_reason IS NULL")
        .select("team_id", "property_key", "property_value")
        .collect()
    )
    for team, (blob, person, tuples) in enumerate(cases):
        got = sorted((r["property_key"], r["property_value"]) for r in rows if r["team_id"] == team)
        assert got == sorted(tuples), (blob, person)


def test_booleans_strings_nulls_and_empties(spark: SparkSession, lane: str) -> None:
    expect(
        spark,
        fanned(spark, lane, '{"t":true,"f":false,"s":"true","n":null,"e":"","":"v","sp":" "}'),
        [
            ("event", "t", "true", None),
            ("event", "f", "false", None),
            ("event", "s", "true", None),
            ("event", "n", None, "null_value"),
            ("event", "e", "", "empty_value"),
            ("event", "", "v", "empty_key"),
            ("event", "sp", " ", None),
        ],
    )


def test_caps_count_characters_not_bytes(spark: SparkSession, lane: str) -> None:
    emoji, cyrillic = "😀", "я"
    properties = json.dumps(
        {
            "e255": emoji * 255,
            "e256": emoji * 256,
            "c255": cyrillic * 255,
            cyrillic * 400: "k",
            cyrillic * 401: "k",
        },
        ensure_ascii=False,
    )
    expect(
        spark,
        fanned(spark, lane, properties),
        [
            ("event", "e255", emoji * 255, None),
            ("event", "e256", emoji * 256, "value_too_long"),
            ("event", "c255", cyrillic * 255, None),
            ("event", cyrillic * 400, "k", None),
            ("event", cyrillic * 401, "k", "key_too_long"),
        ],
    )


def test_excluded_keys_apply_to_event_person_and_group_properties(spark: SparkSession, lane: str) -> None:
    properties = json.dumps(
        {
            "secret": 1,
            "ok": 2,
            "$set": {"secret": 3},
            "$group_type_index": 0,
            "$group_set": {"secret": 4, "name": "Acme"},
        }
    )
    got = fanned(
        spark, lane, properties, "$groupidentify", rules=FanoutRules(excluded_keys=("secret", "$set", "$group_set"))
    )
    expect(
        spark,
        got,
        [
            ("event", "secret", "1", "excluded_key"),
            ("event", "ok", "2", None),
            ("event", "$set", None, "nested_value"),
            ("event", "$group_type_index", "0", None),
            ("event", "$group_set", None, "nested_value"),
            ("person", "secret", "3", "excluded_key"),
            ("group_0", "secret", "4", "excluded_key"),
            ("group_0", "name", "Acme", None),
        ],
    )


# -- person properties ------------------------------------------------------------------------------
def test_one_person_observation_per_key_person_properties_then_set_then_set_once(
    spark: SparkSession, lane: str
) -> None:
    properties = json.dumps(
        {
            "$set": {"plan": "pro", "a": 1, "email": "x@y"},
            "$set_once": {"a": 2, "first_seen": "mon", "plan": "free"},
        }
    )
    got = fanned(spark, lane, properties, person=json.dumps({"plan": "pro", "tier": 3})).where(
        "property_type = 'person'"
    )
    expect(
        spark,
        got,
        [
            ("person", "plan", "pro", None),  # in person_properties and $set: once
            ("person", "tier", "3", None),
            ("person", "a", "1", None),  # $set wins over $set_once
            ("person", "email", "x@y", None),
            ("person", "first_seen", "mon", None),
        ],
    )


def test_person_properties_win_over_a_different_set_value(spark: SparkSession, lane: str) -> None:
    got = fanned(spark, lane, '{"$set":{"plan":"free"}}', person='{"plan":"pro"}').where("property_type = 'person'")
    expect(spark, got, [("person", "plan", "pro", None)])


def test_set_and_set_once_alone(spark: SparkSession, lane: str) -> None:
    got = fanned(spark, lane, '{"$set":{"a":1},"$set_once":{"a":2,"b":3}}').where("property_type = 'person'")
    expect(spark, got, [("person", "a", "1", None), ("person", "b", "3", None)])


# -- groups -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("index", "property_type", "reason"),
    [
        ("0", "group_0", None),
        ("4", "group_4", None),
        ("5", "group_5", None),
        ("255", "group_255", None),
        ("256", None, "bad_group_index"),
        ("-1", None, "bad_group_index"),
        ('"2"', None, "bad_group_index"),
        ("2.0", None, "bad_group_index"),
        ("2.5", None, "bad_group_index"),
        ("null", None, "bad_group_index"),
        (None, None, "bad_group_index"),
    ],
)
def test_group_type_index_is_a_u8(
    spark: SparkSession, lane: str, index: str | None, property_type: str | None, reason: str | None
) -> None:
    entries = '"$group_set":{"name":"Acme","size":10}'
    properties = "{" + (f'"$group_type_index":{index},' if index is not None else "") + entries + "}"
    got = fanned(spark, lane, properties, "$groupidentify").where(
        "property_type is null or property_type like 'group_%'"
    )
    expect(spark, got, [(property_type, "name", "Acme", reason), (property_type, "size", "10", reason)])


def test_group_set_counts_only_on_groupidentify(spark: SparkSession, lane: str) -> None:
    got = fanned(spark, lane, '{"$group_type_index":1,"$group_set":{"name":"Acme"}}', "$pageview")
    assert got.where("property_type is null or property_type like 'group_%'").count() == 0


# -- duplicate keys and nested values ---------------------------------------------------------------
def test_a_duplicate_key_keeps_its_last_occurrence(spark: SparkSession, lane: str) -> None:
    got = fanned(spark, lane, '{"a":1,"b":"x","a":2,"$set":{"p":"one","p":"two"}}', person='{"q":1,"q":3}')
    expect(
        spark,
        got,
        [
            ("event", "a", "2", None),
            ("event", "b", "x", None),
            ("event", "$set", None, "nested_value"),
            ("person", "p", "two", None),
            ("person", "q", "3", None),
        ],
    )


def test_nested_values_are_skipped_by_default_or_counted_as_sorted_compact_json(spark: SparkSession, lane: str) -> None:
    properties = '{"o": {"z": 1, "a": [true, "x", null], "m": {"b": 2, "a": 1}}, "l": [3, 1], "e": {}}'
    expect(
        spark,
        fanned(spark, lane, properties),
        [
            ("event", "o", None, "nested_value"),
            ("event", "l", None, "nested_value"),
            ("event", "e", None, "nested_value"),
        ],
    )
    expect(
        spark,
        fanned(spark, lane, properties, rules=FanoutRules(nested_values="json")),
        [
            ("event", "o", '{"a":[true,"x",null],"m":{"a":1,"b":2},"z":1}', None),
            ("event", "l", "[3,1]", None),
            ("event", "e", "{}", None),
        ],
    )


def test_a_nested_value_over_the_cap_is_too_long_in_json_mode(spark: SparkSession, lane: str) -> None:
    properties = json.dumps({"l": ["x" * 300]})
    expect(
        spark,
        fanned(spark, lane, properties, rules=FanoutRules(nested_values="json")),
        [("event", "l", json.dumps(["x" * 300], separators=(",", ":")), "value_too_long")],
    )


# -- stage 2 ----------------------------------------------------------------------------------------
def test_stage_two_sums_a_tuple_over_batches_and_events_in_its_window(spark: SparkSession, lane: str) -> None:
    rows: list[Event] = [
        (7, "e", T, "b1", '{"plan":"pro","n":1.0}', None),
        (7, "e", T + timedelta(seconds=5), "b1", '{"plan":"pro","n":1}', None),
        (7, "e", T + timedelta(seconds=10), "b2", '{"plan":"pro"}', '{"plan":"pro"}'),
        (8, "e", T, "b2", '{"plan":"pro"}', None),
    ]
    events, width = silver_events(spark, rows, lane), timedelta(seconds=30)
    parts = events.transform(tuple_counts(FanoutRules(), width)).where("skip_reason IS NULL")
    assertDataFrameEqual(  # stage 1 as the flow runs it, and the entries counted
        parts.transform(counted_partials()).drop("created_at"),
        events.transform(fan_out(FanoutRules())).transform(partials(width)).drop("created_at"),
    )
    gold = parts.transform(counted_partials()).transform(merge_source())
    gold = gold.select("team_id", "property_type", "property_key", "property_value", "count")
    expect_rows = [
        (7, "event", "plan", "pro", 3),
        (7, "event", "n", "1", 2),
        (7, "person", "plan", "pro", 1),
        (8, "event", "plan", "pro", 1),
    ]
    assertDataFrameEqual(
        gold,
        spark.createDataFrame(
            expect_rows,
            "team_id long, property_type string, property_key string, property_value string, count long",
        ),
    )


@pytest.mark.parametrize("notation", [JAVASCRIPT, SERDE_JSON])
def test_stage_one_counts_the_entries_of_every_case(spark: SparkSession, notation: str) -> None:
    # Every event of this module at once: stage 1's counts, expanded, are the entries' multiset.
    blobs = [
        "{" + ",".join(f'"k{i}":{t}' for i, t in enumerate(NUMBERS)) + "}",
        "{" + ",".join(f'"s{i}":{t}' for i, t in enumerate(SERDE_NUMBERS)) + "}",
        *(blob for blob, _ in PROPERTY_VALS_RS_CASES),
        '{"a":1,"b":"x","a":2,"$set":{"p":"one","p":"two"},"$set_once":{"p":"x","q":"y"}}',
        '{"$group_type_index":1,"$group_set":{"name":"Acme","size":10},"o":{"z":[1]},"e":"","n":null}',
    ]
    events = silver_events(
        spark,
        [(team, "$groupidentify", T, "b1", blob, '{"q":1,"q":3,"r":"s"}') for team, blob in enumerate(blobs)],
        "spark",
    )
    rules = FanoutRules(nested_values="json", excluded_keys=("k3",))
    assertDataFrameEqual(
        counted(events, rules, notation),
        entries(events, rules, "spark", notation).drop("bucket", "event_time", "batch_id"),
    )
