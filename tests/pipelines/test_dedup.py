"""Exactly once by event identity: an event that reaches the pipeline twice is counted once in
silver, gold and ClickHouse.

The engine changes how silver is read for the repeats a batch may hold (the ids a small batch
looks up, the files the horizon keeps, the read before a crash): the tests of those reads run on
both engines. The others hold rules that no storage call decides, on delta-rs alone
(``ONE_ENGINE``: a delta-spark run of each cost 20-65 s of the suite). Their paths' storage runs
on delta-spark elsewhere: Kafka's landing in test_kafka_ingest, the page changes' state and
windows in the cluster demo over Connect (the same figures as on delta-rs) and test_jobs.

The expectation is independent of the dedup code: the same events sent once, through the same
pipeline into a second lake (on the default engine, once per module: ``sent_once``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.demo.data import PAGE_CHANGE_FILES
from pipelines.dev.services import KafkaBroker
from pipelines.flows import silver as silver_flow
from pipelines.runtime import ingest, ingest_kafka, passes
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import SILVER_EVENTS, SILVER_PAGE_CHANGE_STATE, SILVER_PAGE_CHANGES
from pipelines.storage import TableSpec, TableStore, open_store
from tests.infra.common import unique_name
from tests.infra.plans import files_scanned
from tests.pipelines.test_export import clickhouse_state, event, gold_state, write
from tests.pipelines.test_kafka_ingest import settings_env

pytestmark = pytest.mark.integration

STREAM = [event(i, second=i * 3) for i in range(30)]  # 90 s of events: 3 windows of 30 s
#: The engine of the tests whose rules no storage call decides (the module's docstring).
ONE_ENGINE = "delta-rs"


def make_ctx(spark: SparkSession, lake: Path, engine: str, **silver: Any) -> Context:
    settings = load_settings(
        lake_root=str(lake), delta_engine=engine, gold={"window": "30s", "grace": "60s"}, silver=silver
    )
    return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)


def downstream(ctx: Context) -> None:
    passes.gold_partials(ctx)
    passes.gold_merge(ctx)
    passes.export_property_values(ctx, drain=True)


@pytest.fixture(scope="module")
def sent_once(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Any]:
    """``sent_once(n)``: gold's and ClickHouse's states for the first ``n`` events of STREAM landed
    once from a file, through the pipeline on the default engine: what a run with repeats must
    give on either engine. Built once per module for each ``n``."""
    built: dict[int, Any] = {}

    def states(n: int) -> Any:
        if n not in built:
            folder = tmp_path_factory.mktemp(f"sent-once-{n}")
            once = make_ctx(spark, folder / "lake", "delta-rs")
            ingest.ingest_files(once, "events", [write(folder / "once.jsonl", STREAM[:n])])
            passes.silver_events(once)
            downstream(once)
            built[n] = (gold_state(once), clickhouse_state(once))
        return built[n]

    return states


def silver_uuids(store: TableStore) -> list[str]:
    return sorted(DeltaTable(store.path(SILVER_EVENTS)).to_pyarrow_table()["uuid"].to_pylist())


def dropped(ctx: Context) -> int:
    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'silver.events'").collect()
    return sum(int((r["metrics"] or {}).get("duplicates_dropped", 0)) for r in log)


@pytest.fixture(params=["in-driver", "suspects-in-driver", "in-spark"])
def suspects_in(request: pytest.FixtureRequest, engine: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where a batch's suspects and repeats are found: both in the driver (delta-rs, a batch and a
    part of silver known to be small), the suspects there and the repeats by Spark's window (as
    where two rows landed at one place: ``held_repeats`` undecided), or both by Spark
    (``HELD_IDENTITIES`` at 0)."""
    if request.param != "in-spark" and engine == "delta-spark":
        pytest.skip("delta-spark reads through Spark only: its suspects are found in Spark")
    if request.param == "suspects-in-driver":
        monkeypatch.setattr(silver_flow, "held_repeats", lambda *_, **__: None)
    if request.param == "in-spark":
        monkeypatch.setattr(silver_flow, "HELD_IDENTITIES", 0)
    return str(request.param)


def test_repeats_within_a_batch_across_batches_and_across_files_are_counted_once(
    spark: SparkSession, engine: str, suspects_in: str, tmp_path: Path, sent_once: Callable[[int], Any]
) -> None:
    twice = make_ctx(spark, tmp_path / "twice", engine)
    # Batch 1: a file with three lines sent twice, and a second file overlapping the first.
    a = write(tmp_path / "a.jsonl", STREAM[:20] + STREAM[5:8])
    b = write(tmp_path / "b.jsonl", STREAM[10:25])
    ingest.ingest_files(twice, "events", [a, b])
    first = passes.silver_events(twice)
    # Batch 2: the rest, re-exported with some of what silver already holds.
    c = write(tmp_path / "c.jsonl", STREAM[15:30] + STREAM[0:2])
    ingest.ingest_files(twice, "events", [c])
    second = passes.silver_events(twice)
    downstream(twice)

    assert silver_uuids(twice.store) == sorted(e["uuid"] for e in STREAM)
    # 23 + 15 rows in batch 1 hold 25 events; 17 rows in batch 2 hold 5 new ones.
    assert (first.metrics["duplicates_dropped"], second.metrics["duplicates_dropped"]) == (13, 12)
    assert (first.rows_in, first.rows_out, second.rows_in, second.rows_out) == (38, 25, 17, 5)
    assert dropped(twice) == 25
    assert (gold_state(twice), clickhouse_state(twice)) == sent_once(len(STREAM))


def test_a_batch_of_a_few_events_drops_those_silver_holds(spark: SparkSession, engine: str, tmp_path: Path) -> None:
    """A batch of at most ``LOOKUP_IDS`` rows reads silver for its own ids alone (``uuid IN``, by
    the files' Bloom filters): of three events, the two silver holds are dropped and counted."""
    ctx = make_ctx(spark, tmp_path / "few", engine)
    ingest.ingest_files(ctx, "events", [write(tmp_path / "a.jsonl", STREAM[:20])])
    passes.silver_events(ctx)
    ingest.ingest_files(ctx, "events", [write(tmp_path / "b.jsonl", [STREAM[3], STREAM[20], STREAM[17]])])
    record = passes.silver_events(ctx)
    assert (record.rows_in, record.rows_out, record.metrics["duplicates_dropped"]) == (3, 1, 2)
    assert silver_uuids(ctx.store) == sorted(e["uuid"] for e in STREAM[:21])


def test_a_batch_of_a_few_new_events_keeps_them_all_even_an_id_another_team_used(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch of at most ``LOOKUP_IDS`` rows that repeats nothing silver holds is written whole:
    an event is its ``(team_id, uuid)``, so another team's event with a uuid silver holds is new."""
    ctx = make_ctx(spark, tmp_path / "new", ONE_ENGINE)
    ingest.ingest_files(ctx, "events", [write(tmp_path / "a.jsonl", STREAM[:20])])
    passes.silver_events(ctx)
    other_team = {**STREAM[3], "team_id": 2}
    ingest.ingest_files(ctx, "events", [write(tmp_path / "b.jsonl", [STREAM[20], other_team, STREAM[21]])])
    record = passes.silver_events(ctx)
    assert (record.rows_in, record.rows_out, record.metrics["duplicates_dropped"]) == (3, 3, 0)
    assert silver_uuids(ctx.store) == sorted([e["uuid"] for e in STREAM[:22]] + [STREAM[3]["uuid"]])


def test_a_repeat_beyond_the_horizon_is_counted_again_and_zero_turns_it_off(
    spark: SparkSession, tmp_path: Path
) -> None:
    def late(e: dict[str, Any], hours: int) -> dict[str, Any]:
        return {**e, "timestamp": e["timestamp"].replace("T00:", f"T{hours:02d}:")}

    repeats = [STREAM[0], late(STREAM[0], 2), STREAM[1], STREAM[1]]  # 0 again after 2 h; 1 twice at once
    ctx = make_ctx(spark, tmp_path / "hour", ONE_ENGINE, dedup_horizon="1h")
    ingest.ingest_files(ctx, "events", [write(tmp_path / "r.jsonl", repeats)])
    record = passes.silver_events(ctx)
    assert (record.rows_out, record.metrics["duplicates_dropped"]) == (3, 1)
    assert silver_uuids(ctx.store) == sorted([STREAM[0]["uuid"], STREAM[0]["uuid"], STREAM[1]["uuid"]])

    off = make_ctx(spark, tmp_path / "off", ONE_ENGINE, dedup_horizon="0")
    ingest.ingest_files(off, "events", [write(tmp_path / "r.jsonl", repeats)])
    record = passes.silver_events(off)
    assert record.rows_out == 4 and "duplicates_dropped" not in record.metrics


class Crash(Exception):
    pass


def test_a_crash_between_the_dedup_read_and_the_commit_leaves_silver_as_one_clean_run_would(
    spark: SparkSession, engine: str, suspects_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(spark, tmp_path / "lake", engine)
    ingest.ingest_files(ctx, "events", [write(tmp_path / "a.jsonl", STREAM[:20])])
    passes.silver_events(ctx)
    ingest.ingest_files(ctx, "events", [write(tmp_path / "b.jsonl", STREAM[10:30] + STREAM[12:14])])
    engine_store = type(ctx.store)
    real_append = engine_store.append
    reads: list[TableSpec] = []

    def reading(real: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: TableStore, spec: TableSpec, *args: Any) -> Any:
            reads.append(spec)
            return real(self, spec, *args)

        return read

    def crash(self: TableStore, spec: TableSpec, *args: Any, **kw: Any) -> int:
        if spec == SILVER_EVENTS:
            assert reads == [SILVER_EVENTS]  # silver was read for the dedup before this commit
            raise Crash("killed between the dedup read and the commit")
        return real_append(self, spec, *args, **kw)

    monkeypatch.setattr(engine_store, "read_since", reading(engine_store.read_since))
    monkeypatch.setattr(engine_store, "held_since", reading(engine_store.held_since))
    monkeypatch.setattr(engine_store, "append", crash)
    with pytest.raises(Crash):
        passes.silver_events(ctx)
    monkeypatch.setattr(engine_store, "append", real_append)
    rerun = passes.silver_events(ctx)
    assert (rerun.rows_out, rerun.metrics["duplicates_dropped"]) == (10, 12)
    assert silver_uuids(ctx.store) == sorted(e["uuid"] for e in STREAM)


def test_silver_is_read_only_in_the_files_the_horizon_covers(spark: SparkSession, engine: str, tmp_path: Path) -> None:
    """Each day lands two batches half an hour apart. With a one-hour horizon the second run of a
    day reads the first's file and nothing older: the same number of silver files every day,
    however many days the table holds."""
    ctx = make_ctx(spark, tmp_path / "lake", engine, dedup_horizon="1h")
    engine_store = type(ctx.store)
    files_read: list[int] = []
    real = engine_store.read_since

    def counting(self: TableStore, spec: TableSpec, column: str, since: Any) -> Any:
        df = real(self, spec, column, since)
        files_read.append(files_scanned(df))
        return df

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_store, "read_since", counting)
        for day in range(1, 4):
            for minute in ("00", "30"):
                events = [
                    {**e, "timestamp": e["timestamp"].replace("06-01T00:00", f"06-{day:02d}T00:{minute}")}
                    for e in STREAM[:5]
                ]
                for e in events:
                    e["uuid"] = e["uuid"][:-6] + f"{day:02d}{minute}" + e["uuid"][-2:]
                ingest.ingest_files(ctx, "events", [write(tmp_path / f"day{day}-{minute}.jsonl", events)])
                passes.silver_events(ctx)
    second_runs = files_read[1::2]
    assert second_runs == [1] * 3, files_read  # the morning's file, not one more per day
    assert ctx.store.stats(SILVER_EVENTS).files == 6


def test_kafka_messages_sent_twice_are_one_event(
    spark: SparkSession,
    kafka_broker: KafkaBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sent_once: Callable[[int], Any],
) -> None:
    """A producer's retry: the same event in two messages, in one flush and across flushes, is one
    event in silver, gold and ClickHouse (against the same events landed once from a file)."""
    topic, pages, group = unique_name("events"), unique_name("pages"), unique_name("group")
    kafka_broker.create_topic(topic, 2)
    kafka_broker.create_topic(pages, 1)
    messages = [json.dumps(e).encode() for e in STREAM[:10]]
    kafka_broker.produce(topic, messages + messages[:4])
    lake = tmp_path / "lake"
    for k, v in settings_env(kafka_broker, lake, topic, pages, group).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MEDALLION_DELTA_ENGINE", ONE_ENGINE)
    monkeypatch.setenv("MEDALLION_GOLD__WINDOW", "30s")
    monkeypatch.setenv("MEDALLION_GOLD__GRACE", "60s")
    ctx = Context(settings=load_settings(), spark=spark, store=open_store(load_settings(), spark))
    ingest_kafka.ingest_kafka(ctx, once=True, max_batch=100, max_wait=0.5)
    first = passes.silver_events(ctx)
    kafka_broker.produce(topic, messages[6:] + [json.dumps(e).encode() for e in STREAM[10:12]])
    ingest_kafka.ingest_kafka(ctx, once=True, max_batch=100, max_wait=0.5)
    second = passes.silver_events(ctx)
    assert (first.rows_out, first.metrics["duplicates_dropped"]) == (10, 4)
    assert (second.rows_out, second.metrics["duplicates_dropped"]) == (2, 4)
    assert silver_uuids(ctx.store) == sorted(e["uuid"] for e in STREAM[:12])
    downstream(ctx)

    assert (gold_state(ctx), clickhouse_state(ctx)) == sent_once(12)


def test_page_changes_drop_an_exact_repeat_of_meta_id_and_count_it(spark: SparkSession, tmp_path: Path) -> None:
    lines = [ln for f in PAGE_CHANGE_FILES for ln in f.read_text().splitlines() if ln.strip()]
    (tmp_path / "all.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "again.jsonl").write_text("\n".join(lines[:3]) + "\n")  # a producer's retry of three

    def emitted(lake: str, files: list[str]) -> tuple[list[tuple], Any]:
        ctx = make_ctx(spark, tmp_path / lake, ONE_ENGINE)
        ingest.ingest_files(ctx, "page_changes", [tmp_path / f for f in files])
        record = passes.silver_page_changes(ctx, drain=True)
        rows = ctx.store.read(SILVER_PAGE_CHANGES).drop("raw").collect()
        return sorted(tuple(r) for r in rows), record

    once, first = emitted("once", ["all.jsonl"])
    twice, record = emitted("twice", ["all.jsonl", "again.jsonl"])
    assert twice == once
    assert (first.metrics["duplicates_dropped"], record.metrics["duplicates_dropped"]) == (0, 3)
    assert record.rows_in == len(lines) + 3


def test_a_page_change_repeating_one_buffered_in_an_open_window_is_dropped_and_counted(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The newest change (2024-10-08T07:35:59Z) is still buffered after the first run: its window
    # ends after the watermark (the newest time less the minute of allowed lateness). A producer's
    # retry of it lands before the second run, which finds the first copy in the buffer.
    lines = [ln for f in PAGE_CHANGE_FILES for ln in f.read_text().splitlines() if ln.strip()]
    newest = max(lines, key=lambda ln: json.loads(ln)["dt"])
    (tmp_path / "all.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "retry.jsonl").write_text(newest + "\n")

    def emitted(lake: str, retry: bool) -> tuple[list[tuple], list[Any]]:
        ctx = make_ctx(spark, tmp_path / lake, ONE_ENGINE)
        ingest.ingest_files(ctx, "page_changes", [tmp_path / "all.jsonl"])
        runs = [passes.silver_page_changes(ctx)]
        # The state's rows, as the run's figure gives them (counted by its write) and as the table holds them.
        states = [(runs[0].metrics["state_rows"], ctx.store.read(SILVER_PAGE_CHANGE_STATE).count())]
        if retry:
            ingest.ingest_files(ctx, "page_changes", [tmp_path / "retry.jsonl"])
        runs += [passes.silver_page_changes(ctx), passes.silver_page_changes(ctx, drain=True)]
        states.append((runs[-1].metrics["state_rows"], ctx.store.read(SILVER_PAGE_CHANGE_STATE).count()))
        assert all(figure == held for figure, held in states), states
        rows = ctx.store.read(SILVER_PAGE_CHANGES).drop("raw").collect()
        return sorted(tuple(r) for r in rows), runs

    once, _ = emitted("once", retry=False)
    twice, (first, second, drained) = emitted("twice", retry=True)
    assert twice == once and len(once) == 11  # the staggered worked example: 11 of the 13 emitted
    assert (first.metrics["buffered_events"], second.rows_in, second.metrics["duplicates_dropped"]) == (1, 1, 1)
    assert (second.rows_out, drained.rows_out) == (0, 1)
