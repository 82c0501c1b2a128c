from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from gold.property_values import FanoutRules, fan_out, merge_source, partials
from pipelines.demo.data import posthog_events

T = datetime(2024, 6, 1, 0, 0, 10, tzinfo=UTC)
EVENTS = "team_id long, bucket int, event string, event_time timestamp, batch_id string, raw string"


def raw(name: str, props: dict | str | None, person: dict | None = None) -> str:
    """An event's JSON, as silver keeps it: ``props`` as an object, or as the JSON text given."""
    fields = [f'"event":{json.dumps(name)}']
    if props is not None:
        fields.append(f'"properties":{props if isinstance(props, str) else json.dumps(props)}')
    if person:
        fields.append(f'"person_properties":{json.dumps(person)}')
    return "{" + ",".join(fields) + "}"


def events(spark: SparkSession, rows: list[tuple[str, dict | str, dict | None]], team: int = 7) -> DataFrame:
    data = [(team, 0, name, T, "b1", raw(name, props, person)) for name, props, person in rows]
    return spark.createDataFrame(data, EVENTS)


DEFAULT_RULES = FanoutRules()


def tuples(df: DataFrame, rules: FanoutRules = DEFAULT_RULES) -> DataFrame:
    return df.transform(fan_out(rules)).select("property_type", "property_key", "property_value", "skip_reason")


TUPLE = "property_type string, property_key string, property_value string, skip_reason string"


def test_values_are_text_and_bad_entries_are_skipped_with_a_reason(spark: SparkSession) -> None:
    props = {
        "s": "x",
        "b": True,
        "f": False,
        "i": 42,
        "d": 1.5,
        "n": None,
        "o": {"a": 1},
        "a": [1],
        "e": "",
        "": "v",
    }
    out = tuples(events(spark, [("$pageview", props, None)]))
    assertDataFrameEqual(
        out,
        spark.createDataFrame(
            [
                ("event", "s", "x", None),
                ("event", "b", "true", None),
                ("event", "f", "false", None),
                ("event", "i", "42", None),
                ("event", "d", "1.5", None),
                ("event", "n", None, "null_value"),
                ("event", "o", None, "nested_value"),
                ("event", "a", None, "nested_value"),
                ("event", "e", "", "empty_value"),
                ("event", "", "v", "empty_key"),
            ],
            TUPLE,
        ),
    )


def test_person_entries_come_from_set_set_once_and_person_properties(spark: SparkSession) -> None:
    props = {"$set": {"email": "a@b"}, "$set_once": {"plan": "free"}}
    out = tuples(events(spark, [("$identify", props, {"tier": 3})])).where("property_type = 'person'")
    assertDataFrameEqual(
        out,
        spark.createDataFrame(
            [
                ("person", "email", "a@b", None),
                ("person", "plan", "free", None),
                ("person", "tier", "3", None),
            ],
            TUPLE,
        ),
    )


def test_group_entries_only_for_groupidentify_with_an_index(spark: SparkSession) -> None:
    gi = {
        "$group_type": "organization",
        "$group_type_index": 1,
        "$group_key": "o1",
        "$group_set": {"name": "Acme"},
    }
    not_gi = {"$group_type_index": 1, "$group_set": {"name": "Nope"}}
    out = tuples(events(spark, [("$groupidentify", gi, None), ("$pageview", not_gi, None)]))
    assertDataFrameEqual(
        out.where("property_type like 'group_%'"),
        spark.createDataFrame([("group_1", "name", "Acme", None)], TUPLE),
    )


def test_length_limits_and_excluded_keys(spark: SparkSession) -> None:
    props = {"k" * 401: "v", "long": "x" * 256, "ok": "x" * 255, "secret": "s"}
    out = tuples(events(spark, [("e", props, None)]), FanoutRules(excluded_keys=("secret",)))
    assert {r["property_key"][:5]: r["skip_reason"] for r in out.collect()} == {
        "kkkkk": "key_too_long",
        "long": "value_too_long",
        "ok": None,
        "secre": "excluded_key",
    }


def test_properties_given_as_json_string_fan_out_the_same(spark: SparkSession) -> None:
    as_obj = tuples(events(spark, [("e", {"a": "1"}, None)]))
    as_str = tuples(events(spark, [("e", json.dumps(json.dumps({"a": "1"})), None)]))
    assert as_obj.collect() == as_str.collect() == [("event", "a", "1", None)]
    # Any other string, or no object at all, holds no properties.
    for given in ('"not an object"', "[1]", "3", "null"):
        assert tuples(events(spark, [("e", given, None)])).count() == 0


def test_real_posthog_fixtures_fan_out_every_property(spark: SparkSession) -> None:
    fixture = list(posthog_events())
    df = events(spark, [(e["event"], e["properties"], None) for e in fixture])
    out = df.transform(fan_out(FanoutRules()))
    assert out.count() == sum(
        len(e["properties"])
        + len(e["properties"].get("$set") or {})
        + len(e["properties"].get("$set_once") or {})
        + (len(e["properties"].get("$group_set") or {}) if e["event"] == "$groupidentify" else 0)
        for e in fixture
    )
    assert out.where("property_type = 'person' and property_key = 'email'").count() == 3
    assert {r[0] for r in out.select("property_type").distinct().collect()} == {
        "event",
        "person",
        "group_0",
        "group_1",
        "group_2",
    }


def test_partials_count_per_window_and_batch_and_merge_sums_them(spark: SparkSession) -> None:
    later = T + timedelta(seconds=30)
    df = spark.createDataFrame(
        [
            (7, 0, "e", T, "b1", raw("e", {"k": "v"})),
            (7, 0, "e", T, "b2", raw("e", {"k": "v"})),
            (7, 0, "e", T, "b2", raw("e", {"k": "v"})),
            (7, 0, "e", later, "b2", raw("e", {"k": "v"})),
        ],
        EVENTS,
    )
    created = datetime(2026, 1, 1, tzinfo=UTC)
    parts = df.transform(fan_out(FanoutRules())).transform(partials(timedelta(seconds=30)))
    w0, w1 = datetime(2024, 6, 1, tzinfo=UTC), datetime(2024, 6, 1, 0, 0, 30, tzinfo=UTC)
    assertDataFrameEqual(
        parts.select("window_start", "batch_id", "count"),
        spark.createDataFrame(
            [(w0, "b1", 1), (w0, "b2", 2), (w1, "b2", 1)],
            "window_start timestamp, batch_id string, count long",
        ),
    )
    merged = parts.withColumn("created_at", F.lit(created)).transform(merge_source())
    assertDataFrameEqual(
        merged.select("property_key", "window_start", "count"),
        spark.createDataFrame([("k", w0, 3), ("k", w1, 1)], "property_key string, window_start timestamp, count long"),
    )
