"""Suites evaluated in Arrow, held to the same suites run by Spark and Great Expectations."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from expectations.arrow import validate_arrow
from expectations.runner import DROPPED_BY, validate
from expectations.suites import bronze_events, bronze_page_changes, silver_page_changes

T0 = datetime(2024, 6, 1, tzinfo=UTC)


def events(n: int, seed: int) -> pa.Table:
    """Bronze-event-like rows with nulls, non-positive team ids and repeated offsets mixed in."""
    rng = random.Random(seed)

    def maybe(value: object, p: float = 0.05) -> object:
        return None if rng.random() < p else value

    return pa.table(
        {
            "uuid": [maybe(f"u{i}") for i in range(n)],
            "event": [maybe("e") for _ in range(n)],
            "team_id": [maybe(rng.choice([-1, 0, 1, 2, 3, 10**12])) for _ in range(n)],
            "distinct_id": [maybe("d") for _ in range(n)],
            "timestamp": pa.array([maybe(T0 + timedelta(seconds=i)) for i in range(n)], pa.timestamp("us", "UTC")),
            "topic": [maybe("events", 0.02) for _ in range(n)],
            "partition": pa.array([rng.randint(0, 1) for _ in range(n)], pa.int32()),
            "offset": [maybe(rng.randint(0, n), 0.02) for _ in range(n)],
        }
    )


def page_changes(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    kinds = ["create", "edit", "move", "delete", "undelete", "visibility_change", "bogus", None]
    return pa.table(
        {
            "wiki_id": [rng.choice(["enwiki", None]) for _ in range(n)],
            "page_id": [rng.choice([1, 2, None]) for _ in range(n)],
            "rev_id": [rng.choice([-5, 0, 1, 99, None]) for _ in range(n)],
            "event_time": pa.array([T0] * n, pa.timestamp("us", "UTC")),
            "page_change_kind": [rng.choice(kinds) for _ in range(n)],
            "topic": ["changes"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": [rng.randint(0, n) for _ in range(n)],
        }
    )


def outcomes(results: list) -> list[tuple]:
    return [(r.expectation, r.policy, r.kind, r.rows_checked, r.rows_failed, r.outcome) for r in results]


@pytest.mark.parametrize(
    ("suite", "table", "policies"),
    [
        (bronze_events(), events(400, 1), {}),
        (bronze_events(), events(400, 2), {"bronze/events": "warn"}),
        (bronze_events(), events(400, 3), {"bronze/events:team_id_positive": "fail"}),
        (bronze_page_changes(), page_changes(300, 4), {}),
        (bronze_page_changes(), page_changes(300, 5), {"bronze/page_changes:rev_id_positive": "drop"}),
    ],
)
def test_results_and_the_split_equal_spark_and_gx(
    spark: SparkSession, suite: object, table: pa.Table, policies: dict[str, str]
) -> None:
    suite = suite.with_policies(policies)  # type: ignore[attr-defined]
    ours = validate_arrow(table, suite)
    assert ours is not None
    df = spark.createDataFrame(table).persist()
    theirs = validate(df, suite)
    assert outcomes(ours.results) == outcomes(theirs.results)
    assert any(r.rows_failed for r in ours.results), "the data exercises the checks"

    def rows(t: pa.Table) -> list[tuple]:
        return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)

    def tagged(t: pa.Table) -> list[tuple]:
        return sorted(zip(t["offset"].to_pylist(), t[DROPPED_BY].to_pylist(), strict=True), key=repr)

    assert rows(ours.kept) == rows(theirs.kept.toArrow())
    if theirs.dropped is None:
        assert ours.dropped is None
    else:
        assert ours.dropped is not None
        assert tagged(ours.dropped) == tagged(theirs.dropped.toArrow())
    df.unpersist()


def test_a_suite_with_a_check_arrow_cannot_run_is_left_to_spark() -> None:
    assert validate_arrow(page_changes(3, 0), silver_page_changes()) is None


def test_a_kafka_flush_is_gated_without_importing_great_expectations() -> None:
    """Importing GX costs 3.5-4 CPU-seconds in each process; an ingest process gates its flushes
    in Arrow from the suites' kinds and arguments, so it never loads GX (a fresh interpreter: this
    one may have loaded it for other tests). Spark's batch queries are chosen the same way: every
    check of every suite is asked for one here too."""
    probe = (
        "import sys\n"
        "from expectations.arrow import validate_arrow\n"
        "from expectations.batch import failing_rows_query\n"
        "from expectations.suites import SUITES, bronze_events, bronze_page_changes\n"
        "from tests.expectations.test_arrow import events, page_changes\n"
        "ours = validate_arrow(events(400, 1), bronze_events())\n"
        "assert ours is not None and ours.dropped is not None, 'the rows exercise the drop checks'\n"
        "assert validate_arrow(page_changes(300, 4), bronze_page_changes()) is not None\n"
        "suites = [make(bucket_count=8) if key == 'silver/events' else make() for key, make in SUITES.items()]\n"
        "assert any(failing_rows_query(c) for s in suites for c in s.checks), 'some checks are batch queries'\n"
        "print(sorted(m for m in sys.modules if m.startswith('great_expectations')))\n"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=repo)
    assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr
