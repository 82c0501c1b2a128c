"""The flow registry: adding a flow is one declaration, its transform and its tests.

The example flow here is declared in this file only. Beside the registry's own flows it is run by
``medallion run`` (through the notebook API), listed by stage, and changes nothing in the bundle
(its stage, gold, is a task already). Its transform sees a batch, a config and a record; the
runner does the increment, the commit with its progress and the event-log row.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import medallion
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipelines import flows
from pipelines.app import bundle
from pipelines.demo import data as fixtures
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.flow_types import Batch, Flow, FlowRecord
from pipelines.runtime.tables import SILVER_EVENTS
from pipelines.storage import TableSpec
from tests.helpers import once_per_identity

REPO = Path(__file__).resolve().parents[2]

# -- the new flow: its table, its transform, its declaration ---------------------------------------
EVENT_NAMES = TableSpec(
    "gold",
    "event_names",
    StructType([StructField("event", StringType()), StructField("events", LongType())]),
    description="events per name, one row per name per batch",
)


def event_names(batch: Batch, config: None, record: FlowRecord) -> DataFrame:
    out = record.cache(batch.rows.groupBy("event").agg(F.count(F.lit(1)).alias("events")))
    record.rows(batch.rows.count(), out.count())
    return out


EXAMPLE = Flow(
    "gold.event_names",
    "gold",
    (SILVER_EVENTS,),
    (EVENT_NAMES,),
    "append",
    "silver events -> events per name",
    transform=event_names,
    by_bucket=True,  # like the rest of gold: the bundle runs it once per bucket
)


# -- its tests ---------------------------------------------------------------------------------
@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Flow:
    monkeypatch.setattr(flows, "FLOWS", (*flows.FLOWS, EXAMPLE))
    return EXAMPLE


def test_a_declared_flow_is_known_to_run_and_to_its_stage_and_leaves_the_bundle_alone(registered: Flow) -> None:
    assert "gold.event_names" in flows.names()
    assert [f.name for f in flows.resolve("gold")] == ["gold.partials", "gold.merge", "gold.event_names"]
    assert flows.resolve("all")[-1] is registered
    assert bundle.render() == (REPO / "resources" / "medallion.job.yml").read_text()


def test_the_runner_runs_a_declared_flow_exactly_once(registered: Flow, tmp_path: Path, spark: SparkSession) -> None:
    events = fixtures.write_posthog_events(tmp_path / "in" / "events.jsonl")
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    want = Counter(e["event"] for e in once_per_identity(lines))

    lake = medallion.open(lake_root=str(tmp_path / "lake"), spark=spark)
    lake.ingest("events", [str(events)])
    lake.run("silver.events")
    (first,) = lake.run("gold.event_names")
    (again,) = lake.run("gold.event_names")

    got = {r["event"]: r["events"] for r in lake.context.store.read(EVENT_NAMES).collect()}
    assert got == dict(want)
    assert (first.status, first.rows_in, first.rows_out) == ("ok", sum(want.values()), len(want))
    assert again.status == "noop"
    logged = lake.context.store.read(PIPELINE_EVENTS).where("job = 'gold.event_names'").collect()
    assert sorted(r["status"] for r in logged) == ["noop", "ok"]


def test_a_flow_split_by_bucket_counts_each_row_in_its_buckets_task(
    registered: Flow, tmp_path: Path, spark: SparkSession
) -> None:
    events = fixtures.write_posthog_events(tmp_path / "in" / "events.jsonl")
    lake = medallion.open(lake_root=str(tmp_path / "lake"), spark=spark, buckets={"count": 2})
    lake.ingest("events", [str(events)])
    lake.run("silver.events")
    by_bucket = {
        b: Counter(r["event"] for r in lake.table("silver/events").where(f"bucket = {b}").collect()) for b in (0, 1)
    }
    for b in (0, 1):
        (record,) = lake.run("gold.event_names", buckets=[b])
        assert (record.job, record.rows_in) == (f"gold.event_names#buckets={b}", sum(by_bucket[b].values()))
    got = Counter()
    for r in lake.context.store.read(EVENT_NAMES).collect():
        got[r["event"]] += r["events"]
    assert got == by_bucket[0] + by_bucket[1]
