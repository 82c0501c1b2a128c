"""``medallion backfill silver`` for page changes: a page-change window narrowed (5 to 4 minutes) and a
change that landed after its window had closed, a range's windows made again from bronze, page by
page between edges no window crosses; checked against rows worked out by hand below, across a run
of the flow in another process that lands inside the backfill, a crash before its commit, the same
command again, and the runs that come after.

Each test starts Spark jobs on the session's Spark (no ClickHouse: nothing reads page changes)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from pipelines.app.cli import cli
from pipelines.config.settings import load_settings
from pipelines.errors import InputError
from pipelines.runtime import backfill_page_changes as module
from pipelines.runtime import passes
from pipelines.runtime.backfill_page_changes import backfill_page_changes
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_PAGE_CHANGES, SILVER_PAGE_CHANGES
from pipelines.storage import open_store
from tests.pipelines.test_backfill import status_backfill_row

pytestmark = pytest.mark.integration

T0 = datetime(2024, 1, 1, tzinfo=UTC)
#: The range: gold's (1-minute) windows that start in [00:10, 00:20), 600 s to 1,200 s.
FROM, TO = T0 + timedelta(seconds=600), T0 + timedelta(seconds=1200)

Change = tuple[int, int, int, str]  # page, rev, second, kind
#: Landed in time (the watermark trails the newest change by a minute). Page 1 has a window that
#: opens before the range and reaches into it (500 s), one inside it (900 s), and one after it
#: (1,250 s); page 2's window opens in the range and reaches past it (1,100-1,400 s); page 3 has
#: none in it; page 4 is created and deleted inside it.
ON_TIME: list[Change] = [
    (1, 10, 500, "edit"),
    (1, 20, 700, "edit"),
    (1, 30, 900, "edit"),
    (1, 40, 1000, "edit"),
    (1, 50, 1150, "edit"),
    (1, 60, 1250, "edit"),
    (1, 70, 1700, "edit"),
    (2, 1, 1100, "create"),
    (2, 2, 1280, "edit"),
    (3, 1, 100, "create"),
    (3, 2, 1400, "edit"),
    (4, 1, 650, "create"),
    (4, 2, 660, "delete"),
]
#: Landed after the watermark passed it: page 1's revision 25 (850 s), dropped as stale; and a change
#: that keeps page 1's window at 2,200 s open.
LATE: list[Change] = [(1, 25, 850, "edit"), (1, 80, 2200, "edit")]

Row = tuple[int, int, int, str, int, int, int]  # page, rev, second, action, window start, end, merged


def silver_before() -> set[Row]:
    """Silver under 5-minute staggered windows, worked out by hand: page 1's windows at 500 s (revs
    10, 20), 900 s (30-50), 1,250 s and 1,700 s; revision 25 opened its own window at 850 s when it
    landed and was stale there (page 1 had emitted revision 60); page 1's window at 2,200 s is open."""
    return {
        (1, 20, 700, "update", 500, 800, 2),
        (1, 50, 1150, "update", 900, 1200, 3),
        (1, 60, 1250, "update", 1250, 1550, 1),
        (1, 70, 1700, "update", 1700, 2000, 1),
        (2, 2, 1280, "update", 1100, 1400, 2),
        (3, 1, 100, "update", 100, 400, 1),
        (3, 2, 1400, "update", 1400, 1700, 1),
        (4, 2, 660, "delete", 650, 950, 2),
    }


#: Made again under 4-minute windows (by hand):
#: - page 1, between 800 s (the end of its window at 500 s, kept) and 1,200 s (its window at 1,250 s
#:   is kept; the one at 900 s reached to 1,200 s): revisions 25, 30 and 40 in a window at 850 s,
#:   revision 25 counted in (rule 0 starts from revision 20, what page 1 emitted before the range),
#:   then revision 50's window at 1,150 s, cut at the edge (1,200 s);
#: - page 2, between 600 s and 1,400 s (the end of its window at 1,100 s): one window of 4 minutes;
#: - page 4: one window of 4 minutes.
REMOVED: set[Row] = {
    (1, 50, 1150, "update", 900, 1200, 3),
    (2, 2, 1280, "update", 1100, 1400, 2),
    (4, 2, 660, "delete", 650, 950, 2),
}
ADDED: set[Row] = {
    (1, 40, 1000, "update", 850, 1090, 3),
    (1, 50, 1150, "update", 1150, 1200, 1),
    (2, 2, 1280, "update", 1100, 1340, 2),
    (4, 2, 660, "delete", 650, 890, 2),
}


def make_ctx(spark: SparkSession, lake: Path, window: str) -> Context:
    settings = load_settings(
        lake_root=str(lake),
        gold={"window": "60s"},
        page_changes={"window": window, "allowed_lateness": "60s", "mode": "staggered"},
    )
    return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)


def land(ctx: Context, changes: list[Change], offset: int) -> None:
    """Bronze page changes as the ingest lands them, in the order given."""
    ctx.store.ensure(BRONZE_PAGE_CHANGES)
    n = len(changes)
    ctx.store.append(
        BRONZE_PAGE_CHANGES,
        pa.table(
            {
                "wiki_id": ["enwiki"] * n,
                "page_id": pa.array([c[0] for c in changes], pa.int64()),
                "rev_id": pa.array([c[1] for c in changes], pa.int64()),
                "page_change_kind": [c[3] for c in changes],
                "event_time": pa.array([T0 + timedelta(seconds=c[2]) for c in changes], pa.timestamp("us", tz="UTC")),
                "meta_id": [f"m-{c[0]}-{c[1]}-{c[2]}" for c in changes],
                "raw": ["{}"] * n,
                "offset": pa.array(range(offset, offset + n), pa.int64()),
            }
        ),
    )


def silver(ctx: Context) -> set[Row]:
    def s(t: datetime) -> int:
        return int((t.replace(tzinfo=UTC) - T0).total_seconds())  # collected naive, in UTC

    rows = ctx.store.read(SILVER_PAGE_CHANGES).collect()
    got = {
        (
            r["page_id"],
            r["rev_id"],
            s(r["event_time"]),
            r["action"],
            s(r["window_start"]),
            s(r["window_end"]),
            r["merged_count"],
        )
        for r in rows
    }
    assert len(got) == len(rows), "a row twice"
    return got


def figures(ctx: Context) -> list[tuple[int, ...]]:
    log = ctx.store.read(PIPELINE_EVENTS).where(f"job = '{module.JOB}' AND status = 'ok'").orderBy("started_at")
    keys = ("bronze_page_changes", "page_changes_removed", "page_changes_added", "page_changes_unchanged")
    return [tuple(int(r["metrics"][k]) for k in keys) for r in log.collect()]


def test_a_narrower_window_and_a_late_change_made_again_page_by_page_between_edges_no_window_crosses(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On delta-rs (the storage contract, on both engines, holds what this relies on: a replace and
    its guard). A run of the flow lands inside the first attempt, whose replace then fails and
    starts over; a crash before the commit; the same command through the CLI; its refusal."""
    lake = tmp_path / "lake"
    before = make_ctx(spark, lake, "300s")
    land(before, ON_TIME, 0)
    passes.silver_page_changes(before)
    land(before, LATE, len(ON_TIME))
    passes.silver_page_changes(before)
    assert silver(before) == silver_before()

    now = make_ctx(spark, lake, "240s")
    # Another process's run of the flow publishes while the first attempt makes the rows: that
    # attempt's replace fails on its guard, and the backfill starts over from the catch-up.
    gate, raced = module.quality.gate, []

    def gate_beside_a_run(*args: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(True)
            land(before, [(5, 1, 2250, "create")], 100)  # page 5 opens a window the run keeps open
            passes.silver_page_changes(before)
        return gate(*args, **kwargs)

    monkeypatch.setattr(module.quality, "gate", gate_beside_a_run)
    record = backfill_page_changes(now, FROM, TO)
    monkeypatch.undo()
    assert record.status == "ok" and record.metrics["conflict_retries"] == 1
    after = (silver_before() - REMOVED) | ADDED
    assert silver(now) == after
    assert figures(now) == [(8, 3, 4, 1)]  # page 1: 850-1,150 s; page 2: 1,100, 1,280 s; page 4: both
    details = json.loads(record.details)
    assert details["changed"] == {"window": ["0:05:00", "0:04:00"]}
    assert (details["from"], details["to"]) == ("2024-01-01T00:10:00Z", "2024-01-01T00:20:00Z")

    # Killed before its commit: nothing changed; then the same command through the CLI makes the
    # same rows again (kept as they were), the status shows it.
    def killed(*_: Any, **__: Any) -> None:
        raise SystemExit("killed")

    monkeypatch.setattr(now.store, "replace", killed)
    with pytest.raises(SystemExit):
        backfill_page_changes(now, FROM, TO)
    monkeypatch.undo()
    assert silver(now) == after
    monkeypatch.setattr("pipelines.app.cli.State.context", lambda self, validates=False: now)
    args = [
        "backfill",
        "silver",
        "--only",
        "page_changes",
        "--from",
        "2024-01-01T00:10:00Z",
        "--to",
        "2024-01-01T00:20",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "backfill.page_changes: page windows made again: 0 page changes removed, 0 added, 5 as they were" in (
        result.output
    )
    assert silver(now) == after
    assert status_backfill_row("backfill.page_changes", "0:04:00")[4:] == [
        "window: 0:05:00 -> 0:04:00",
        "",
        "3",
        "4",
        "1",
    ]

    # Runs after it go on as always: page 1's open window closes, and a revision of page 1 that lands
    # late again is stale against revision 80.
    land(now, [(1, 35, 1000, "edit"), (1, 90, 2600, "edit")], 200)
    passes.silver_page_changes(now)
    assert silver(now) == after | {(1, 80, 2200, "update", 2200, 2440, 1), (5, 1, 2250, "update", 2250, 2490, 1)}

    # Windows still open (page 1's at 2,600 s) are the flow's: a range reaching them is refused
    # before any write, naming the latest end it can do.
    with pytest.raises(InputError, match=r"windows still open from 2024-01-01T00:43:00Z.*latest --to it can do is"):
        backfill_page_changes(now, FROM, T0 + timedelta(seconds=3000))
