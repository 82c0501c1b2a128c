"""``medallion backfill silver``: the deduplication horizon changed, a range's silver events made
again from bronze, carried on to gold and ClickHouse once; checked against counts made here from
the events landed (an independent model: every copy outside the range, one inside), across a kill
between silver's commit and gold's and the runs that come after.

Each test starts Spark jobs on the session's Spark and the embedded ClickHouse (chdb)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from gold.backfill import iso
from pipelines.app.cli import cli
from pipelines.config.settings import load_settings
from pipelines.errors import InputError
from pipelines.flows.checks import gold_frames
from pipelines.runtime import backfill_silver as module
from pipelines.runtime.backfill_silver import backfill_silver
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import SILVER_EVENTS
from pipelines.storage import open_store
from tests.pipelines.test_backfill import FROM, MIDNIGHT, STREAM, TO, status_backfill_row
from tests.pipelines.test_export import clickhouse_state, event, gold_state, nonzero, pipeline, write

pytestmark = pytest.mark.integration

#: Sent twice: events 0-4 (the window at 0 s, outside the range) and 20-39 (the windows at 60 and
#: 90 s, the range), as a sender that retried a batch would.
RESENT = [e for e in STREAM if int(e["uuid"][-8:]) in (*range(5), *range(20, 40))]


def make_ctx(spark: SparkSession, lake: Path, horizon: str, engine: str = "delta-rs") -> Context:
    settings = load_settings(
        lake_root=str(lake),
        delta_engine=engine,
        gold={"window": "30s", "grace": "60s"},
        silver={"dedup_horizon": horizon},
    )
    return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)


def in_range(e: dict[str, Any]) -> bool:
    minute, second = (int(p) for p in e["timestamp"][14:19].split(":"))
    return FROM <= MIDNIGHT.replace(minute=minute, second=second) < TO


def expected(landed: list[dict[str, Any]], late: list[dict[str, Any]] = ()) -> dict:
    """Gold as the rules say, counted here from the copies ``landed`` under no horizon (every copy
    counted, but an event of the range once: it was backfilled under an hour's), then from those
    ``late`` under an hour's horizon (an event already seen is not counted again)."""
    counts: Counter[tuple] = Counter()
    seen: set[str] = set()
    start = int(MIDNIGHT.timestamp())
    for e, deduplicated in [*((e, in_range(e)) for e in landed), *((e, True) for e in late)]:
        if deduplicated and e["uuid"] in seen:
            continue
        seen.add(e["uuid"])
        minute, second = (int(p) for p in e["timestamp"][14:19].split(":"))
        window = start + (minute * 60 + second) // 30 * 30
        for key, value in e["properties"].items():
            counts[(e["team_id"], "event", key, value, window)] += 1
    return dict(counts)


def counted_with_every_copy_then_horizon_set(spark: SparkSession, tmp_path: Path, engine: str = "delta-rs") -> Context:
    """A lake that counted and exported STREAM and RESENT with deduplication off, under the
    settings after it was turned on (a horizon of an hour)."""
    before = make_ctx(spark, tmp_path / "lake", "0s", engine)
    pipeline(before, [write(tmp_path / "a.jsonl", STREAM), write(tmp_path / "again.jsonl", RESENT)])
    assert sum(gold_state(before).values()) == 2 * (len(STREAM) + len(RESENT))  # every copy, two properties each
    return make_ctx(spark, tmp_path / "lake", "1h", engine)


def silver_uuids(ctx: Context) -> Counter[str]:
    return Counter(r["uuid"] for r in ctx.store.read(SILVER_EVENTS).select("uuid").collect())


def test_a_horizon_set_then_backfilled_keeps_every_copy_outside_the_range_and_one_inside(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On delta-rs (the storage contract, on both engines, holds what this relies on: a replace,
    its guard, and that a read of what arrived leaves a replace's rows out). Killed between silver
    and gold, a `run all` meanwhile, then the command again; its refusals last."""
    now = counted_with_every_copy_then_horizon_set(spark, tmp_path)
    landed = [*STREAM, *RESENT]
    before = gold_state(now)

    def killed(*_: Any) -> None:
        raise SystemExit("killed")  # not an error a retry takes: the process is gone

    monkeypatch.setattr(module, "backfill_gold", killed)
    with pytest.raises(SystemExit):
        backfill_silver(now, FROM, TO)
    monkeypatch.undo()
    # Silver: the range's events once each, the copies outside it (events 0-4) as they were.
    once_in_range = Counter({e["uuid"]: 2 if int(e["uuid"][-8:]) < 5 else 1 for e in STREAM})
    assert silver_uuids(now) == once_in_range
    # A `run all` in between: stage 1 leaves the replace's rows alone (they did not arrive), so
    # gold keeps the counts it had, and so does ClickHouse.
    pipeline(now, [])
    assert gold_state(now) == before == nonzero(clickhouse_state(now)[0])
    # The same command again: silver is as the first made it, gold and ClickHouse follow.
    monkeypatch.setattr("pipelines.app.cli.State.context", lambda self, validates=False: now)
    result = CliRunner().invoke(cli, ["backfill", "silver", "--from", iso(FROM), "--to", "2024-06-01T00:02"])
    assert result.exit_code == 0, result.output
    assert "backfill.silver: 2 windows made again: 0 events removed, 0 added, 20 as they were" in result.output
    assert "backfill.gold: 2 windows recounted: 6 tuples changed, 0 removed, 0 added, 0 as they were" in result.output
    want = expected(landed)
    assert silver_uuids(now) == once_in_range
    assert gold_state(now) == want == nonzero(clickhouse_state(now)[0])
    # The event log: the first run's figures and the rule it changed; the second's, none.
    log = now.store.read(PIPELINE_EVENTS).where("job = 'backfill.silver'").orderBy("started_at").collect()
    figures = [
        tuple(
            int(r["metrics"][k])
            for k in ("windows", "bronze_events", "events_removed", "events_added", "events_unchanged")
        )
        for r in log
    ]
    assert figures == [(2, 40, 20, 0, 20), (2, 40, 0, 0, 20)]
    assert [json.loads(r["details"])["changed"] for r in log] == [{"dedup_horizon": ["0:00:00", "1:00:00"]}, {}]
    assert status_backfill_row("backfill.silver", "1:00:00")[1:] == [
        "backfill.silver",
        "ok",
        "[2024-06-01T00:01:00Z, 2024-06-01T00:02:00Z)",
        "dedup_horizon: 0:00:00 -> 1:00:00",
        "",
        "20",
        "0",
        "20",
    ]
    # Gold still sums its partials, and stage 1 fanned out silver as it now is.
    frames = gold_frames(now.store, now.settings)
    assert frames is not None
    sums = frames[1].first()
    assert sums["gold_count_sum"] == sums["partial_count_sum"] == sums["fanout_tuples"] == sum(want.values())
    # Runs after it make and count as always, under the horizon in force: a copy of event 25 (in
    # the range) is dropped, a new event in the range counted, and so is a copy of event 2 (its
    # first copies were made under no horizon: silver holds it, so this one is a repeat too).
    late = [STREAM[25], STREAM[2], event(900, second=65)]
    pipeline(now, [write(tmp_path / "late.jsonl", late)])
    want = expected(landed, late)
    assert gold_state(now) == want == nonzero(clickhouse_state(now)[0])
    # A range before what bronze holds is refused before any write; one with no window does nothing.
    version = now.store.version(SILVER_EVENTS)
    with pytest.raises(InputError, match="the earliest start it can do is 2024-06-01T00:00:00Z"):
        backfill_silver(now, MIDNIGHT - (TO - FROM), TO)
    assert now.store.version(SILVER_EVENTS) == version
    (nothing,) = backfill_silver(now, FROM.replace(second=10), FROM.replace(second=20))
    assert nothing.status == "noop" and "no window starts in" in (nothing.details or "")
