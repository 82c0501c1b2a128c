"""Gold per bucket as the bundle's ``for_each`` runs it: four tasks at once, each over its own bucket.

Each task runs stage 1 then stage 2 for one bucket, on its own Spark session (a task's app
transaction travels in session confs on the delta-spark engine, as it would in its own process). The
four MERGEs are held until all four have started, so they read the same table version and commit on
top of each other. Partition-scoped conflict detection must then let every one commit on its first
attempt; gold must equal counts made by hand from the events. On delta-rs, where an empty gold's
statistics let stage 2 append, the four appends are held the same way and must land side by side.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from pipelines.config.settings import Settings
from pipelines.runtime import ingest, passes
from pipelines.runtime.eventlog import EXPECTATION_RESULTS, PIPELINE_EVENTS, RunRecord
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES
from pipelines.storage import TableSpec, open_store
from pipelines.storage.deltars import DeltaRsStore

pytestmark = pytest.mark.integration

BUCKETS = 4
TEAMS = range(1, 13)
EVENTS_PER_TEAM = 20
T0 = datetime(2024, 6, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=30)
PLANS = ("free", "pro", "team")


def team_events(team: int) -> list[dict[str, Any]]:
    return [
        {
            "uuid": f"00000000-0000-4000-8000-{team:04d}{i:08d}",
            "event": "$pageview",
            "team_id": team,
            "distinct_id": f"u{i % 4}",
            "timestamp": (T0 + timedelta(seconds=7 * i)).isoformat().replace("+00:00", "Z"),
            "properties": {"plan": PLANS[(team + i) % 3], "n": i % 2},
        }
        for i in range(EVENTS_PER_TEAM)
    ]


def expected_gold() -> Counter[tuple[Any, ...]]:
    """(team, bucket, type, key, value, window start) -> count, from the events by hand: each event
    counts its two properties in the 30 s window of its timestamp, in its team's pinned bucket."""
    counts: Counter[tuple[Any, ...]] = Counter()
    for team in TEAMS:
        for i in range(EVENTS_PER_TEAM):
            start = T0 + WINDOW * ((7 * i) // 30)
            counts[(team, team % BUCKETS, "event", "plan", PLANS[(team + i) % 3], start)] += 1
            counts[(team, team % BUCKETS, "event", "n", str(i % 2), start)] += 1
    return counts


def as_utc(t: datetime) -> datetime:
    """A timestamp as Spark returns it (naive, in the session's UTC zone) made aware."""
    return t.replace(tzinfo=UTC)


def gold_rows(ctx: Context) -> Counter[tuple[Any, ...]]:
    rows = ctx.store.read(GOLD_PROPERTY_VALUES).collect()  # a few hundred rows
    return Counter(
        {
            (r.team_id, r.bucket, r.property_type, r.property_key, r.property_value, as_utc(r.window_start)): r["count"]
            for r in rows
        }
    )


def hold_first_merge(ctx: Context, spec: TableSpec, barrier: threading.Barrier, name: str | None = None) -> None:
    """Make the task's first MERGE into ``spec`` wait for every task's where its engine reads the
    target's version, so all of them read the same one: delta-rs loads the table once Spark has
    staged the source (``DeltaRsStore._merge``), Delta on Spark as its MERGE command starts. A retry
    after a conflict does not wait again (and shows up as a retry). ``name``: another write."""
    name = name or ("_merge" if isinstance(ctx.store, DeltaRsStore) else "merge")
    real = getattr(ctx.store, name)
    held = threading.Event()

    def merge(target: TableSpec, *args: Any, **kwargs: Any) -> int:
        if target == spec and not held.is_set():
            held.set()
            barrier.wait(timeout=300)
        return int(real(target, *args, **kwargs))

    setattr(ctx.store, name, merge)


@pytest.fixture
def lake(spark: SparkSession, engine: str, engine_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    """A lake whose silver events span all four buckets (team t pinned to bucket t mod 4)."""
    mapping = tmp_path / "buckets.yaml"
    mapping.write_text(yaml.safe_dump({"count": BUCKETS, "teams": {t: t % BUCKETS for t in TEAMS}}))
    settings = engine_settings(
        tmp_path / "lake",
        buckets={"count": BUCKETS, "mapping_file": str(mapping)},
        gold={"window": "30s", "grace": "60s"},
    )
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)
    files = []
    for team in TEAMS:
        path = tmp_path / f"team-{team}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in team_events(team)))
        files.append(path)
    ingest.ingest_files(ctx, "events", files)
    assert passes.silver_events(ctx).rows_out == len(TEAMS) * EVENTS_PER_TEAM
    return settings


@pytest.mark.parametrize("write", ["MERGE", "WRITE"])
def test_four_bucket_tasks_at_once_all_commit_first_time_and_gold_equals_the_hand_counts(
    spark: SparkSession, engine: str, lake: Settings, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MERGE``: gold's statistics unread, so each task MERGEs; ``WRITE``: gold is empty, so each
    task appends (delta-rs only: Delta on Spark always MERGEs, see ``TableStore.greatest``)."""
    if write == "MERGE":
        monkeypatch.setattr(DeltaRsStore, "greatest", lambda *_a, **_k: None)
    elif engine == "delta-spark":
        pytest.skip("Delta on Spark MERGEs a source gold cannot match too (no statistics read)")
    barrier = threading.Barrier(BUCKETS)
    contexts = []
    for _ in range(BUCKETS):
        # Each task its own session, as each for_each task is its own process on a cluster.
        session = spark.newSession() if engine == "delta-spark" else spark
        ctx = Context(settings=lake, spark=session, store=open_store(lake, session), say=lambda _: None)
        hold_first_merge(ctx, GOLD_PROPERTY_VALUES, barrier, None if write == "MERGE" else "append")
        contexts.append(ctx)
    results: dict[int, tuple[RunRecord, RunRecord]] = {}
    errors: list[BaseException] = []

    def task(bucket: int) -> None:
        try:
            ctx = contexts[bucket]
            results[bucket] = (passes.gold_partials(ctx, [bucket]), passes.gold_merge(ctx, [bucket]))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    planning = ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions", "spark.sql.codegen.wholeStage")
    before = [spark.conf.get(key) for key in planning]
    threads = [threading.Thread(target=task, args=(b,), name=f"bucket-{b}") for b in range(BUCKETS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not errors, errors
    # Each task's small increment set the planning confs on the session it shares (delta-rs): they
    # are the session's own again once all four are done, whatever order they ended in.
    assert [spark.conf.get(key) for key in planning] == before
    assert sorted(results) == list(range(BUCKETS))

    for bucket, (stage1, stage2) in results.items():
        assert (stage1.status, stage2.status) == ("ok", "ok"), (bucket, stage1.details, stage2.details)
        assert "conflict_retries" not in stage1.metrics and "conflict_retries" not in stage2.metrics, bucket
        assert stage1.metrics["input_events"] == 3 * EVENTS_PER_TEAM  # three teams per bucket

    ctx = contexts[0]
    merges = [c for c in ctx.store.history(GOLD_PROPERTY_VALUES) if str(c.get("operation", "")).upper() == write]
    assert len(merges) == BUCKETS
    if write == "MERGE":  # the four MERGEs overlapped: each read the version before the first commit
        assert len({int(c["readVersion"]) for c in merges}) == 1, merges

    assert gold_rows(ctx) == expected_gold()
    # Stage 1 wrote each bucket's partials into its own partition, once.
    parts = ctx.store.read(GOLD_PARTIALS).groupBy("bucket").count().collect()
    assert {r["bucket"] for r in parts} == set(range(BUCKETS))

    # Each task has its own event-log rows and quality results, named by its bucket.
    tasks = {f"gold.{stage}#buckets={b}" for stage in ("partials", "merge") for b in range(BUCKETS)}
    events = ctx.store.read(PIPELINE_EVENTS).where("job LIKE 'gold.%'").collect()
    assert sorted(r.job for r in events) == sorted(tasks)
    assert {r.status for r in events} == {"ok"}
    checked = {r.job for r in ctx.store.read(EXPECTATION_RESULTS).where("job LIKE 'gold.%'").collect()}
    assert checked == tasks
