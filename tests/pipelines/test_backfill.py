"""``medallion backfill gold``: a rule changed, a window range counted again from silver, ClickHouse
corrected once; checked against counts made here from the events themselves (an independent
model: old rules outside the range, new rules inside), across crashes and a concurrent run.

Each test starts Spark jobs on the session's Spark and the embedded ClickHouse (chdb)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from gold.backfill import iso
from pipelines.app.cli import cli
from pipelines.errors import CommitConflictError, InputError
from pipelines.flows.checks import gold_frames
from pipelines.runtime import backfill, ingest, passes
from pipelines.runtime.backfill import backfill_gold
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES
from tests.pipelines.test_export import clickhouse_state, event, gold_state, make_ctx, nonzero, pipeline, write

pytestmark = pytest.mark.integration

#: 3 minutes of events, one every 3 s: windows of 30 s at 0, 30, ..., 150 s past midnight; each
#: event has a browser (Firefox or Chrome) and plan=free.
STREAM = [event(i, second=i * 3) for i in range(60)]
MIDNIGHT = datetime(2024, 6, 1, tzinfo=UTC)
#: The range backfilled: the windows at 60 and 90 s.
FROM, TO = datetime(2024, 6, 1, 0, 1, tzinfo=UTC), datetime(2024, 6, 1, 0, 2, tzinfo=UTC)


def expected(events: list[dict[str, Any]], excluded_in_range: set[str], excluded_after: set[str] = frozenset()) -> dict:
    """Gold as the rules say, counted here: per (team, type, key, value, window start in epoch
    seconds), the events' properties; a key in ``excluded_in_range`` is not counted in the range's
    windows, one in ``excluded_after`` nowhere (for events landed after the rule changed)."""
    counts: Counter[tuple] = Counter()
    start = int(MIDNIGHT.timestamp())
    for e in events:
        minute, second = (int(p) for p in e["timestamp"][14:19].split(":"))
        window = start + (minute * 60 + second) // 30 * 30
        in_range = FROM.timestamp() <= window < TO.timestamp()
        for key, value in e["properties"].items():
            if (key in excluded_in_range and in_range) or key in e.get("_excluded", excluded_after):
                continue
            counts[(e["team_id"], "event", key, value, window)] += 1
    return dict(counts)


def counted_then_plan_excluded(spark: SparkSession, tmp_path: Path) -> Context:
    """A lake that counted and exported STREAM, under the settings after the rule changed ("plan"
    no longer counted)."""
    pipeline(make_ctx(spark, tmp_path / "lake"), [write(tmp_path / "a.jsonl", STREAM)])
    return make_ctx(spark, tmp_path / "lake", excluded_keys=["plan"])


def another_run_counts(ctx: Context, tmp_path: Path, events: list[dict[str, Any]]) -> None:
    """As another process running `run all` would: ``events`` landed, made silver and counted by stage 1."""
    ingest.ingest_files(ctx, "events", [write(tmp_path / "late.jsonl", events)])
    passes.silver_events(ctx)
    passes.gold_partials(ctx)


def status_backfill_row(*words: str) -> list[str]:
    """The cells of the row of `medallion status`'s Backfills table that holds every one of ``words``."""
    shown = CliRunner().invoke(cli, ["status"], terminal_width=300)
    assert shown.exit_code == 0, shown.output
    backfills = shown.output[shown.output.index("Backfills") :].splitlines()
    row = next(line for line in backfills if all(w in line for w in words))
    return [c.strip() for c in row.split("│")[1:-1]]


def last_backfill(ctx: Any) -> Any:
    return ctx.store.read(PIPELINE_EVENTS).where("job = 'backfill.gold'").orderBy("started_at").collect()[-1]


def test_a_key_excluded_then_backfilled_leaves_old_counts_outside_the_range_and_new_ones_inside(
    spark: SparkSession, tmp_path: Path
) -> None:
    """On delta-rs; a whole backfill on delta-spark is the test of a write Delta skipped (below),
    and the storage contract runs replace, its guard and time travel on both engines."""
    engine = "delta-rs"
    ctx = make_ctx(spark, tmp_path / "lake", engine)
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    assert gold_state(ctx) == expected(STREAM, set())
    # The rule changes: "plan" is no longer counted. Gold's windows at 60 and 90 s are counted again.
    now = make_ctx(spark, tmp_path / "lake", engine, excluded_keys=["plan"])
    record = backfill_gold(now, FROM, TO)
    want = expected(STREAM, {"plan"})
    assert gold_state(now) == want
    sums, _ = clickhouse_state(now)
    assert nonzero(sums) == want  # the two "plan" tuples taken back from ClickHouse, the rest as it was
    m = record.metrics
    assert (m["windows"], m["tuples"], m["tuples_removed"], m["tuples_unchanged"], m["tuples_added"]) == (
        2,
        20,
        2,
        4,
        0,
    )
    assert m["skipped.excluded_key"] == 20
    row = last_backfill(now)
    assert row["status"] == "ok" and json.loads(row["details"])["changed"] == {"rules.excluded_keys": [[], ["plan"]]}
    # Gold still sums its partials: the range's were replaced too. (The fan-out of all of silver
    # under the new rules is not what the partials outside the range hold: they keep the old.)
    frames = gold_frames(now.store, now.settings)
    assert frames is not None
    figures = frames[1].first()
    assert figures["gold_count_sum"] == figures["partial_count_sum"] == sum(want.values())
    assert figures["fanout_tuples"] == sum(expected(STREAM, {"plan"}, {"plan"}).values())  # all of silver, new rules
    # Increments after it count as always, with the rules in force: a late event into the range
    # and one after it; stage 2 never adds the backfill's partials a second time.
    late = [event(900, second=65, props={"plan": "pro", "browser": "Firefox"}), event(901, second=170)]
    pipeline(now, [write(tmp_path / "late.jsonl", late)])
    want = expected([*STREAM, *({**e, "_excluded": {"plan"}} for e in late)], {"plan"})
    assert gold_state(now) == want
    assert nonzero(clickhouse_state(now)[0]) == want


def test_a_backfill_killed_between_its_commits_is_finished_by_the_same_command(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = counted_then_plan_excluded(spark, tmp_path)
    replace = type(now.store).replace

    def dies_before_gold(self: Any, spec: Any, *args: Any, **kwargs: Any) -> int:
        if spec == GOLD_PROPERTY_VALUES:
            raise SystemExit("killed")  # not an error a retry takes: the process is gone
        return replace(self, spec, *args, **kwargs)

    monkeypatch.setattr(type(now.store), "replace", dies_before_gold)
    with pytest.raises(SystemExit):
        backfill_gold(now, FROM, TO)
    monkeypatch.undo()
    # A `run all` in between: stage 2 reads the backfill's partials and adds none of them.
    passes.gold_merge(now)
    assert gold_state(now) == expected(STREAM, set())
    # Killed again, after gold's commit and before the export: ClickHouse still has the old counts.
    monkeypatch.setattr(backfill.passes, "export_property_values", lambda *_: (_ for _ in ()).throw(SystemExit))
    with pytest.raises(SystemExit):
        backfill_gold(now, FROM, TO)
    monkeypatch.undo()
    assert gold_state(now) == expected(STREAM, {"plan"}) and clickhouse_state(now)[0] == expected(STREAM, set())
    backfill_gold(now, FROM, TO)
    want = expected(STREAM, {"plan"})
    assert gold_state(now) == want and nonzero(clickhouse_state(now)[0]) == want
    parts = now.store.read(GOLD_PARTIALS).where("window_start >= '2024-06-01 00:01:00'")
    assert parts.where("window_start < '2024-06-01 00:02:00' AND batch_id NOT LIKE 'backfill:%'").count() == 0


def test_a_run_that_commits_during_a_backfill_makes_it_start_over_and_nothing_is_counted_twice(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = counted_then_plan_excluded(spark, tmp_path)
    late = [event(900, second=70, props={"browser": "Firefox", "plan": "pro"})]
    replace, raced = type(now.store).replace, []

    def another_run_commits_first(self: Any, spec: Any, *args: Any, **kwargs: Any) -> int:
        if spec == GOLD_PARTIALS and not raced:  # another process lands and counts an event
            raced.append(True)
            another_run_counts(now, tmp_path, late)
        return replace(self, spec, *args, **kwargs)

    monkeypatch.setattr(type(now.store), "replace", another_run_commits_first)
    record = backfill_gold(now, FROM, TO)
    assert raced and record.metrics.get("conflict_retries", 0) >= 1
    want = expected([*STREAM, *late], {"plan"})  # the late event counted once, under the new rules
    assert gold_state(now) == want and nonzero(clickhouse_state(now)[0]) == want


def test_a_range_before_what_silver_holds_is_refused_and_one_without_windows_does_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    ctx = make_ctx(spark, tmp_path / "lake")
    assert backfill_gold(ctx, FROM, TO).status == "noop"  # nothing counted yet
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    with pytest.raises(InputError, match="the earliest start it can do is 2024-06-01T00:00:00Z"):
        backfill_gold(ctx, datetime(2024, 5, 31, 23, 0, tzinfo=UTC), TO)
    version = ctx.store.version(GOLD_PROPERTY_VALUES)
    none = backfill_gold(ctx, datetime(2024, 6, 1, 0, 1, 1, tzinfo=UTC), datetime(2024, 6, 1, 0, 1, 20, tzinfo=UTC))
    assert none.status == "noop" and "no window starts in" in (none.details or "")
    assert ctx.store.version(GOLD_PROPERTY_VALUES) == version
    wider = make_ctx(spark, tmp_path / "lake", window="60s")
    with pytest.raises(InputError, match=r"gold\.window is 0:01:00 but gold counted in windows of 0:00:30"):
        backfill_gold(wider, FROM, TO)
    assert ctx.store.version(GOLD_PROPERTY_VALUES) == version


def test_the_command_recounts_the_range_and_says_what_changed(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = counted_then_plan_excluded(spark, tmp_path)  # as `--set gold.excluded_keys=plan` gives
    monkeypatch.setattr("pipelines.app.cli.State.context", lambda self, validates=False: now)
    result = CliRunner().invoke(cli, ["backfill", "gold", "--from", "2024-06-01T00:01:00Z", "--to", "2024-06-01T00:02"])
    assert result.exit_code == 0, result.output
    assert "2 windows recounted: 0 tuples changed, 2 removed, 0 added, 4 as they were" in result.output
    assert gold_state(now) == expected(STREAM, {"plan"})
    assert status_backfill_row("backfill.gold")[1:] == [
        "backfill.gold",
        "ok",
        "[2024-06-01T00:01:00Z, 2024-06-01T00:02:00Z)",
        "rules.excluded_keys: [] -> ['plan']",
        "0",
        "2",
        "0",
        "4",
    ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--from", "yesterday", "--to", "2024-06-01"], "'yesterday' is not an ISO 8601 time"),
        (["--from", "2024-06-02", "--to", "2024-06-01"], "--to must be after --from"),
    ],
)
def test_the_command_refuses_a_range_it_cannot_read_before_spark_starts(args: list[str], error: str) -> None:
    result = CliRunner().invoke(cli, ["backfill", "gold", *args])
    assert result.exit_code == 2 and error in result.output, result.output


def test_a_backfill_that_keeps_meeting_another_run_stops_and_says_so(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(spark, tmp_path / "lake")
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    version = ctx.store.version(GOLD_PROPERTY_VALUES)

    def busy(_: Any) -> None:
        raise CommitConflictError("gold.merge: commit conflict")  # another run, every time

    monkeypatch.setattr(backfill.passes, "gold_merge", busy)
    with pytest.raises(CommitConflictError, match=r"another run kept committing to gold .* run it again once"):
        backfill_gold(ctx, FROM, TO)
    assert ctx.store.version(GOLD_PROPERTY_VALUES) == version
    row = last_backfill(ctx)
    assert row["status"] == "failed" and row["metrics"]["conflict_retries"] == 7


def test_partials_counted_during_a_backfill_after_its_own_are_added_once_by_stage_2(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = counted_then_plan_excluded(spark, tmp_path)
    late = [event(900, second=70, props={"browser": "Firefox", "plan": "pro"})]
    replace = type(now.store).replace

    def another_run_counts_right_after(self: Any, spec: Any, *args: Any, **kwargs: Any) -> int:
        version = replace(self, spec, *args, **kwargs)
        if spec == GOLD_PARTIALS:  # between the backfill's partials and its gold rows
            another_run_counts(now, tmp_path, late)
        return version

    monkeypatch.setattr(type(now.store), "replace", another_run_counts_right_after)
    backfill_gold(now, FROM, TO)
    monkeypatch.undo()
    assert gold_state(now) == expected(STREAM, {"plan"})  # the late event waits for stage 2 ...
    passes.gold_merge(now)
    passes.export_property_values(now, drain=True)
    want = expected([*STREAM, *late], {"plan"})  # ... which adds it once, under the new rules
    assert gold_state(now) == want and nonzero(clickhouse_state(now)[0]) == want


def test_on_delta_spark_a_gold_write_skipped_as_done_is_told_and_the_backfill_replaces_again(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delta_spark: Any
) -> None:
    """Delta on Spark skips a write whose app transaction is not ahead of the table's: a stage 2 in
    another process that records its progress through the backfill's partials just before gold's
    replace leaves that replace unwritten. The backfill tells so and starts over."""
    pipeline(make_ctx(spark, tmp_path / "lake", "delta-spark"), [write(tmp_path / "a.jsonl", STREAM)])
    now = make_ctx(spark, tmp_path / "lake", "delta-spark", excluded_keys=["plan"])
    store_type, raced = type(now.store), []
    write_ = store_type._write

    def stage_2_records_first(self: Any, spec: Any, data: Any, txns: Any, mode: str, **kwargs: Any) -> int:
        if spec == GOLD_PROPERTY_VALUES and kwargs.get("replace_where") and not raced:
            raced.append(True)  # the progress the replace records, committed alone, as stage 2 would
            self.append(spec, spec.arrow_schema.empty_table(), list(txns))
        return write_(self, spec, data, txns, mode, **kwargs)

    monkeypatch.setattr(store_type, "_write", stage_2_records_first)
    record = backfill_gold(now, FROM, TO)
    monkeypatch.undo()
    assert raced and record.metrics.get("conflict_retries", 0) >= 1
    want = expected(STREAM, {"plan"})
    assert gold_state(now) == want and nonzero(clickhouse_state(now)[0]) == want


def commits(table: Path) -> int:
    """How many commits a table's log holds (its files, as another process writes them)."""
    return len(list((table / "_delta_log").glob("*.json")))


# Starts a JVM: `medallion backfill gold` in a process of its own, which the test kills.
@pytest.mark.slow(seconds=90)
def test_a_backfill_killed_with_sigkill_at_a_random_moment_is_finished_by_the_same_command(
    spark: SparkSession, tmp_path: Path
) -> None:
    counted_then_plan_excluded(spark, tmp_path)
    lake = tmp_path / "killed"  # a copy: this process never opened its ClickHouse
    shutil.copytree(tmp_path / "lake", lake, symlinks=True)  # chdb links databases to their store
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]),
        "MEDALLION_LAKE_ROOT": str(lake),
        "MEDALLION_GOLD__WINDOW": "30s",
        "MEDALLION_GOLD__GRACE": "60s",
        "MEDALLION_GOLD__EXCLUDED_KEYS": '["plan"]',
    }
    command = [sys.executable, "-m", "pipelines.app.cli", "backfill", "gold", "--from", iso(FROM), "--to", iso(TO)]
    partials = lake / GOLD_PARTIALS.layer / GOLD_PARTIALS.name
    before = commits(partials)
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # a hang guard: the JVM starting, then the recount
        while commits(partials) == before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # Any moment from its first commit on: between its commits, in one, or in the export.
        time.sleep(random.uniform(0, 2.0))
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate(timeout=60)[0]
    assert commits(partials) > before, out.decode(errors="replace")[-3000:]
    again = make_ctx(spark, lake, excluded_keys=["plan"])  # the same command, run again
    backfill_gold(again, FROM, TO)
    want = expected(STREAM, {"plan"})
    assert gold_state(again) == want and nonzero(clickhouse_state(again)[0]) == want
    frames = gold_frames(again.store, again.settings)
    assert frames is not None
    figures = frames[1].first()
    assert figures["gold_count_sum"] == figures["partial_count_sum"] == sum(want.values())
