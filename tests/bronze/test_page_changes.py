from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from bronze.landing import quarantined, valid
from bronze.page_changes import BRONZE_PAGE_CHANGES_COLUMNS, parse_page_changes
from tests.helpers import fixture_page_changes, landing


def test_every_real_fixture_parses_with_its_key_revision_kind_and_time(spark: SparkSession) -> None:
    parsed = fixture_page_changes(spark).transform(parse_page_changes(1_000_000))
    good = valid(parsed, BRONZE_PAGE_CHANGES_COLUMNS)
    assert quarantined(parsed, "page_changes").count() == 0
    rows = good.where("page_id = 330275 and page_change_kind = 'delete'").select(
        "wiki_id", "page_id", "rev_id", "changelog_kind", "event_time", "namespace_id"
    )
    expected = spark.createDataFrame(
        [
            ("testwikidatawiki", 330275, 686140, "delete", datetime(2024, 10, 4, 15, 26, 14, tzinfo=UTC), 0),
            ("testwikidatawiki", 330275, 686140, "delete", datetime(2024, 10, 4, 15, 32, 58, tzinfo=UTC), 0),
        ],
        "wiki_id string, page_id long, rev_id long, changelog_kind string, event_time timestamp, namespace_id int",
    )
    assertDataFrameEqual(rows, expected)
    assert good.count() == 13
    # The raw value is kept as it came: the whole file, byte for byte.
    raw = good.where("rev_id = 934984984").first()
    assert raw is not None and raw["raw"].startswith("{") and '"prior_state"' in raw["raw"]


def test_bad_page_changes_are_quarantined_with_a_reason(spark: SparkSession) -> None:
    ok = '"wiki_id":"w","page":{"page_id":1},"revision":{"rev_id":2},"dt":"2024-01-01T00:00:00Z"'
    records = [
        b"not json",
        ("{" + ok + ',"page_change_kind":"explode"}').encode(),
        b'{"wiki_id":"w","page":{"page_id":"one"},"revision":{"rev_id":2},"page_change_kind":"edit","dt":"2024-01-01T00:00:00Z"}',
        b'{"wiki_id":"w","page":{"page_id":1},"page_change_kind":"edit","dt":"2024-01-01T00:00:00Z"}',
        b'{"wiki_id":"w","page":{"page_id":1},"revision":{"rev_id":2},"page_change_kind":"edit","dt":"noon"}',
        ("{" + ok + ',"page_change_kind":"edit"}').encode(),
    ]
    parsed = landing(spark, records).transform(parse_page_changes(1_000_000))
    assertDataFrameEqual(
        quarantined(parsed, "page_changes").select("offset", "reason"),
        spark.createDataFrame(
            [
                (0, "not valid JSON"),
                (1, "unknown page_change_kind explode"),
                (2, "field 'page.page_id' is not an integer"),
                (3, "missing required field 'revision.rev_id'"),
                (4, "field 'dt' is not an ISO-8601 time"),
            ],
            "offset long, reason string",
        ),
    )
    assert valid(parsed, BRONZE_PAGE_CHANGES_COLUMNS).select("offset").collect()[0][0] == 5
