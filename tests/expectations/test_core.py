"""Checks: the rows ``drop`` removes are the rows GX counts as unexpected; policies from settings."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from expectations.core import (
    PolicyError,
    Suite,
    at_least_column,
    between,
    figures_equal,
    in_set,
    no_rows,
    not_null,
    policy_problems,
    unique,
)
from expectations.runner import _run_gx, validate

SCHEMA = "id long, team_id long, kind string, first_seen long, last_seen long"
ROWS = [
    (1, 5, "edit", 1, 2),
    (2, None, "create", 2, 2),
    (3, 0, "bogus", 3, 1),
    (4, -3, None, None, 1),
    (5, 12, "it's", 5, None),
]


@pytest.mark.parametrize(
    "check",
    [
        not_null("team_id"),
        between("team_id", low=1),
        between("team_id", high=10),
        between("team_id", low=0, high=10),
        in_set("kind", ["edit", "create", "it's"]),
        at_least_column("last_seen", "first_seen"),
    ],
    ids=lambda c: c.name + ":" + c.description,
)
def test_drop_removes_exactly_the_rows_gx_counts_as_unexpected(spark: SparkSession, check) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame(ROWS, SCHEMA).persist()
    suite = Suite("t/x", (check,))
    v = validate(df, suite)
    (result,) = v.results
    # GX itself, the model the one-pass counts stand in for.
    (gx_result,) = _run_gx(df, [check], "t__x_model")
    unexpected = gx_result.result["unexpected_count"]
    dropped = 0 if v.dropped is None else v.dropped.count()
    assert result.rows_failed == dropped == 5 - v.kept.count() == unexpected
    assert result.rows_checked == 5 == gx_result.result["element_count"]
    if dropped:
        assert result.outcome == "dropped"
        assert {r["_expectation"] for r in v.dropped.collect()} == {check.name}  # type: ignore[union-attr]


def test_each_row_goes_to_the_first_failing_drop_check(spark: SparkSession) -> None:
    df = spark.createDataFrame(ROWS, SCHEMA)
    v = validate(df, Suite("t/x", (not_null("team_id"), between("team_id", low=1, name="team_positive"))))
    assert v.dropped is not None
    by_id = {r["id"]: r["_expectation"] for r in v.dropped.collect()}
    assert by_id == {2: "team_id_not_null", 3: "team_positive", 4: "team_positive"}
    assert sorted(r["id"] for r in v.kept.collect()) == [1, 5]


def test_row_level_checks_cost_one_pass_over_the_batch(spark: SparkSession) -> None:
    """Five row checks cost the Spark jobs of one: a gate must not read the batch once per check."""
    df = spark.createDataFrame(ROWS, SCHEMA).persist()
    df.count()
    checks = (
        not_null("team_id"),
        between("team_id", low=0, high=10),
        in_set("kind", ["edit", "create"]),
        at_least_column("last_seen", "first_seen"),
        not_null("kind", policy="warn"),
    )
    sc = spark.sparkContext

    def jobs(group: str, suite: Suite) -> tuple[int, Any]:
        sc.setJobGroup(group, "row checks")
        try:
            v = validate(df, suite)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return len(sc.statusTracker().getJobIdsForGroup(group)), v

    one, _ = jobs("one-check", Suite("t/x", checks[:1]))
    five, v = jobs("five-checks", Suite("t/x", checks))
    assert five == one
    # By hand: team null in row 2; out of 0..10 in rows 4 and 5; kind unknown in rows 3 and 5
    # (null passes); last_seen < first_seen in row 3; kind null in row 4.
    assert [(r.expectation, r.rows_failed, r.outcome) for r in v.results] == [
        ("team_id_not_null", 1, "dropped"),
        ("team_id_in_range", 2, "dropped"),
        ("kind_known", 2, "dropped"),
        ("last_seen_not_before_first_seen", 1, "dropped"),
        ("kind_not_null", 1, "warned"),
    ]


def test_unique_ignores_rows_with_a_null_key_column(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [("t", 0, 1), ("t", 0, 2), (None, None, None), (None, None, None), ("t", 0, 1)], "topic string, p int, o long"
    )
    (r,) = validate(df, Suite("t/x", (unique(["topic", "p", "o"], "offsets_unique"),))).results
    assert (r.outcome, r.rows_failed) == ("failed", 2)


DUPLICATES = [("t", 0, 1), ("t", 0, 2), (None, 0, 1), (None, 0, 1), ("t", 0, 1), ("u", None, 7), ("u", None, 7)]


@pytest.mark.parametrize(
    "check",
    [
        unique(["topic", "p", "o"], "offsets_unique"),
        unique(["topic"], "topic_unique"),
        unique(["o"], "o_unique"),
        unique(["topic", "p"], "topic_p_unique"),
        no_rows("no_big_offsets", "SELECT * FROM {batch} WHERE o > 1", "o is at most 1"),
        no_rows("no_sevens", "SELECT o FROM {batch} WHERE o = 7 GROUP BY o", "no offset 7"),
        no_rows("none_missing", "SELECT * FROM {batch} WHERE topic IS NULL AND o > 5", "held"),
    ],
    ids=lambda c: c.name,
)
def test_checks_on_the_whole_batch_count_what_gx_counts_without_gx(spark: SparkSession, check, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import expectations.runner

    df = spark.createDataFrame(DUPLICATES, "topic string, p int, o long").persist()
    (gx_result,) = _run_gx(df, [check], "t__x_model")  # GX itself, the model Spark's count stands in for
    info = gx_result.result
    unexpected = info["unexpected_count"] if "unexpected_count" in info else info["observed_value"]

    def no_gx(*_: object) -> None:
        raise AssertionError("GX ran")

    monkeypatch.setattr(expectations.runner, "_run_gx", no_gx)
    (r,) = validate(df, Suite("t/x", (check,))).results
    assert (r.rows_failed, r.outcome == "passed", r.rows_checked) == (unexpected, gx_result.success, 7)


def test_figures_are_compared_as_gx_compares_them_without_gx(spark: SparkSession, monkeypatch) -> None:
    import expectations.runner

    checks = (
        figures_equal("a", "b", "a_is_b", "a == b"),
        figures_equal("a", "c", "a_is_c", "a == c"),
        figures_equal("d", "e", "d_is_e", "both missing"),
        figures_equal("a", "d", "a_is_d", "one missing"),
    )
    figures = spark.createDataFrame([(3, 3, 4, None, None)], "a long, b long, c long, d long, e long")
    rows = spark.createDataFrame([(1,)], "x long")
    model = {
        c.name: r.success for c, r in zip(checks, _run_gx(figures, list(checks), "t__x_figures_model"), strict=True)
    }
    monkeypatch.setattr(expectations.runner, "_run_gx", lambda *_: (_ for _ in ()).throw(AssertionError("GX ran")))
    results = validate(rows, Suite("t/x", checks), figures).results
    assert (
        {r.expectation: r.outcome == "passed" for r in results}
        == model
        == {
            "a_is_b": True,
            "a_is_c": False,
            "d_is_e": True,
            "a_is_d": False,
        }
    )
    assert [r.observed for r in results] == ["a 3 vs b 3", "a 3 vs c 4", "d - vs e -", "a 3 vs d -"]


def test_a_batch_query_spark_cannot_resolve_is_an_error_naming_the_check(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1,)], "a long")
    with pytest.raises(RuntimeError, match="t/x: expectation bad_query could not run"):
        validate(df, Suite("t/x", (no_rows("bad_query", "SELECT * FROM {batch} WHERE nope > 1", "bad"),)))


def test_policies_from_settings_override_per_table_then_per_check() -> None:
    suite = Suite("t/x", (not_null("a"), not_null("b", policy="fail"), unique(["a"], "a_unique")))
    assert [c.policy for c in suite.with_policies({"t/x": "warn"}).checks] == ["warn", "warn", "warn"]
    assert [c.policy for c in suite.with_policies({"t/x": "warn", "t/x:b_not_null": "drop"}).checks] == [
        "warn",
        "drop",
        "warn",
    ]
    # A table-wide drop reaches the checks that can drop rows; the batch check keeps its own policy.
    assert [c.policy for c in suite.with_policies({"t/x": "drop"}).checks] == ["drop", "drop", "fail"]
    assert suite.with_policies({"other/table": "warn"}) == suite


def test_policies_that_cannot_apply_are_clear_settings_errors() -> None:
    suite = Suite("t/x", (not_null("a"), unique(["a"], "a_unique")))
    problems = policy_problems(suite, {"t/x:nope": "warn", "t/x:a_unique": "drop", "t/x": "ignore"})
    assert problems == [
        "MEDALLION_QUALITY__POLICIES['t/x:nope']: t/x has no expectation 'nope'; it has a_not_null, a_unique",
        "MEDALLION_QUALITY__POLICIES['t/x:a_unique']: a_unique checks the whole batch, so it cannot drop rows; "
        "use warn or fail",
        "MEDALLION_QUALITY__POLICIES['t/x']: 'ignore' is not a policy; use one of warn, drop, fail",
    ]
    with pytest.raises(PolicyError) as err:
        suite.with_policies({"t/x:nope": "warn"})
    assert err.value.problems == problems[:1]


def test_a_check_gx_cannot_evaluate_is_an_error_not_a_pass(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1,)], "a long")
    with pytest.raises(RuntimeError, match="missing_column"):
        validate(df, Suite("t/x", (not_null("missing_column", policy="warn"),)))


def test_validation_keeps_no_reference_to_the_frames_it_validated(spark: SparkSession) -> None:
    """GX caches every batch (and persisted it): a long-running job ran out of heap that way."""
    from expectations.runner import _datasource

    cached_before = spark.sparkContext._jsc.getPersistentRDDs().size()
    for _ in range(3):
        df = spark.createDataFrame(ROWS, SCHEMA)
        validate(df, Suite("t/x", (not_null("team_id"),)))
    manager = _datasource().get_execution_engine().batch_manager
    assert not manager._batch_cache and not manager._batch_data_cache
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == cached_before
