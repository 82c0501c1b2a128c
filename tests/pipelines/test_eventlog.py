"""The event log's writes: a run's row at once, or a pass's rows held and written in one commit.

Arrow in, delta-rs commits, the tables read back with ``deltalake``: no Spark.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipelines.eventlog import EventLog, recorded
from pipelines.storage.deltars import DeltaRsStore

RESULT = {
    "dataset": "silver/events",
    "expectation": "team_id_positive",
    "policy": "warn",
    "kind": "row",
    "rows_checked": 3,
    "rows_failed": 0,
    "outcome": "passed",
    "observed": None,
    "description": "team_id > 0",
}


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return EventLog(DeltaRsStore(None, str(tmp_path / "lake")))


def rows(log: EventLog, table: str, version: int | None = None) -> list[dict[str, Any]]:
    return DeltaTable(f"{log.store.lake_root}/_meta/{table}", version=version).to_pyarrow_table().to_pylist()


def commits(log: EventLog, table: str) -> list[list[tuple[str, str]]]:
    """Per commit after the table's creation, the (job, status) or (job, expectation) rows it
    added, sorted."""
    if not Path(log.store.lake_root, "_meta", table, "_delta_log").exists():
        return []
    key = "status" if table == "pipeline_events" else "expectation"
    out = []
    for version in range(1, DeltaTable(f"{log.store.lake_root}/_meta/{table}").version() + 1):
        added = Counter((r["job"], r[key]) for r in rows(log, table, version))
        added.subtract((r["job"], r[key]) for r in rows(log, table, version - 1))
        out.append(sorted(added.elements()))
    return out


def test_a_run_outside_a_pass_is_written_when_it_ends(log: EventLog) -> None:
    with recorded(log, "ingest_file.events", "run-1") as record:
        record.quality.append(RESULT)
    assert commits(log, "pipeline_events") == [[("ingest_file.events", "ok")]]
    assert commits(log, "expectation_results") == [[("ingest_file.events", "team_id_positive")]]


def test_the_runs_of_a_pass_are_written_together_when_it_ends(log: EventLog) -> None:
    with log.batched():
        with recorded(log, "silver.events", "run-1") as record:
            record.quality.append(RESULT)
        with recorded(log, "gold.partials", "run-1") as record:
            record.noop("nothing new")
        with log.batched():  # an inner block belongs to the outer one
            with recorded(log, "gold.merge", "run-1"):
                pass
        assert commits(log, "pipeline_events") == []
    assert commits(log, "pipeline_events") == [
        [("gold.merge", "ok"), ("gold.partials", "noop"), ("silver.events", "ok")]
    ]
    assert commits(log, "expectation_results") == [[("silver.events", "team_id_positive")]]


def test_a_pass_that_fails_still_writes_the_runs_it_had_with_the_failed_one(log: EventLog) -> None:
    with pytest.raises(RuntimeError, match="boom"), log.batched():
        with recorded(log, "silver.events", "run-1"):
            pass
        with recorded(log, "gold.partials", "run-1"):
            raise RuntimeError("boom")
    assert commits(log, "pipeline_events") == [[("gold.partials", "failed"), ("silver.events", "ok")]]
    assert commits(log, "expectation_results") == []
    (failed,) = [r for r in rows(log, "pipeline_events") if r["status"] == "failed"]
    assert failed["error"] == "RuntimeError: boom"
