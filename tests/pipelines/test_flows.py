"""The flow registry: adding a flow is one declaration, its transform and its tests.

The example flows here, one of each write kind (append, merge, state, export), are declared in
this file only. Beside the registry's own flows it is run by
``medallion run`` (through the notebook API), listed by stage, and changes nothing in the bundle
(its stage, gold, is a task already). Its transform sees a batch, a config and a record; the
runner does the increment, the commit with its progress and the event-log row.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import medallion
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipelines import flows
from pipelines.app import bundle
from pipelines.demo import data as fixtures
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.flow_types import (
    Append,
    Batch,
    Export,
    ExportRun,
    Flow,
    FlowRecord,
    Merge,
    MergeRules,
    State,
    StateBatch,
    StateRules,
    StateStep,
)
from pipelines.runtime.tables import SILVER_EVENTS
from pipelines.storage import AppTxn, TableSpec
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
    Append(),
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
    got: Counter[str] = Counter()
    for r in lake.context.store.read(EVENT_NAMES).collect():
        got[r["event"]] += r["events"]
    assert got == by_bucket[0] + by_bucket[1]


# -- one flow of each other write kind: merge, state, export ---------------------------------------
def halves(tmp_path: Path) -> tuple[Path, Path, list[dict]]:
    """The shipped events as two files (first half, second half) and their lines, in order."""
    lines = fixtures.write_posthog_events(tmp_path / "all.jsonl").read_text().splitlines()
    first, second = tmp_path / "in" / "first.jsonl", tmp_path / "in" / "second.jsonl"
    first.parent.mkdir(parents=True, exist_ok=True)
    first.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    second.write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    return first, second, [json.loads(line) for line in lines]


EVENT_TOTALS = TableSpec(
    "gold",
    "event_totals",
    StructType([StructField("event", StringType()), StructField("events", LongType())]),
    description="events per name, one row per name, kept up to date",
)


def event_counts(batch: Batch, config: None, record: FlowRecord) -> DataFrame:
    return batch.rows.groupBy("event").agg(F.count(F.lit(1)).alias("events"))


MERGE_EXAMPLE = Flow(
    "gold.event_totals",
    "gold",
    (SILVER_EVENTS,),
    (EVENT_TOTALS,),
    Merge(
        MergeRules(
            on=lambda buckets: "t.event = s.event",
            update={"events": "t.events + s.events"},
            insert={"event": "s.event", "events": "s.events"},
        )
    ),
    "silver events -> events per name, merged into one row per name",
    transform=event_counts,
)

FIRST_SEEN = TableSpec("silver", "first_seen", StructType([StructField("event", StringType())]))
FIRST_SEEN_STATE = TableSpec(
    "silver",
    "first_seen_state",
    StructType(
        [StructField("kind", StringType()), StructField("event", StringType()), StructField("done", LongType())]
    ),
)


def first_seen(batch: StateBatch, config: None, record: FlowRecord) -> StateStep:
    """Names not seen before are emitted once (the outbox, ``kind = 'emit'``) and remembered."""
    seen = batch.state.where("kind = 'seen'")
    rows = batch.rows if batch.rows is not None else batch.state.where("false")
    new = rows.select("event").distinct().join(seen.select("event"), "event", "left_anti")
    done = batch.state.sparkSession.createDataFrame([("done", None, batch.end)], FIRST_SEEN_STATE.schema)
    state = (
        seen.unionByName(new.select(F.lit("seen").alias("kind"), "event", F.lit(None).cast("long").alias("done")))
        .unionByName(new.select(F.lit("emit").alias("kind"), "event", F.lit(None).cast("long").alias("done")))
        .unionByName(done)
    )
    return StateStep(state)


STATE_EXAMPLE = Flow(
    "silver.first_seen",
    "silver",
    (SILVER_EVENTS,),
    (FIRST_SEEN, FIRST_SEEN_STATE),
    State(
        StateRules(
            done=lambda state: max((r["done"] for r in state.where("kind = 'done'").collect()), default=None),
            buffered=lambda state: state.where("false"),
            outbox_kind="emit",
            outbox_columns=["event"],
            where="kind <> 'emit'",  # the last run's outbox is published already
        )
    ),
    "silver events -> each event name once, when first seen",
    transform=first_seen,
)

NAME_FILES = TableSpec(
    "gold",
    "event_name_files",
    StructType([StructField("version", LongType()), StructField("file", StringType())]),
    description="the files export.event_name_files wrote, one per silver/events version",
)
NAME_FILES_APP = "medallion/export.event_name_files"


def to_files(run: ExportRun, folder: Path, record: FlowRecord) -> None:
    """silver/events' counts per name as one JSON file per new version of it, exactly once: the
    file is written again whole on a redo, and the log's app transaction says it was sent."""
    version = run.tables.version(SILVER_EVENTS)
    sent = run.tables.txn_version(NAME_FILES, NAME_FILES_APP)
    if version is None or (sent is not None and sent >= version):
        record.noop("no new version of silver/events")
        return
    counts = run.tables.read(SILVER_EVENTS).groupBy("event").agg(F.count(F.lit(1)).alias("n"))
    path = folder / f"event_names-v{version}.json"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({r["event"]: r["n"] for r in counts.collect()}, sort_keys=True))  # a name each
    logged = pa.table({"version": [version], "file": [path.name]}, schema=NAME_FILES.arrow_schema)
    run.tables.append_once(NAME_FILES, logged, AppTxn(NAME_FILES_APP, version))
    record.rows(rows_out=1)


EXPORT_EXAMPLE = Flow(
    "export.event_name_files",
    "export",
    (SILVER_EVENTS,),
    (NAME_FILES,),
    Export("files"),
    "silver events -> a JSON file of counts per name, per version, exactly once",
    transform=to_files,
    config=lambda settings: Path(settings.lake_root).parent / "outside",
)


@dataclass
class TwoBatches:
    lake: medallion.Pipeline
    events: list[dict]  # what silver holds: the shipped events, once per identity
    outside: Path  # where the export example writes


@pytest.fixture(scope="module")
def two_batches(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[TwoBatches]:
    """A lake whose example flows ran after each half of the shipped events landed (built once
    for the module's tests, the examples registered while it lives)."""
    root = tmp_path_factory.mktemp("kinds")
    first, second, lines = halves(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flows, "FLOWS", (*flows.FLOWS, MERGE_EXAMPLE, STATE_EXAMPLE, EXPORT_EXAMPLE))
        lake = medallion.open(lake_root=str(root / "lake"), spark=spark)
        for part in (first, second):
            lake.ingest("events", [str(part)])
            lake.run("silver.events")
            for example in ("gold.event_totals", "silver.first_seen", "export.event_name_files"):
                (record,) = lake.run(example)
                assert record.status == "ok", (example, record.details)
        yield TwoBatches(lake, once_per_identity(lines), root / "outside")


def test_a_merge_flow_keeps_one_row_per_key_across_batches(two_batches: TwoBatches) -> None:
    lake, events = two_batches.lake, two_batches.events
    got = {r["event"]: r["events"] for r in lake.context.store.read(EVENT_TOTALS).collect()}
    assert got == dict(Counter(e["event"] for e in events))


def test_a_state_flow_publishes_each_name_once(two_batches: TwoBatches) -> None:
    lake, events = two_batches.lake, two_batches.events
    got = [r["event"] for r in lake.context.store.read(FIRST_SEEN).collect()]
    assert sorted(got) == sorted({e["event"] for e in events})
    (again,) = lake.run("silver.first_seen")
    assert again.status == "noop"


def test_an_export_flow_sends_each_version_once(two_batches: TwoBatches) -> None:
    lake, events = two_batches.lake, two_batches.events
    sent = sorted(two_batches.outside.glob("*.json"), key=lambda p: int(p.stem.rpartition("-v")[2]))
    assert len(sent) == 2  # one per silver/events version the two passes made
    assert json.loads(sent[-1].read_text()) == dict(Counter(e["event"] for e in events))
    (again,) = lake.run("export.event_name_files")
    assert again.status == "noop"
    assert len(lake.context.store.read(NAME_FILES).collect()) == 2


def test_the_flow_kinds_show_in_the_registry(two_batches: TwoBatches) -> None:
    assert {f.name: f.mode for f in flows.FLOWS[-3:]} == {
        "gold.event_totals": "merge",
        "silver.first_seen": "state",
        "export.event_name_files": "export",
    }


# -- mypy checks that a flow's config builder fits its code ----------------------------------------
FLOW_MODULE = """
from pyspark.sql import DataFrame

from pipelines.config.settings import Settings
from pipelines.runtime.flow_types import Append, Batch, Flow, FlowRecord


def transform(batch: Batch, config: {takes}, record: FlowRecord) -> DataFrame:
    return batch.rows


def config(settings: Settings) -> str:
    return settings.lake_root


FLOW = Flow("gold.example", "gold", (), (), Append(), "an example", transform=transform, config=config)
"""


def test_mypy_rejects_a_config_builder_that_does_not_fit_its_transform(tmp_path: Path) -> None:
    """Runs mypy (no JVM) on two flows: one whose config builder returns what its transform
    takes, one whose builder returns a ``str`` to a transform taking an ``int``."""
    from mypy import api

    (tmp_path / "fits.py").write_text(FLOW_MODULE.format(takes="str"))
    (tmp_path / "misfit.py").write_text(FLOW_MODULE.format(takes="int"))
    out, err, status = api.run(
        [str(tmp_path / "fits.py"), str(tmp_path / "misfit.py"), "--cache-dir", str(REPO / ".mypy_cache")]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out + err
    assert [Path(line.split(":")[0]).name for line in errors] == ["misfit.py"], out
    assert 'type parameter "C" of "Flow"' in errors[0], out
