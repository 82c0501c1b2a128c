"""Counters: totals against brute force over pods and runs, milestones exactly once through crashes,
tiers that flush hot entities less often, ClickHouse exactly once, clear registry errors."""

from __future__ import annotations

import json
import random
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from gold.counters import RegistryError, by_version, load_registry
from pipelines.config.layers import counter, load_counter_registry
from pipelines.config.settings import load_settings
from pipelines.errors import SettingsError
from pipelines.flows import counters as counter_jobs
from pipelines.runtime import ingest, passes
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_COUNTER_MILESTONES, GOLD_COUNTERS
from pipelines.sinks import clickhouse
from pipelines.storage import open_store
from tests.helpers import delta_rs_only  # noqa: F401  (the engine fixture: delta-rs here)

pytestmark = pytest.mark.integration

REGISTRY = """
counters:
  - name: post_views
    event: view
    entity: post_id
    tiers:
      - {below: 5, interval: 0s}
      - {below: 40, interval: 3m}
      - {interval: 10m}
    milestones: [5, 20, 50, 100]
  - name: mobile_likes
    event: [like, superlike]
    where: {device: [ios, android], verified: true}
    entity: post_id
    milestones: [3, 10]
"""


def make_ctx(spark: SparkSession, tmp_path: Path, registry: str = REGISTRY, engine: str = "delta-rs") -> Context:
    path = tmp_path / "counters.yaml"
    path.write_text(registry)
    settings = load_settings(
        lake_root=str(tmp_path / "lake"),
        delta_engine=engine,
        counters={"registry": str(path)},
        quality={"enabled": False},
    )
    return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)


def stream(seed: int, n: int, minutes: int, start_minute: int = 0) -> list[dict[str, Any]]:
    """Events over ``minutes``: views and likes of 25 posts with a Zipf-like skew, plus noise."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        second = start_minute * 60 + i * minutes * 60 // n
        post = f"p{min(int(rng.paretovariate(1.1)), 25)}"
        kind = rng.choices(["view", "like", "superlike", "other"], [70, 15, 5, 10])[0]
        props: dict[str, Any] = {"post_id": post, "device": rng.choice(["ios", "android", "web"])}
        props["verified"] = rng.random() < 0.8
        if rng.random() < 0.03:
            props.pop("post_id")  # no entity: counts nowhere
        out.append(
            {
                "uuid": f"00000000-0000-4000-8000-{seed:04d}{i:08d}",
                "event": kind,
                "team_id": 1,
                "distinct_id": f"u{i % 7}",
                "timestamp": f"2024-06-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z",
                "properties": props,
            }
        )
    return out


def brute_force(events: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    totals: Tally[tuple[str, str]] = Tally()
    for e in events:
        p = e["properties"]
        if "post_id" not in p:
            continue
        if e["event"] == "view":
            totals[("post_views", p["post_id"])] += 1
        if e["event"] in ("like", "superlike") and p["device"] in ("ios", "android") and p["verified"]:
            totals[("mobile_likes", p["post_id"])] += 1
    return dict(totals)


def land(ctx: Context, tmp_path: Path, events: list[dict[str, Any]], name: str, pods: int = 2) -> None:
    """The batch as ``pods`` interleaved files, as pods reading one stream would write them."""
    paths = []
    for pod in range(pods):
        path = tmp_path / f"{name}-pod{pod}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in events[pod::pods]))
        paths.append(path)
    ingest.ingest_files(ctx, "events", paths)
    passes.silver_events(ctx)


def run_counters(ctx: Context, drain: bool = False) -> None:
    passes.gold_counter_partials(ctx)
    passes.gold_counters(ctx, drain=drain)
    passes.counter_milestones(ctx)
    passes.export_counters(ctx)


def totals(ctx: Context) -> dict[tuple[str, str], int]:
    return {(r["counter"], r["entity"]): r["total"] for r in ctx.store.read(GOLD_COUNTERS).collect()}


def milestones(ctx: Context) -> list[tuple[str, str, int]]:
    rows = ctx.store.read(GOLD_COUNTER_MILESTONES).collect()
    return sorted((r["counter"], r["entity"], r["threshold"]) for r in rows)


def expected_milestones(counts: dict[tuple[str, str], int]) -> list[tuple[str, str, int]]:
    thresholds = {"post_views": [5, 20, 50, 100], "mobile_likes": [3, 10]}
    return sorted((c, e, t) for (c, e), n in counts.items() for t in thresholds[c] if t <= n)


def clickhouse_counters(ctx: Context) -> tuple[dict[tuple[str, str], int], int]:
    with clickhouse.connect(ctx.settings) as client:
        final = clickhouse.query_rows(client, "SELECT counter, entity, total FROM counters FINAL")
        raw = clickhouse.query_rows(client, "SELECT count() FROM counters")[0][0]
    return {(c, e): t for c, e, t in final}, int(raw)


def test_totals_equal_brute_force_across_pods_and_runs(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path)
    everything: list[dict[str, Any]] = []
    for run in range(4):
        batch = stream(seed=run + 1, n=300, minutes=5, start_minute=run * 5)
        everything += batch
        land(ctx, tmp_path, batch, f"run{run}")
        run_counters(ctx)
    run_counters(ctx, drain=True)  # the end of the stream: flush every entity whatever its tier
    want = brute_force(everything)
    assert totals(ctx) == want
    assert milestones(ctx) == expected_milestones(want)
    in_clickhouse, _ = clickhouse_counters(ctx)
    assert in_clickhouse == want
    before = (totals(ctx), milestones(ctx), clickhouse_counters(ctx))
    run_counters(ctx, drain=True)  # nothing new: nothing changes
    assert (totals(ctx), milestones(ctx), clickhouse_counters(ctx)) == before


def test_each_threshold_once_with_crashes_between_merge_and_milestones(
    spark: SparkSession, engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(spark, tmp_path, engine=engine)
    everything: list[dict[str, Any]] = []
    real = counter_jobs.crossings
    for run in range(3):
        batch = stream(seed=10 + run, n=250, minutes=5, start_minute=run * 5)
        everything += batch
        land(ctx, tmp_path, batch, f"run{run}")
        passes.gold_counter_partials(ctx)
        passes.gold_counters(ctx, drain=True)  # the MERGE commits ...

        def crash(*_: Any) -> Any:
            raise RuntimeError("killed between the MERGE and the milestone write")

        monkeypatch.setattr(counter_jobs, "crossings", crash)
        with pytest.raises(RuntimeError, match="killed"):
            passes.counter_milestones(ctx)  # ... and the milestone step dies
        monkeypatch.setattr(counter_jobs, "crossings", real)
        if run % 2:
            passes.counter_milestones(ctx)  # recovered at once on odd runs, one run later otherwise
    passes.counter_milestones(ctx)
    passes.counter_milestones(ctx)  # a rerun reads no counters version twice
    got = milestones(ctx)
    assert len(got) == len(set(got)), "a threshold was written twice"
    assert got == expected_milestones(brute_force(everything))
    rows = ctx.store.read(GOLD_COUNTER_MILESTONES).collect()
    assert all(r["total"] >= r["threshold"] for r in rows)


def test_hot_entities_are_flushed_less_often_than_cold_ones(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path)
    for minute in range(12):  # one run per minute of event time
        events = [
            {
                "uuid": f"00000000-0000-4000-8000-{minute:04d}{i:08d}",
                "event": "view",
                "team_id": 1,
                "distinct_id": "u",
                "timestamp": f"2024-06-01T00:{minute:02d}:{i % 60:02d}Z",
                "properties": {"post_id": "hot" if i else "cold"},
            }
            for i in range(10)  # 9 views of "hot" and 1 of "cold" every minute
        ]
        land(ctx, tmp_path, events, f"m{minute}", pods=1)
        passes.gold_counter_partials(ctx)
        passes.gold_counters(ctx)
    rows = {r["entity"]: r for r in ctx.store.read(GOLD_COUNTERS).where("counter = 'post_views'").collect()}
    cold, hot = rows["cold"], rows["hot"]
    # cold stays below 5 for its first 4 views (flushed every run), then every 3 minutes.
    assert cold["flushes"] >= 6
    # hot passes 5 in its first run, then 40 within 5 runs: from then on every 10 minutes.
    assert hot["flushes"] <= 4 < 12
    assert hot["total"] < 12 * 9, "hot increments wait for their tier's interval"
    passes.gold_counters(ctx, drain=True)
    assert {r["entity"]: r["total"] for r in ctx.store.read(GOLD_COUNTERS).collect()} == {"hot": 108, "cold": 12}


def test_a_crashed_export_is_resent_and_clickhouse_drops_the_repeat(
    spark: SparkSession, engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(spark, tmp_path, engine=engine)
    land(ctx, tmp_path, stream(seed=5, n=200, minutes=3), "a")
    passes.gold_counter_partials(ctx)
    passes.gold_counters(ctx, drain=True)
    real_append = ctx.store.append

    def append(spec: Any, *args: Any, **kwargs: Any) -> Any:
        if spec.key == "_meta/counter_exports":
            raise RuntimeError("killed after the insert, before the record")
        return real_append(spec, *args, **kwargs)

    monkeypatch.setattr(ctx.store, "append", append)
    with pytest.raises(RuntimeError, match="killed"):
        passes.export_counters(ctx)
    monkeypatch.setattr(ctx.store, "append", real_append)
    passes.export_counters(ctx)
    final, raw = clickhouse_counters(ctx)
    assert final == totals(ctx)
    assert raw == len(final), "the resent insert was dropped by its token"


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ("counters: [{name: a, event: view}]", "counters[0].entity: Field required"),
        ("counters: [{name: A b, event: view, entity: p}]", "counters[0].name: String should match pattern"),
        (
            "counters: [{name: a, event: view, entity: p, tiers: [{interval: 1m}, {below: 10, interval: 0s}]}]",
            "only the last tier may leave out `below`",
        ),
        (
            "counters: [{name: a, event: view, entity: p, tiers: [{below: 10, interval: 0s}]}]",
            "the last tier must leave out `below`",
        ),
        (
            "counters: [{name: a, event: view, entity: p, tiers: [{below: 9, interval: 0s}, "
            "{below: 5, interval: 1m}, {interval: 5m}]}]",
            "tier bounds must increase",
        ),
        ("counters: [{name: a, event: view, entity: p, milestones: [0, 5]}]", "milestones must be positive"),
        ("counters: [{name: a, event: view, entity: p, tiers: [{interval: soon}]}]", "invalid duration 'soon'"),
        ("counters: [{name: a, event: v, entity: p}, {name: a, event: w, entity: q}]", "used twice: ['a']"),
        ("counters: [{name: a, event: v, entity: p, colour: red}]", "counters[0].colour: Extra inputs"),
        ("counters: {name: a", "not valid YAML"),
        ("42", "expected a mapping with a `counters` list"),
    ],
)
def test_registry_errors_are_clear(tmp_path: Path, registry: str, message: str) -> None:
    path = tmp_path / "counters.yaml"
    path.write_text(registry)
    with pytest.raises(RegistryError) as problem:
        load_registry(path)
    with pytest.raises(SettingsError) as err:
        load_counter_registry(path)
    text = str(err.value)
    assert message in text and str(path) in text, text
    assert err.value.problems == problem.value.problems


def test_a_missing_registry_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="file not found \\(MEDALLION_COUNTERS__REGISTRY\\)"):
        load_registry(tmp_path / "nope.yaml")
    with pytest.raises(SettingsError, match="file not found \\(MEDALLION_COUNTERS__REGISTRY\\)"):
        load_counter_registry(tmp_path / "nope.yaml")


def test_an_unknown_counter_is_a_settings_error_naming_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "counters.yaml"
    path.write_text(REGISTRY)
    with pytest.raises(SettingsError, match="no counter named 'likes' in the registry \\(post_views, mobile_likes\\)"):
        counter(load_counter_registry(path), "likes")


def test_changes_go_out_one_table_per_counters_version_even_across_batches() -> None:
    batches = [
        pa.record_batch({"entity": ["a", "b", "a"], "version": [1, 1, 2]}),
        pa.record_batch({"entity": ["b", "c"], "version": [2, 3]}),
    ]
    tables = list(by_version(batches))
    assert [(t["version"].to_pylist(), t["entity"].to_pylist()) for t in tables] == [
        ([1, 1], ["a", "b"]),
        ([2, 2], ["a", "b"]),
        ([3], ["c"]),
    ]
