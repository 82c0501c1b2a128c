"""Kafka -> bronze against a real Kafka-protocol broker (Tansu): exactly once, under kills and pods."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.demo import synthetic
from pipelines.demo.data import PAGE_CHANGE_FILES
from pipelines.dev.services import KafkaBroker, free_port
from pipelines.runtime import ingest_kafka
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_QUARANTINE
from pipelines.sources.kafka import app_id
from pipelines.storage import open_store
from tests.helpers import delta_rs_only  # noqa: F401  (the engine fixture: delta-rs here)
from tests.infra.common import unique_name

pytestmark = pytest.mark.integration


def events(n: int, seed: int = 3) -> list[bytes]:
    spec = synthetic.EventsSpec(events=n, teams=20, seed=seed)
    return [json.dumps(e, separators=(",", ":")).encode() for e in synthetic.generate_events(spec)]


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A /metrics page parsed: (sample name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def table(lake: Path, key: str) -> pa.Table:
    return DeltaTable(str(lake / key)).to_pyarrow_table()


def settings_env(broker: KafkaBroker, lake: Path, events_topic: str, pages_topic: str, group: str) -> dict[str, str]:
    return {
        "MEDALLION_LAKE_ROOT": str(lake),
        "MEDALLION_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
        "MEDALLION_KAFKA__TOPICS__EVENTS": events_topic,
        "MEDALLION_KAFKA__TOPICS__PAGE_CHANGES": pages_topic,
        "MEDALLION_KAFKA__GROUP_ID": group,
        "MEDALLION_KAFKA__SESSION_TIMEOUT": "6s",
        "MEDALLION_SPARK__SHUFFLE_PARTITIONS": "2",
        "MEDALLION_SPARK__DRIVER_MEMORY": "1g",
    }


def test_once_lands_valid_messages_once_and_quarantines_the_rest(
    spark: SparkSession, engine: str, kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev, pages, group = unique_name("events"), unique_name("pages"), unique_name("group")
    kafka_broker.create_topic(ev, 3)
    kafka_broker.create_topic(pages, 2)
    good = events(300)
    bad = [b"not json", b"\xff\xfe", json.dumps({"uuid": "x", "event": "e"}).encode()]
    placed = kafka_broker.produce(ev, good + bad)
    kafka_broker.produce(pages, [p.read_bytes() for p in PAGE_CHANGE_FILES])
    lake = tmp_path / "lake"
    for k, v in settings_env(kafka_broker, lake, ev, pages, group).items():
        monkeypatch.setenv(k, v)
    # In process, on either engine (delta-spark records one partition's app transaction per commit).
    # The subprocess tests below run the default engine, delta-rs: a JVM start per delta-spark pod
    # would make their kill timings and deadlines meaningless.
    monkeypatch.setenv("MEDALLION_DELTA_ENGINE", engine)
    settings = load_settings()
    assert settings.delta_engine == engine
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark))

    stats = ingest_kafka.ingest_kafka(ctx, once=True, max_batch=100, max_wait=0.5)
    assert (stats.messages, stats.landed, stats.quarantined) == (316, 313, 3)
    bronze = table(lake, "bronze/events")
    assert sorted(bronze["uuid"].to_pylist()) == sorted(json.loads(m)["uuid"] for m in good)
    landed_at = set(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    assert landed_at == set(placed[:300])
    assert set(bronze["topic"].to_pylist()) == {ev} and bronze["kafka_timestamp"].null_count == 0
    assert table(lake, "bronze/page_changes").num_rows == 13
    # Flushes with nothing to quarantine make no quarantine commit: no page change was bad.
    assert [ctx.store.txn_version(BRONZE_QUARANTINE, app_id(group, pages, p)) for p in (0, 1)] == [None, None]

    quarantine = table(lake, "bronze/quarantine")
    got = sorted(
        zip(
            quarantine["partition"].to_pylist(),
            quarantine["offset"].to_pylist(),
            quarantine["reason"].to_pylist(),
            strict=True,
        )
    )
    expected_reasons = ["not valid JSON", "not valid UTF-8", "missing required field 'team_id'"]
    assert got == sorted((p, o, r) for (p, o), r in zip(placed[300:], expected_reasons, strict=True))
    assert set(quarantine["raw"].to_pylist()) == set(bad)

    again = ingest_kafka.ingest_kafka(ctx, once=True, max_batch=100, max_wait=0.5)
    assert (again.messages, again.landed) == (0, 0)
    assert table(lake, "bronze/events").num_rows == 300
    assert table(lake, "bronze/quarantine").num_rows == 3


def ingest_cmd(*extra: str, max_batch: int = 300) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelines.app.cli",
        "ingest",
        "kafka",
        "--once",
        "--max-batch",
        str(max_batch),
        "--max-wait",
        "0.5",
        *extra,
    ]


def assert_exactly_once(lake: Path, produced: list[bytes]) -> None:
    bronze = table(lake, "bronze/events")
    keys = list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == len(produced)
    assert sorted(bronze["uuid"].to_pylist()) == sorted(json.loads(m)["uuid"] for m in produced)


def test_kill_9_at_random_moments_then_restart_lands_everything_exactly_once(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    ev, group = unique_name("events"), unique_name("group")
    kafka_broker.create_topic(ev, 4)
    produced = events(10_000, seed=11)
    kafka_broker.produce(ev, produced)
    lake = tmp_path / "lake"
    env = {**os.environ, **settings_env(kafka_broker, lake, ev, unique_name("unused"), group)}
    rng = random.Random(20261121)
    kills = 0
    for _ in range(4):
        # Small batches: many commits, so a kill lands mid-stream (larger ones land it all at once).
        proc = subprocess.Popen(
            ingest_cmd("--topics", ev, max_batch=10), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(7.0, 16.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
    assert kills >= 2
    landed_before = table(lake, "bronze/events").num_rows if (lake / "bronze/events").exists() else 0
    final = subprocess.run(ingest_cmd("--topics", ev), env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    assert landed_before < len(produced), "the kills came after the work: produce more"
    assert_exactly_once(lake, produced)


def test_two_consumers_of_one_group_at_once_land_everything_exactly_once(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    ev, group = unique_name("events"), unique_name("group")
    kafka_broker.create_topic(ev, 4)
    produced = events(4000, seed=5)
    kafka_broker.produce(ev, produced)
    lake = tmp_path / "lake"
    env = {**os.environ, **settings_env(kafka_broker, lake, ev, unique_name("unused"), group)}
    # The first pod creates the tables; then both run at once, rebalancing as they come and go.
    procs = [
        subprocess.Popen(ingest_cmd("--topics", ev), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    assert_exactly_once(lake, produced)
    flushes = table(lake, "_meta/pipeline_events").filter(
        (pc.field("job") == "ingest.kafka") & (pc.field("rows_out") > 0)
    )
    members = {d.rsplit("-", 1)[0] for d in flushes["details"].to_pylist()}
    assert len(members) == 2, "both pods should have landed part of the topic"


def test_without_once_it_runs_until_sigterm_and_finishes_its_batch(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    ev, group = unique_name("events"), unique_name("group")
    kafka_broker.create_topic(ev, 2)
    first = events(500, seed=21)
    kafka_broker.produce(ev, first)
    lake = tmp_path / "lake"
    env = {**os.environ, **settings_env(kafka_broker, lake, ev, unique_name("unused"), group)}
    port = free_port()
    cmd = [sys.executable, "-m", "pipelines.app.cli", "ingest", "kafka", "--topics", ev, "--max-wait", "1"]
    cmd += ["--metrics-port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (lake / "bronze/events").exists() or table(lake, "bronze/events").num_rows < 500:
            assert proc.poll() is None and time.monotonic() < deadline, "the consumer stopped or stalled"
            time.sleep(1)
        second = events(300, seed=22)
        kafka_broker.produce(ev, second)  # arrives while it keeps running
        while table(lake, "bronze/events").num_rows < 800:
            assert time.monotonic() < deadline, "new messages were not picked up"
            time.sleep(1)
        # What an operator scrapes while it runs: every row landed, no lag, the newest row's time.
        scraped = scrape(f"http://127.0.0.1:{port}/metrics")
        assert scraped[("medallion_job_rows_out_total", (("job", "ingest.kafka"),))] == 800
        assert scraped[("medallion_job_rows_quarantined_total", (("job", "ingest.kafka"),))] == 0
        assert scraped[("medallion_job_runs_total", (("job", "ingest.kafka"), ("status", "ok")))] >= 2
        assert scraped[("medallion_job_duration_seconds_count", (("job", "ingest.kafka"),))] >= 2
        lags = {labels: v for (name, labels), v in scraped.items() if name == "medallion_kafka_consumer_lag"}
        assert lags == {(("partition", "0"), ("topic", ev)): 0.0, (("partition", "1"), ("topic", ev)): 0.0}
        newest = scraped[("medallion_newest_row_timestamp_seconds", (("job", "ingest.kafka"),))]
        assert time.time() - 120 < newest <= time.time()  # the broker stamped them as they were produced
        assert time.time() - 120 < scraped[("medallion_job_last_success_timestamp_seconds", (("job", "ingest.kafka"),))]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-1500:]
    assert "800 landed" in out
    assert_exactly_once(lake, first + second)
