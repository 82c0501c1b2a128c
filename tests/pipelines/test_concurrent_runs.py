"""A flow run in two processes at once (a `run all` beside a backfill's catch-up, or beside
another `run all`) counts nothing twice: each run commits through the target version it read its
progress at, so the one that commits second fails and retries, and finds its work done.

The other process is another store on the same lake, whose run lands in the middle of this one's
write; gold is compared with counts made here from the events. Each test starts Spark jobs on the
session's Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipelines.runtime import ingest, passes
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES
from pipelines.storage import open_store
from tests.pipelines.test_backfill import STREAM, expected
from tests.pipelines.test_export import gold_state, make_ctx, write

pytestmark = pytest.mark.integration


def other_process(ctx: Context) -> Context:
    """The same lake and settings through a store of its own, as another process opens it."""
    return Context(settings=ctx.settings, spark=ctx.spark, store=open_store(ctx.settings, ctx.spark), say=ctx.say)


# An append and a MERGE on delta-rs; on delta-spark both check the same way before the write.
@pytest.mark.parametrize(
    ("engine", "stage"), [("delta-rs", "gold.partials"), ("delta-rs", "gold.merge"), ("delta-spark", "gold.merge")]
)
def test_a_stage_another_process_ran_meanwhile_commits_nothing_twice(
    spark: SparkSession,
    tmp_path: Path,
    engine: str,
    stage: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if engine == "delta-spark":
        request.getfixturevalue("delta_spark")  # the Delta jars, or a skip that says how to add them
    ctx = make_ctx(spark, tmp_path / "lake", engine)
    ingest.ingest_files(ctx, "events", [write(tmp_path / "a.jsonl", STREAM)])
    passes.silver_events(ctx)
    if stage == "gold.merge":
        passes.gold_partials(ctx)
    target = GOLD_PARTIALS if stage == "gold.partials" else GOLD_PROPERTY_VALUES
    run = passes.gold_partials if stage == "gold.partials" else passes.gold_merge
    other = other_process(ctx)
    store_type = type(ctx.store)
    raced: list[str] = []

    def racing(name: str) -> Any:
        original = getattr(store_type, name)

        def write(self: Any, spec: Any, *args: Any, **kwargs: Any) -> Any:
            if self is ctx.store and spec == target and not raced:
                raced.append(name)
                run(other)  # the other process runs the same stage to the end, first
            return original(self, spec, *args, **kwargs)

        return write

    for name in ("append", "merge"):
        monkeypatch.setattr(store_type, name, racing(name))
    run(ctx)
    monkeypatch.undo()
    assert raced
    passes.gold_merge(ctx)
    assert gold_state(ctx) == expected(STREAM, set())
    partials = ctx.store.read(GOLD_PARTIALS).groupBy().sum("count").first()[0]
    assert partials == sum(expected(STREAM, set()).values())
    # The other process's run counted the batch; this one met its commit, retried and found
    # nothing left to do.
    runs = ctx.store.read(PIPELINE_EVENTS).where(f"job = '{stage}'").collect()
    assert sorted((r["status"], int(r["metrics"].get("conflict_retries", 0))) for r in runs) == [
        *([("noop", 0)] if stage == "gold.merge" else []),  # the test's own catch-up pass
        ("noop", 1),
        ("ok", 0),
    ]
