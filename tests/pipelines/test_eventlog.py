"""The event log's writes: a run's row at once, or a pass's rows held and written in one commit.

Arrow in, delta-rs commits, the tables read back with ``deltalake``: no Spark (the passes here
run flows that do no Spark work).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipelines.runtime.eventlog import EventLog, RunRecord, recorded
from pipelines.runtime.passes import run_pass
from pipelines.runtime.runner import Context, run_job
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


def test_a_pass_whose_check_results_cannot_be_written_still_writes_its_runs_and_says_why(log: EventLog) -> None:
    with log.batched():
        with recorded(log, "silver.events", "run-1") as record:
            record.quality.append({**RESULT, "rows_checked": "many"})  # not a number: refused
    assert commits(log, "pipeline_events") == [[("silver.events", "ok")]]
    assert commits(log, "expectation_results") == []
    assert log.failed is not None and log.failed.startswith("check results:")
    with log.batched(), recorded(log, "silver.events", "run-2"):
        pass
    assert log.failed is None


def test_a_run_on_another_thread_during_a_pass_writes_at_once(log: EventLog) -> None:
    def validate() -> None:
        with recorded(log, "validate", "run-2"):
            pass

    with log.batched():
        with recorded(log, "silver.events", "run-1"):
            pass
        other = threading.Thread(target=validate)
        other.start()
        other.join()
        assert commits(log, "pipeline_events") == [[("validate", "ok")]]
    assert commits(log, "pipeline_events") == [[("validate", "ok")], [("silver.events", "ok")]]


@dataclass
class FakeFlow:
    """A flow as ``run_pass`` sees it: its run is a job of the runner (one event-log row)."""

    name: str
    fails: bool = False


def fake_run(ctx: Context, flow: FakeFlow, options: object) -> RunRecord:
    """The runner of a :class:`FakeFlow`: a job that does nothing, or breaks."""

    def body(record: RunRecord) -> None:
        if flow.fails:
            raise RuntimeError(f"{flow.name} broke")

    return run_job(ctx, flow.name, body)


def pass_context(log: EventLog) -> Context:
    return Context(settings=None, spark=None, store=log.store, say=lambda _: None)  # type: ignore[arg-type]


def test_a_pass_left_after_its_first_flow_writes_that_flows_row_when_it_is_closed(log: EventLog) -> None:
    ctx = pass_context(log)
    records = run_pass(ctx, [FakeFlow("a"), FakeFlow("b")], run=fake_run)  # type: ignore[list-item,arg-type]
    assert next(records).job == "a"
    assert commits(ctx.events, "pipeline_events") == []
    records.close()  # as `medallion run` does on a stop
    assert commits(ctx.events, "pipeline_events") == [[("a", "ok")]]


def test_a_pass_with_a_failing_flow_writes_the_rows_before_it_and_its_own(log: EventLog) -> None:
    ctx = pass_context(log)
    with pytest.raises(RuntimeError, match="b broke"):
        list(run_pass(ctx, [FakeFlow("a"), FakeFlow("b", fails=True), FakeFlow("c")], run=fake_run))  # type: ignore[list-item,arg-type]
    assert commits(ctx.events, "pipeline_events") == [[("a", "ok"), ("b", "failed")]]


def test_a_pass_closed_on_another_thread_still_ends_its_openers_block(log: EventLog) -> None:
    ctx = pass_context(log)
    records = run_pass(ctx, [FakeFlow("a"), FakeFlow("b")], run=fake_run)  # type: ignore[list-item,arg-type]
    assert next(records).job == "a"
    closer = threading.Thread(target=records.close)
    closer.start()
    closer.join()
    assert commits(log, "pipeline_events") == [[("a", "ok")]]
    with recorded(log, "validate", "run-2"):  # this thread holds nothing any more: written at once
        pass
    assert commits(log, "pipeline_events") == [[("a", "ok")], [("validate", "ok")]]
