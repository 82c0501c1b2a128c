"""``import medallion``: the notebook API does what the command line does, on a real lake."""

from __future__ import annotations

import json
from pathlib import Path

import medallion
from pyspark.sql import SparkSession

from pipelines.demo import data as fixtures
from tests.helpers import once_per_identity


def test_a_notebook_lands_runs_reads_validates_and_shows_status(tmp_path: Path, spark: SparkSession) -> None:
    events = fixtures.write_posthog_events(tmp_path / "in" / "events.jsonl")
    # Independent of the pipeline: the fixture's events by (team, uuid), read with json.
    lines = [json.loads(line) for line in events.read_text().splitlines()]

    lake = medallion.open(lake_root=str(tmp_path / "lake"), spark=spark)
    landed = lake.ingest("events", [str(events)])
    records = lake.run("silver")

    assert landed.rows_out == len(lines)
    assert [r.job for r in records] == ["silver.events", "silver.page_changes"]
    rows = lake.table("silver/events").select("team_id", "uuid").collect()
    assert sorted((r["team_id"], r["uuid"]) for r in rows) == sorted(
        (e["team_id"], e["uuid"]) for e in once_per_identity(lines)
    )
    results = lake.validate(["silver/events"])
    assert results and {r["outcome"] for r in results} == {"passed"}
    status = {s["key"]: s for s in lake.status()}
    assert status["silver/events"]["rows"] == len(once_per_identity(lines))
    assert status["gold/property_values"]["version"] is None
