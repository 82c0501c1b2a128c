from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from bronze.landing import valid
from bronze.page_changes import BRONZE_PAGE_CHANGES_COLUMNS, parse_page_changes
from silver.page_changes import (
    EVENT_COLUMNS,
    LAST_EMITTED_SCHEMA,
    PAGE_CHANGE_STATE_SCHEMA,
    SILVER_PAGE_CHANGES_SCHEMA,
    dedup_page_changes,
    dedup_run,
    event_clock,
    next_state,
    state_before,
    state_events,
    state_last_emitted,
    state_progress,
)
from tests.helpers import fixture_page_changes

W = timedelta(minutes=5)
OUT = "wiki_id string, page_id long, rev_id long, event_time timestamp, page_change_kind string, action string, merged_count int"
COLS = ["wiki_id", "page_id", "rev_id", "event_time", "page_change_kind", "action", "merged_count"]


def at(hms: str, day: int = 4) -> datetime:
    h, m, s = (int(x) for x in hms.split(":"))
    return datetime(2024, 10, day, h, m, s, tzinfo=UTC)


def bronze_fixtures(spark: SparkSession) -> DataFrame:
    return valid(fixture_page_changes(spark).transform(parse_page_changes(1_000_000)), BRONZE_PAGE_CHANGES_COLUMNS)


# The six fixture events that stand alone in their window, in either mode.
ALONE = [
    ("commonswiki", 114491269, 934984984, datetime(2024, 10, 7, 19, 33, 46, tzinfo=UTC), "edit", "update", 1),
    ("commonswiki", 90146511, 935026237, datetime(2024, 10, 7, 20, 44, 58, tzinfo=UTC), "edit", "update", 1),
    ("commonswiki", 49988679, 930818273, datetime(2024, 9, 30, 22, 33, 39, tzinfo=UTC), "move", "update", 1),
    ("testwikidatawiki", 330350, 686857, datetime(2024, 10, 8, 7, 35, 59, tzinfo=UTC), "create", "update", 1),
    ("testwikidatawiki", 330276, 686143, at("16:36:23"), "create", "update", 1),
    ("testwikidatawiki", 728, 686147, at("16:36:56"), "edit", "update", 1),
]
PAGE = ("testwikidatawiki", 330275)


def test_worked_example_staggered_emits_eleven_of_thirteen(spark: SparkSession) -> None:
    out = bronze_fixtures(spark).transform(dedup_page_changes("staggered", W))
    expected = [
        (*PAGE, 686138, at("15:09:55"), "create", "update", 1),
        (*PAGE, 686139, at("15:16:26"), "edit", "update", 1),
        (*PAGE, 686140, at("15:27:28"), "undelete", "update", 2),
        (*PAGE, 686140, at("15:37:46"), "undelete", "update", 2),
        (*PAGE, 686140, at("16:16:05"), "visibility_change", "update", 1),
        *ALONE,
    ]
    assertDataFrameEqual(out.select(*COLS), spark.createDataFrame(expected, OUT))
    windows = out.where("page_id = 330275 and rev_id = 686140").select("window_start", "window_end")
    assertDataFrameEqual(
        windows,
        spark.createDataFrame(
            [
                (at("15:26:14"), at("15:31:14")),
                (at("15:32:58"), at("15:37:58")),
                (at("16:16:05"), at("16:21:05")),
            ],
            "window_start timestamp, window_end timestamp",
        ),
    )


def test_worked_example_tumbling_emits_twelve_of_thirteen(spark: SparkSession) -> None:
    out = bronze_fixtures(spark).transform(dedup_page_changes("tumbling", W))
    expected = [
        (*PAGE, 686138, at("15:09:55"), "create", "update", 1),
        (*PAGE, 686139, at("15:16:26"), "edit", "update", 1),
        (*PAGE, 686140, at("15:27:28"), "undelete", "update", 2),
        (*PAGE, 686140, at("15:32:58"), "delete", "delete", 1),
        (*PAGE, 686140, at("15:37:46"), "undelete", "update", 1),
        (*PAGE, 686140, at("16:16:05"), "visibility_change", "update", 1),
        *ALONE,
    ]
    assertDataFrameEqual(out.select(*COLS), spark.createDataFrame(expected, OUT))


def rows(spark: SparkSession, events: list[tuple[int, str, str]]) -> DataFrame:
    """Events of one key: (rev_id, hh:mm:ss, kind)."""
    return spark.createDataFrame(
        [("w", 1, rev, at(t), kind) for rev, t, kind in events],
        "wiki_id string, page_id long, rev_id long, event_time timestamp, page_change_kind string",
    ).selectExpr("*", "cast(null as string) as meta_id", "'{}' as raw")


@pytest.mark.parametrize("mode", ["staggered", "tumbling"])
def test_delete_supersedes_older_revisions_and_a_later_revision_follows_it(spark: SparkSession, mode: str) -> None:
    events = [
        (10, "10:00:01", "edit"),
        (11, "10:00:02", "edit"),
        (11, "10:00:03", "delete"),
        (12, "10:00:04", "edit"),
    ]
    out = rows(spark, events).transform(dedup_page_changes(mode, W))
    assertDataFrameEqual(
        out.select("rev_id", "page_change_kind", "merged_count"),
        spark.createDataFrame(
            [(11, "delete", 3), (12, "edit", 1)], "rev_id long, page_change_kind string, merged_count int"
        ),
    )


@pytest.mark.parametrize("mode", ["staggered", "tumbling"])
def test_same_revision_tie_goes_to_the_delete(spark: SparkSession, mode: str) -> None:
    events = [(5, "10:00:01", "edit"), (5, "10:00:01", "delete"), (5, "10:00:01", "edit")]
    out = rows(spark, events).transform(dedup_page_changes(mode, W))
    assertDataFrameEqual(
        out.select("rev_id", "action", "merged_count"),
        spark.createDataFrame([(5, "delete", 3)], "rev_id long, action string, merged_count int"),
    )


def test_out_of_order_arrival_keeps_the_greatest_revision(spark: SparkSession) -> None:
    events = [
        (3, "10:00:05", "edit"),
        (1, "10:00:01", "create"),
        (2, "10:00:03", "edit"),
        (3, "10:00:05", "edit"),
    ]
    out = rows(spark, events).transform(dedup_page_changes("staggered", W))
    assertDataFrameEqual(
        out.select("rev_id", "merged_count"), spark.createDataFrame([(3, 4)], "rev_id long, merged_count int")
    )


def test_the_watermark_trails_the_newest_event_and_a_drain_closes_every_window() -> None:
    lateness = timedelta(minutes=1)
    assert event_clock(None, None, lateness, drain=False) == (None, None)
    assert event_clock(None, at("10:00:00"), lateness, drain=False) == (at("10:00:00"), at("09:59:00"))
    # A batch of older events never moves the clock back.
    assert event_clock(at("10:00:00"), at("09:00:00"), lateness, drain=False) == (at("10:00:00"), at("09:59:00"))
    assert event_clock(at("10:00:00"), at("10:05:00"), lateness, drain=True) == (at("10:05:00"), None)


def test_the_state_a_run_leaves_reads_back_as_its_buffer_keys_outbox_and_progress(spark: SparkSession) -> None:
    open_events = spark.createDataFrame(
        [("enwiki", 1, 10, at("10:01:00"), "edit", "m1", "{}", at("10:00:00"), at("10:05:00"))],
        "wiki_id string, page_id long, rev_id long, event_time timestamp, page_change_kind string, meta_id string, "
        "raw string, window_start timestamp, window_end timestamp",
    )
    last = spark.createDataFrame([("enwiki", 2, 7, at("09:58:00"))], LAST_EMITTED_SCHEMA)
    emitted = spark.createDataFrame(
        [("enwiki", 2, 7, at("09:58:00"), "edit", "update", at("09:55:00"), at("10:00:00"), 2, "m0", "{}")],
        SILVER_PAGE_CHANGES_SCHEMA,
    )
    state = next_state(open_events, last, emitted, at("10:01:00"), 7)
    assert sorted(state.columns) == sorted(PAGE_CHANGE_STATE_SCHEMA.fieldNames())
    assertDataFrameEqual(state.transform(state_events), open_events.select(*EVENT_COLUMNS))
    assertDataFrameEqual(state.transform(state_last_emitted), last)
    assertDataFrameEqual(state.where("kind = 'emit'").select(*SILVER_PAGE_CHANGES_SCHEMA.fieldNames()), emitted)
    assertDataFrameEqual(
        state.transform(state_progress),
        spark.createDataFrame([(7, at("10:01:00"))], "bronze_version long, max_event_time timestamp"),
    )
    assertDataFrameEqual(
        state.transform(state_before),
        spark.createDataFrame([(at("10:01:00"), 1)], "max_event_time timestamp, buffered long"),
    )
    assertDataFrameEqual(  # before the first run: no progress, nothing buffered
        state.limit(0).transform(state_before),
        spark.createDataFrame([(None, 0)], "max_event_time timestamp, buffered long"),
    )


@pytest.mark.parametrize("mode", ["staggered", "tumbling"])
def test_a_run_shuffles_its_events_text_once(
    spark: SparkSession, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The rules all group by the page (and more): once the events are partitioned by it, the windows,
    # the stale rule and rules 1-4 find them where they are; only figures and state move again.
    events = bronze_fixtures(spark).select(*EVENT_COLUMNS)
    last = spark.createDataFrame([("testwikidatawiki", 330275, 1, at("00:00:00"))], LAST_EMITTED_SCHEMA)
    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # the plan as planned, not re-planned
    try:
        dedup_run(events, last, mode, W, at("17:00:00")).emitted.explain(mode="formatted")
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before)
    plan = capsys.readouterr().out
    shuffled = re.findall(r"\) Exchange\nInput \[\d+\]: \[([^\]]*)\]", plan)
    assert shuffled, plan
    assert sum("raw#" in columns for columns in shuffled) == 1, plan
