"""gold.teams: which teams gold counts, applied in stage 1 and stage 2, never counting twice."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from gold.property_values import TeamFilter
from pipelines.config.settings import load_settings
from pipelines.runtime import ingest, passes
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_PROPERTY_VALUES
from pipelines.storage import open_store
from tests.pipelines.test_jobs import write_events


def admitted(spark: SparkSession, teams: TeamFilter, ids: range) -> set[int]:
    df = spark.range(ids.start, ids.stop).withColumnRenamed("id", "team_id")
    return {r[0] for r in df.where(teams.admits(F.col("team_id"))).collect()}


def test_allow_block_and_a_stable_rollout(spark: SparkSession) -> None:
    teams = range(1, 2001)
    assert admitted(spark, TeamFilter(allow=(3, 4, 5), block=(4,)), teams) == {3, 5}
    assert admitted(spark, TeamFilter(block=(1, 2)), range(1, 6)) == {3, 4, 5}
    assert admitted(spark, TeamFilter(rollout_percent=0), teams) == set()
    assert admitted(spark, TeamFilter(rollout_percent=100), teams) == set(teams)
    thirty, sixty = (admitted(spark, TeamFilter(rollout_percent=p), teams) for p in (30, 60))
    assert thirty < sixty  # raising the percent only adds teams
    assert 500 < len(thirty) < 700 and 1_100 < len(sixty) < 1_300, (len(thirty), len(sixty))
    assert admitted(spark, TeamFilter(rollout_percent=30), teams) == thirty  # the same every time
    assert admitted(spark, TeamFilter(allow=tuple(teams), block=(7,), rollout_percent=30), teams) == thirty - {7}


def gold_counts(ctx: Context) -> dict[int, int]:
    rows = DeltaTable(ctx.store.path(GOLD_PROPERTY_VALUES)).to_pyarrow_table(columns=["team_id", "count"]).to_pylist()
    out: dict[int, int] = {}
    for r in rows:
        out[r["team_id"]] = out.get(r["team_id"], 0) + r["count"]
    return out


def test_filtered_teams_are_counted_in_the_event_log_and_resume_from_what_they_had(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = load_settings(lake_root=str(tmp_path / "lake"))
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark))

    def land(name: str, team: int, n: int, start: int = 0) -> None:
        ingest.ingest_files(ctx, "events", [write_events(tmp_path / name, team, n, start)])
        passes.silver_events(ctx)

    # Each event has two properties: two event tuples.
    land("a1.jsonl", 1, 10)
    land("a2.jsonl", 2, 6)
    settings.gold.teams.block = [2]
    first = passes.gold_partials(ctx)
    assert first.metrics["filtered_teams.events"] == 6
    passes.gold_merge(ctx)
    assert gold_counts(ctx) == {1: 20}

    # Team 2 comes back: it is counted from its new events on, not from the ones filtered out.
    settings.gold.teams.block = []
    land("b2.jsonl", 2, 4, start=6)
    passes.gold_partials(ctx)
    passes.gold_merge(ctx)
    assert gold_counts(ctx) == {1: 20, 2: 8}

    # Stage 2 filters too: partials counted while team 1 was in are not merged while it is out,
    # and not later either.
    land("c1.jsonl", 1, 5, start=10)
    passes.gold_partials(ctx)
    settings.gold.teams.allow = [2]
    merged = passes.gold_merge(ctx)
    assert merged.metrics["filtered_teams.partial_rows"] > 0
    assert gold_counts(ctx) == {1: 20, 2: 8}
    settings.gold.teams.allow = []
    assert passes.gold_merge(ctx).status == "noop"
    assert gold_counts(ctx) == {1: 20, 2: 8}

    # A batch that is all filtered out still moves both stages on.
    settings.gold.teams.block = [2]
    land("d2.jsonl", 2, 3, start=10)
    assert passes.gold_partials(ctx).metrics["filtered_teams.events"] == 3
    passes.gold_merge(ctx)
    settings.gold.teams.block = []
    assert (passes.gold_partials(ctx).status, passes.gold_merge(ctx).status) == ("noop", "noop")
    assert gold_counts(ctx) == {1: 20, 2: 8}
