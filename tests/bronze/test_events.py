from __future__ import annotations

import json
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from bronze.events import BRONZE_EVENTS_COLUMNS, parse_events
from bronze.landing import quarantined, valid
from pipelines.demo.data import posthog_events
from tests.helpers import landing

UUID = "0190a0c2-1111-7000-8000-00000000000"


def event(i: int, **fields: object) -> bytes:
    base: dict[str, object] = {
        "uuid": f"{UUID}{i}",
        "event": "$pageview",
        "team_id": 2,
        "distinct_id": "d1",
        "timestamp": "2024-06-01T00:00:00Z",
        "properties": {"a": 1},
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def test_real_posthog_fixture_events_all_land(spark: SparkSession) -> None:
    records = [json.dumps(e).encode() for e in posthog_events()]
    parsed = landing(spark, records).transform(parse_events(1_000_000))
    assert quarantined(parsed, "events").count() == 0
    good = valid(parsed, BRONZE_EVENTS_COLUMNS)
    assert good.count() == 91
    assert good.where("event = '$groupidentify'").count() == 7
    assert good.where("team_id is null or timestamp is null or raw is null").count() == 0


def test_properties_may_be_an_object_or_a_json_string_and_the_message_lands_as_it_came(spark: SparkSession) -> None:
    records = [event(1, properties={"k": "v"}), event(2, properties='{"k": "v"}'), event(3, properties=...)]
    parsed = landing(spark, records).transform(parse_events(1_000_000))
    got = valid(parsed, BRONZE_EVENTS_COLUMNS).select("uuid", "raw", "timestamp")
    assertDataFrameEqual(
        got,
        spark.createDataFrame(
            [(f"{UUID}{i + 1}", r.decode(), datetime(2024, 6, 1, tzinfo=UTC)) for i, r in enumerate(records)],
            "uuid string, raw string, timestamp timestamp",
        ),
    )


def test_invalid_events_are_quarantined_with_the_reason_and_raw_bytes(spark: SparkSession) -> None:
    records = [
        b"\xff\xfe not utf8",
        b'{"uuid": ',
        b"[1,2]",
        event(3, team_id=...),
        event(4, team_id="two"),
        event(5, timestamp="yesterday"),
        event(6, uuid="nope"),
        event(7, properties=[1, 2]),
        event(8, event=7),
        event(9) + b" " * 200,
        event(0),
    ]
    parsed = landing(spark, records).transform(parse_events(200))
    bad = quarantined(parsed, "events")
    assertDataFrameEqual(
        bad.select("offset", "reason", "kind"),
        spark.createDataFrame(
            [
                (0, "not valid UTF-8", "events"),
                (1, "not valid JSON", "events"),
                (2, "not a JSON object", "events"),
                (3, "missing required field 'team_id'", "events"),
                (4, "field 'team_id' is not an integer", "events"),
                (5, "field 'timestamp' is not an ISO-8601 time", "events"),
                (6, "field 'uuid' is not a UUID", "events"),
                (7, "field 'properties' is not a JSON object", "events"),
                (8, "field 'event' is not a string", "events"),
                (9, f"message of {len(records[9])} bytes is over the limit of 200", "events"),
            ],
            "offset long, reason string, kind string",
        ),
    )
    assert bad.where("offset = 0").first()["raw"] == records[0]  # type: ignore[index]
    assert valid(parsed, BRONZE_EVENTS_COLUMNS).select("uuid").collect()[0][0] == f"{UUID}0"
