"""The table suites catch what they are for: each test breaks one invariant in a tiny batch."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import SparkSession

from expectations.runner import Result, validate
from expectations.suites import (
    CLICKHOUSE,
    SUITES,
    bronze_events,
    clickhouse_export,
    gold_partials,
    gold_property_values,
    silver_events,
    silver_page_changes,
)
from pipelines.runtime.tables import EXPORT_OUTBOX, GOLD_PARTIALS, GOLD_PROPERTY_VALUES, SILVER_PAGE_CHANGES, table

T0 = datetime(2024, 6, 1, 0, 0)
T1 = datetime(2024, 6, 1, 0, 1)
T5 = datetime(2024, 6, 1, 0, 5)


def not_passed(results: list[Result]) -> dict[str, tuple[str, int | None]]:
    return {r.expectation: (r.outcome, r.rows_failed) for r in results if r.outcome != "passed"}


def page_change(rev: int, time: datetime, window: datetime, merged: int = 1, action: str = "update") -> tuple:
    return ("enwiki", 1, rev, time, "edit", action, window, window, merged, "m", "{}")


def test_silver_page_changes_must_increase_per_key_across_windows(spark: SparkSession) -> None:
    schema = SILVER_PAGE_CHANGES.schema
    good = spark.createDataFrame([page_change(10, T0, T0), page_change(11, T5, T5)], schema)
    assert not_passed(validate(good, silver_page_changes()).results) == {}
    # The later window emits an older revision: a reordering bug.
    bad = spark.createDataFrame([page_change(11, T0, T0), page_change(10, T5, T5, merged=0)], schema)
    assert not_passed(validate(bad, silver_page_changes()).results) == {
        "increasing_per_key": ("failed", 1),
        "merged_count_positive": ("failed", 1),
    }


def test_silver_events_bucket_must_be_in_range(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [("u1", 1, T0, 0), ("u2", 2, T0, 7), ("u3", 3, T0, 8)],
        "uuid string, team_id long, event_time timestamp, bucket int",
    )
    assert not_passed(validate(df, silver_events(8)).results) == {"bucket_in_range": ("failed", 1)}


def test_bronze_events_drop_rows_without_a_positive_team_and_fail_on_repeated_offsets(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [
            ("u1", "e", 1, "d", T0, "events", 0, 1),
            ("u2", "e", 0, "d", T0, "events", 0, 2),
            ("u3", "e", 2, "d", T0, "events", 0, 2),
            ("u4", "e", 2, "d", T0, None, None, None),  # landed from a file: no offsets
        ],
        "uuid string, event string, team_id long, distinct_id string, timestamp timestamp, topic string, "
        "partition int, offset long",
    )
    v = validate(df, bronze_events())
    assert not_passed(v.results) == {"team_id_positive": ("dropped", 1), "offsets_unique": ("failed", 2)}


def gold_row(value: str, count: int, window: datetime = T0) -> tuple:
    return (1, 0, "event", "$browser", value, window, count, T1, T0, T1)


def test_gold_needs_one_row_per_tuple_and_window_and_positive_counts(spark: SparkSession) -> None:
    schema = GOLD_PROPERTY_VALUES.schema
    df = spark.createDataFrame([gold_row("a", 2), gold_row("a", 1), gold_row("b", 0), gold_row("a", 1, T5)], schema)
    assert not_passed(validate(df, gold_property_values()).results) == {
        "one_row_per_tuple_window": ("failed", 2),
        "count_positive": ("failed", 1),
    }


def test_gold_figures_must_conserve_counts(spark: SparkSession) -> None:
    gold = spark.createDataFrame([gold_row("a", 2)], GOLD_PROPERTY_VALUES.schema)
    figures = spark.createDataFrame([(2, 3, 3)], "gold_count_sum long, partial_count_sum long, fanout_tuples long")
    v = validate(gold, gold_property_values(with_fanout=True), figures)
    failed = {r.expectation: r.observed for r in v.results if r.outcome == "failed"}
    assert failed == {"gold_equals_partials": "gold_count_sum 2 vs partial_count_sum 3"}


def test_partials_must_sum_to_the_tuples_fanned_out(spark: SparkSession) -> None:
    rows = [
        (1, 0, "event", "$browser", "a", T0, 2, T1, "b1", T1),
        (1, 0, "event", "$browser", "a", T0, 1, T1, "b2", T1),
    ]
    df = spark.createDataFrame(rows, GOLD_PARTIALS.schema)
    assert not_passed(validate(df, gold_partials(tuples=3)).results) == {}
    assert not_passed(validate(df, gold_partials(tuples=4)).results) == {"count_sum_equals_tuples": ("failed", None)}
    (total,) = [r for r in validate(df, gold_partials(tuples=4)).results if r.expectation == "count_sum_equals_tuples"]
    assert (total.kind, total.rows_checked, total.observed) == ("batch", 2, "observed 3")


def test_a_check_on_a_total_is_computed_with_the_row_counts_not_by_gx(spark: SparkSession, monkeypatch) -> None:
    import expectations.runner

    def no_gx(*_: object) -> None:
        raise AssertionError("GX ran")

    monkeypatch.setattr(expectations.runner, "_run_gx", no_gx)
    df = spark.createDataFrame([(1, 0, "event", "$browser", "a", T0, 2, T1, "b1", T1)], GOLD_PARTIALS.schema)
    # the gate's checks (the table-wide uniqueness check is GX's, and not a batch's)
    assert not_passed(validate(df, gold_partials(tuples=2).for_batches()).results) == {}
    assert not_passed(validate(df, gold_partials(tuples=3).for_batches()).results) == {
        "count_sum_equals_tuples": ("failed", None)
    }


def test_clickhouse_figures_must_match_what_was_exported(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [(1, "event", "k", "v", T0, 3)],
        "team_id long, property_type string, property_key string, property_value string, window_start timestamp, count long",
    )
    figures = spark.createDataFrame(
        [(4, 3, 1, 1)], "clickhouse_count_sum long, exported_count_sum long, clickhouse_rows long, exported_rows long"
    )
    assert not_passed(validate(rows, clickhouse_export().for_tables(), figures).results) == {
        "clickhouse_equals_exported": ("failed", 1)
    }


def test_every_check_of_every_suite_is_counted_without_gx(spark: SparkSession, monkeypatch) -> None:
    """Importing GX costs 3.5-4 CPU-seconds in each process that does: every check the suites ship,
    on a batch or on a whole table, is counted by Spark (or compared in Python), so a scheduled
    job's gates never load it. GX is made to fail here; each suite runs whole, with the
    parameters that add checks, on an empty table of its schema and a row of its figures."""
    import expectations.runner

    def no_gx(*_: object) -> None:
        raise AssertionError("GX ran")

    monkeypatch.setattr(expectations.runner, "_run_gx", no_gx)
    monkeypatch.setattr(expectations.runner, "_context", no_gx)
    params = {
        "silver/events": {"bucket_count": 8, "dedup_horizon_us": 86_400_000_000},
        "gold/property_value_partials": {"tuples": 0},
        "gold/property_values": {"with_fanout": True},
    }
    for key, make in SUITES.items():
        suite = make(**params.get(key, {}))
        schema = (EXPORT_OUTBOX if key == CLICKHOUSE else table(key)).schema
        pairs = [c.expects for c in suite.checks if c.on == "figures"]
        names = sorted({e.get(n) for e in pairs for n in ("column_A", "column_B")})
        figures = (
            spark.createDataFrame([tuple(0 for _ in names)], ", ".join(f"{n} long" for n in names)) if names else None
        )
        results = validate(spark.createDataFrame([], schema), suite, figures).results
        assert [r.expectation for r in results] == [c.name for c in suite.checks], key
        assert not_passed(results) == {}, key
