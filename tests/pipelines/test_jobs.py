"""Incremental, exactly-once jobs: what a crash before or after a commit leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines import jobs
from pipelines.eventlog import PIPELINE_EVENTS
from pipelines.runner import Context
from pipelines.settings import Settings
from pipelines.storage import TableSpec
from pipelines.storage.deltars import DeltaRsStore
from pipelines.tables import BRONZE_EVENTS, SILVER_EVENTS


@pytest.fixture
def ctx(spark: SparkSession, settings: Settings) -> Context:
    return Context(settings=settings, spark=spark, store=DeltaRsStore(spark, settings.lake_root))


def write_events(path: Path, team: int, n: int, start: int = 0) -> Path:
    lines = [
        json.dumps(
            {
                "uuid": f"00000000-0000-4000-8000-{team:04d}{i:08d}",
                "event": "$pageview",
                "team_id": team,
                "distinct_id": f"u{i % 3}",
                "timestamp": f"2024-06-01T00:00:{i % 60:02d}Z",
                "properties": {"$browser": ["Firefox", "Chrome"][i % 2], "n": i % 2},
            }
        )
        for i in range(start, start + n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def rows(store: DeltaRsStore, spec: TableSpec) -> int:
    return DeltaTable(store.path(spec)).to_pyarrow_table().num_rows


def test_jobs_read_only_commits_they_have_not_processed(ctx: Context, tmp_path: Path) -> None:
    jobs.ingest_files(ctx, "events", [write_events(tmp_path / "a.jsonl", 1, 10)])
    assert jobs.silver_events(ctx).rows_out == 10
    jobs.ingest_files(ctx, "events", [write_events(tmp_path / "b.jsonl", 2, 5)])
    assert jobs.silver_events(ctx).rows_out == 5
    again = jobs.silver_events(ctx)
    assert (again.status, again.rows_out) == ("noop", 0)
    silver = ctx.store.read(SILVER_EVENTS)
    assert silver.count() == 15 and silver.select("uuid").distinct().count() == 15


def test_a_file_is_landed_once_per_content(ctx: Context, tmp_path: Path) -> None:
    a = write_events(tmp_path / "a.jsonl", 1, 10)
    copy = tmp_path / "copy-of-a.jsonl"
    copy.write_bytes(a.read_bytes())
    first = jobs.ingest_files(ctx, "events", [a, copy])
    second = jobs.ingest_files(ctx, "events", [a])
    assert (first.rows_out, second.status) == (10, "noop")
    assert rows(ctx.store, BRONZE_EVENTS) == 10


class Crash(Exception):
    pass


def test_crash_before_the_commit_reprocesses_and_after_it_skips(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs.ingest_files(ctx, "events", [write_events(tmp_path / "a.jsonl", 1, 10)])
    real_append = DeltaRsStore.append

    def crash_before(self: DeltaRsStore, spec: TableSpec, *args: object, **kw: object) -> int:
        if spec == SILVER_EVENTS:
            raise Crash("killed before commit")
        return real_append(self, spec, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(DeltaRsStore, "append", crash_before)
    with pytest.raises(Crash):
        jobs.silver_events(ctx)
    assert ctx.store.version(SILVER_EVENTS) == 0  # created, nothing committed

    def crash_after(self: DeltaRsStore, spec: TableSpec, *args: object, **kw: object) -> int:
        version = real_append(self, spec, *args, **kw)  # type: ignore[arg-type]
        if spec == SILVER_EVENTS:
            raise Crash("killed after commit")
        return version

    monkeypatch.setattr(DeltaRsStore, "append", crash_after)
    with pytest.raises(Crash):
        jobs.silver_events(ctx)
    monkeypatch.setattr(DeltaRsStore, "append", real_append)
    assert jobs.silver_events(ctx).status == "noop"
    assert rows(ctx.store, SILVER_EVENTS) == 10

    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'silver.events'").orderBy("started_at").collect()
    assert [r["status"] for r in log] == ["failed", "failed", "noop"]
    assert "killed before commit" in log[0]["error"]


def test_buckets_run_as_separate_tasks_and_together_cover_every_event(ctx: Context, tmp_path: Path) -> None:
    for team in range(1, 13):
        jobs.ingest_files(ctx, "events", [write_events(tmp_path / f"t{team}.jsonl", team, 5)])
    low = jobs.silver_events(ctx, [0, 1, 2, 3])
    high = jobs.silver_events(ctx, [4, 5, 6, 7])
    silver = ctx.store.read(SILVER_EVENTS)
    assert silver.count() == 60 and silver.select("uuid").distinct().count() == 60
    low_buckets = {int(k.split(".")[1]) for k in low.metrics if k.startswith("bucket.") and k.endswith(".events")}
    high_buckets = {int(k.split(".")[1]) for k in high.metrics if k.startswith("bucket.") and k.endswith(".events")}
    assert low_buckets and low_buckets <= {0, 1, 2, 3} and high_buckets and high_buckets <= {4, 5, 6, 7}
    assert any(k.endswith(".lag_seconds") for k in low.metrics)
    assert jobs.silver_events(ctx, [0, 1, 2, 3]).status == "noop"
