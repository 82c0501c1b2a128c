"""Metric panes and windows against brute force: exact accumulators, sketches within their error,
sliding = merge of panes, late samples dropped (and counted) or forwarded (same answer as on time)."""

from __future__ import annotations

import bisect
import random
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from gold.metric_windows import cms_estimate, merge_cms
from pipelines.app.metric_queries import dropped_late, query
from pipelines.config.settings import load_settings
from pipelines.runtime import passes
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_SAMPLES, GOLD_METRIC_WINDOWS
from pipelines.sources.remote_write_rows import samples_table
from pipelines.sources.remote_write_series import Series, from_series
from pipelines.storage import open_store

T0 = datetime(2026, 3, 1, tzinfo=UTC)
MS = 1000

Sample = tuple[tuple[tuple[str, str], ...], int, float]  # labels, timestamp ms, value


def make_ctx(spark: SparkSession, lake: Path, aggregations: list[dict[str, Any]]) -> Context:
    settings = load_settings(lake_root=str(lake), metrics={"aggregations": aggregations})
    return Context(settings=settings, spark=spark, store=open_store(settings, spark))


def land(ctx: Context, samples: list[Sample]) -> None:
    """One bronze commit holding ``samples`` in the order given (one Series per sample keeps it)."""
    series = [Series(labels, [t], [v]) for labels, t, v in samples]
    ctx.store.ensure(BRONZE_SAMPLES)
    ctx.store.append(BRONZE_SAMPLES, samples_table(from_series(series), "prometheus", "test", datetime.now(UTC)))


def step(ctx: Context, drain: bool = False) -> None:
    passes.silver_metric_panes(ctx, drain=drain)
    passes.gold_metric_windows(ctx)


def counters(seed: int, minutes: int = 16, every_s: int = 10) -> list[Sample]:
    """Counters for 2 instances x 3 modes, with resets, one sample every ``every_s`` seconds."""
    rng = random.Random(seed)
    out: list[Sample] = []
    for instance in ("a", "b"):
        for mode in ("user", "system", "idle"):
            labels = (("__name__", "cpu_total"), ("instance", instance), ("mode", mode))
            value = rng.uniform(0, 100)
            for i in range(minutes * 60 // every_s):
                if rng.random() < 0.04:
                    value = rng.uniform(0, 3)  # a restart: the counter starts again near zero
                else:
                    value += rng.uniform(0, 5)
                out.append((labels, int(T0.timestamp() * MS) + i * every_s * MS + rng.randint(0, 999), value))
    return out


def arrival_batches(samples: list[Sample], batches: int, max_delay_ms: int, seed: int) -> list[list[Sample]]:
    """Samples in arrival order (time + a random delay), cut into batches, each batch shuffled."""
    rng = random.Random(seed)
    arriving = sorted(samples, key=lambda s: s[1] + rng.randint(0, max_delay_ms))
    size = -(-len(arriving) // batches)
    out = [arriving[i : i + size] for i in range(0, len(arriving), size)]
    for b in out:
        rng.shuffle(b)
    return out


def brute_force(samples: list[Sample], window_s: int, slide_s: int, group: str) -> dict[tuple, dict[str, float]]:
    """Every window with samples, per value of label ``group``: count/sum/min/max and increase."""
    by_series: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for labels, t, v in samples:
        by_series[labels].append((t, v))
    out: dict[tuple, dict[str, float]] = {}
    w, s = window_s * MS, slide_s * MS
    for labels, points in by_series.items():
        points.sort()
        g = dict(labels)[group]
        for i, (t, v) in enumerate(points):
            delta = 0.0 if i == 0 else (v - points[i - 1][1] if v >= points[i - 1][1] else v)
            pane = t // s * s
            for start in range(pane - w + s, pane + 1, s):
                key = (start, g)
                acc = out.setdefault(key, {"count": 0, "sum": 0.0, "min": v, "max": v, "increase": 0.0})
                acc["count"] += 1
                acc["sum"] += v
                acc["min"], acc["max"] = min(acc["min"], v), max(acc["max"], v)
                acc["increase"] += delta
    return out


def by_window(rows: list[dict[str, Any]], group: str) -> dict[tuple, dict[str, Any]]:
    return {(int(r["window_start"].timestamp() * MS), r[group]): r for r in rows}


CPU = {
    "selector": 'cpu_total{mode!="idle"}',
    "accumulators": ["sum", "count", "min", "max", "increase"],
    "grouping_labels": ["mode"],
    "allowed_lateness": "60s",
}


@pytest.mark.parametrize(("window_s", "slide_s"), [(60, 60), (120, 20)], ids=["tumbling", "sliding-6-panes"])
def test_accumulators_equal_brute_force_with_resets_and_out_of_order_samples(
    spark: SparkSession, tmp_path: Path, window_s: int, slide_s: int
) -> None:
    ctx = make_ctx(spark, tmp_path / "lake", [{**CPU, "name": "cpu", "window": window_s, "slide": slide_s}])
    samples = counters(seed=7)
    for batch in arrival_batches(samples, batches=4, max_delay_ms=45_000, seed=8):
        land(ctx, batch)
        step(ctx)
    step(ctx, drain=True)
    rows = query(ctx, "cpu", group_by=["mode"], include_open=False)
    expected = brute_force([s for s in samples if dict(s[0])["mode"] != "idle"], window_s, slide_s, "mode")
    got = by_window(rows, "mode")
    assert got.keys() == expected.keys()
    for key, want in expected.items():
        row = got[key]
        assert row["kinds"] == ["window"], key
        assert row["count"] == want["count"], key
        for name in ("sum", "min", "max", "increase"):
            assert row[name] == pytest.approx(want[name], rel=1e-9, abs=1e-9), (key, name)
        assert row["rate"] == pytest.approx(want["increase"] / window_s)
        assert row["increase"] >= 0
    assert dropped_late(ctx, "cpu") == 0


def test_a_sliding_window_is_the_merge_of_its_tumbling_panes(spark: SparkSession, tmp_path: Path) -> None:
    aggs = [
        {**CPU, "name": "slide", "window": 120, "slide": 20},
        {**CPU, "name": "panes", "window": 20},
    ]
    ctx = make_ctx(spark, tmp_path / "lake", aggs)
    land(ctx, counters(seed=3, minutes=6))
    step(ctx, drain=True)
    sliding = by_window(query(ctx, "slide", group_by=["mode"], include_open=False), "mode")
    panes = by_window(query(ctx, "panes", group_by=["mode"], include_open=False), "mode")
    for (start, mode), row in sliding.items():
        parts = [panes[(p, mode)] for p in range(start, start + 120 * MS, 20 * MS) if (p, mode) in panes]
        assert row["count"] == sum(p["count"] for p in parts)
        assert row["increase"] == pytest.approx(sum(p["increase"] for p in parts))
        assert row["max"] == max(p["max"] for p in parts)


def sketch_samples(seed: int, n: int = 20_000, users: int = 5_000) -> tuple[list[Sample], list[float], set[str]]:
    rng = random.Random(seed)
    samples, values, seen = [], [], set()
    start = int(T0.timestamp() * MS)
    for i in range(n):
        user = f"u{int(rng.paretovariate(1.2)) % users}" if i % 2 else f"u{rng.randrange(users)}"
        value = rng.lognormvariate(3, 1)
        labels = (("__name__", "latency_ms"), ("route", "/api"), ("user", user))
        samples.append((labels, start + i * 3, value))  # unique per series: nothing is a resend
        values.append(value)
        seen.add(user)
    return samples, values, seen


def test_quantiles_distinct_and_top_values_are_within_the_sketches_error(spark: SparkSession, tmp_path: Path) -> None:
    agg = {
        "name": "latency",
        "selector": "latency_ms",
        "window": "1m",
        "accumulators": ["count", "quantiles", "distinct", "frequency"],
        "grouping_labels": ["route"],
        "aggregated_labels": ["user"],
    }
    ctx = make_ctx(spark, tmp_path / "lake", [agg])
    samples, values, users = sketch_samples(seed=11)
    half = len(samples) // 2
    land(ctx, samples[:half])  # two commits: the window merges sketches of two pane rows
    step(ctx)
    land(ctx, samples[half:])
    step(ctx, drain=True)
    (row,) = query(ctx, "latency", quantiles=(0.1, 0.5, 0.9, 0.99), top=3, include_open=False)
    assert row["count"] == len(values)
    ordered = sorted(values)
    for q in (0.1, 0.5, 0.9, 0.99):
        rank = bisect.bisect_right(ordered, row[f"q{q:g}"]) / len(ordered)
        # DataSketches KLL, k=200: normalized rank error 1.33% (99% confidence).
        assert abs(rank - q) <= 0.0133, (q, rank)
    # HLL, lgK=12: relative standard error 1.04/sqrt(4096) = 1.6%; allow three of them.
    assert abs(row["distinct"] - len(users)) <= 0.049 * len(users)
    truth: dict[str, int] = defaultdict(int)
    for labels, _, _ in samples:
        truth[dict(labels)["user"]] += 1
    best = sorted(truth.items(), key=lambda kv: -kv[1])[:3]
    assert [u for u, _ in row["top"]] == [u for u, _ in best]
    for user, estimate in row["top"]:
        # count-min never undercounts, and overcounts by at most eps * total (99% confidence).
        assert truth[user] <= estimate <= truth[user] + 0.001 * len(samples) + 1
    assert row["frequency_total"] == len(samples)


def late_agg(late: str) -> dict[str, Any]:
    return {
        "name": "g",
        "selector": "gauge",
        "window": "2m",
        "slide": "1m",
        "accumulators": ["sum", "count", "min", "max", "quantiles", "distinct", "frequency"],
        "grouping_labels": ["zone"],
        "aggregated_labels": ["host"],
        "allowed_lateness": "30s",
        "late": late,
    }


def gauges() -> tuple[list[Sample], list[Sample]]:
    """Gauge samples over 10 minutes, and those of the first 2 minutes."""
    rng = random.Random(5)
    start = int(T0.timestamp() * MS)
    samples = [
        ((("__name__", "gauge"), ("host", f"h{i % 7}"), ("zone", f"z{i % 2}")), start + i * 1500, rng.uniform(0, 9))
        for i in range(400)
    ]
    return samples, [s for s in samples if s[1] < start + 120_000]


def late_scenario(spark: SparkSession, lake: Path, late: str, on_time: bool) -> tuple[Context, int]:
    """Gauge samples over 10 minutes; unless ``on_time``, the first 2 minutes arrive after the rest."""
    ctx = make_ctx(spark, lake, [late_agg(late)])
    samples, early = gauges()
    rest = [s for s in samples if s not in early]
    if on_time:
        land(ctx, samples)
        step(ctx)
    else:
        land(ctx, rest)
        step(ctx)
        land(ctx, early)  # every one of these is behind the watermark now
        step(ctx)
    step(ctx, drain=True)
    return ctx, len(early)


def comparable(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {(r["window_start"], r["zone"]): {k: v for k, v in r.items() if k != "kinds"} for r in rows}


def test_forwarded_late_samples_give_the_answer_on_time_samples_give(spark: SparkSession, tmp_path: Path) -> None:
    on_time, _ = late_scenario(spark, tmp_path / "on-time", "forward", on_time=True)
    late, n_late = late_scenario(spark, tmp_path / "late", "forward", on_time=False)
    want = comparable(query(on_time, "g", group_by=["zone"], include_open=False))
    rows = query(late, "g", group_by=["zone"], include_open=False)
    got = comparable(rows)
    assert got.keys() == want.keys()
    for key in want:
        for name in ("count", "min", "max", "distinct", "top", "frequency_total", "q0.5", "q0.9"):
            assert got[key][name] == want[key][name], (key, name)
        assert got[key]["sum"] == pytest.approx(want[key]["sum"]), key
    assert any("late" in r["kinds"] for r in rows), "late samples came as late rows of closed windows"
    windows = late.store.read(GOLD_METRIC_WINDOWS).where("kind = 'late'").count()
    assert windows > 0 and n_late > 0
    assert dropped_late(late, "g") == 0


def test_a_repeat_of_a_sample_counted_in_a_closed_pane_is_not_forwarded(spark: SparkSession, tmp_path: Path) -> None:
    """Bronze holds a sample once within the receiver's horizon; one resent after it (or landed by
    another writer) comes to silver late. Here the first 2 minutes are landed on time except every
    third sample, then all of those 2 minutes again (with other values for half the repeats): the
    answer is the on-time one, each sample counted once, and the repeats are counted apart."""
    on_time, _ = late_scenario(spark, tmp_path / "on-time", "forward", on_time=True)
    ctx = make_ctx(spark, tmp_path / "repeats", [late_agg("forward")])
    samples, early = gauges()
    held_back = early[::3]
    land(ctx, [s for s in samples if s not in held_back])
    step(ctx)
    again = [s for s in early if s not in held_back]
    repeats = [(labels, t, v if i % 2 else v + 1) for i, (labels, t, v) in enumerate(again)]
    land(ctx, held_back + repeats)
    passes.silver_metric_panes(ctx)
    figures = ctx.store.read(PIPELINE_EVENTS).where("job = 'silver.metric_panes'").orderBy("ended_at").collect()[-1]
    assert figures["metrics"]["g.late_repeats"] == len(repeats)
    assert figures["metrics"]["g.late_forward"] == len(held_back)
    passes.gold_metric_windows(ctx)
    step(ctx, drain=True)
    want = comparable(query(on_time, "g", group_by=["zone"], include_open=False))
    got = comparable(query(ctx, "g", group_by=["zone"], include_open=False))
    assert got.keys() == want.keys()
    for key in want:
        for name in ("count", "min", "max", "distinct", "top", "frequency_total", "q0.5", "q0.9"):
            assert got[key][name] == want[key][name], (key, name)
        assert got[key]["sum"] == pytest.approx(want[key]["sum"]), key


def test_drop_policy_counts_what_it_dropped(spark: SparkSession, tmp_path: Path) -> None:
    on_time, _ = late_scenario(spark, tmp_path / "on-time", "drop", on_time=True)
    late, n_late = late_scenario(spark, tmp_path / "late", "drop", on_time=False)
    assert dropped_late(late, "g") == n_late
    total = sum(r["count"] for r in query(on_time, "g", group_by=[], include_open=False))
    kept = sum(r["count"] for r in query(late, "g", group_by=[], include_open=False))
    # Each sample is in two windows (2m windows, 1m slide).
    assert total - kept == 2 * n_late
    assert late.store.read(GOLD_METRIC_WINDOWS).where("kind = 'late'").count() == 0


def test_a_rerun_changes_nothing_and_open_windows_show_before_they_close(spark: SparkSession, tmp_path: Path) -> None:
    # Sliding: a pane is final before the later windows holding it close.
    ctx = make_ctx(spark, tmp_path / "lake", [{**CPU, "name": "cpu", "window": 120, "slide": 30}])
    land(ctx, counters(seed=1, minutes=5))
    step(ctx)
    before = ctx.store.read(GOLD_METRIC_WINDOWS).count()
    step(ctx)
    assert ctx.store.read(GOLD_METRIC_WINDOWS).count() == before
    kinds = {k for r in query(ctx, "cpu", group_by=["mode"]) for k in r["kinds"]}
    assert kinds == {"window", "open"}
    assert {k for r in query(ctx, "cpu", group_by=["mode"], include_open=False) for k in r["kinds"]} == {"window"}


def test_raw_aggregations_keep_every_sample_as_a_point(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path / "lake", [{"name": "raw", "selector": "cpu_total", "raw": True}])
    samples = counters(seed=2, minutes=1)
    land(ctx, samples + samples[:5])  # a resent request counts once
    step(ctx)
    rows = query(ctx, "raw")
    assert len(rows) == len(samples)
    assert all(r["window_start"] == r["window_end"] and r["count"] == 1 for r in rows)


def test_count_min_sketches_merge_by_adding_counters(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a",), ("b",), ("a",)], ["x"])
    one = df.selectExpr("count_min_sketch(x, 0.01d, 0.9d, 42) AS s").first()["s"]
    both = merge_cms([one, None, one])
    assert both is not None
    assert cms_estimate(both, ["a", "b", "c"]) == [4, 2, 0]
    other = spark.createDataFrame([("a",)], ["x"]).selectExpr("count_min_sketch(x, 0.1d, 0.9d, 1) AS s").first()["s"]
    with pytest.raises(ValueError, match="different shape or seeds"):
        merge_cms([one, other])


def test_selectors_match_as_prometheus_does(spark: SparkSession) -> None:
    from silver.selectors import parse_selector

    rows = [
        ("up", {"job": "node", "env": "prod"}),
        ("up", {"job": "nodes"}),
        ("up", {"job": "api", "env": "dev"}),
        ("down", {"job": "node"}),
    ]
    df = spark.createDataFrame(rows, "metric_name string, labels map<string,string>")

    def jobs_of(selector: str) -> list[str]:
        return sorted(r["labels"]["job"] for r in df.where(parse_selector(selector).sql()).collect())

    assert jobs_of("up") == ["api", "node", "nodes"]
    assert jobs_of('up{job="node"}') == ["node"]
    assert jobs_of('up{job=~"node"}') == ["node"], "regexes are anchored"
    assert jobs_of('up{job=~"node.*"}') == ["node", "nodes"]
    assert jobs_of('up{job!~"node.*"}') == ["api"]
    assert jobs_of('up{env=""}') == ["nodes"], "a missing label matches the empty string"
    assert jobs_of('up{env!="", job!="api"}') == ["node"]
    assert jobs_of('{__name__="down"}') == ["node"]
    assert jobs_of('up{job="it\'s"}') == []
    assert jobs_of('{__name__=~"up|down", job="node"}') == ["node", "node"]


def test_samples_for_windows_a_drain_closed_are_late(spark: SparkSession, tmp_path: Path) -> None:
    """After a drain (end of a backfill) closed everything, a straggler is late, not a lost pane."""
    agg = {"name": "g", "selector": "gauge", "window": "1m", "accumulators": ["count", "sum"], "late": "forward"}
    ctx = make_ctx(spark, tmp_path / "lake", [agg])
    start = int(T0.timestamp() * MS)
    labels = (("__name__", "gauge"), ("host", "a"))
    land(ctx, [(labels, start + i * 10_000, 1.0) for i in range(30)])  # 5 minutes
    step(ctx, drain=True)
    land(ctx, [(labels, start + 125_000, 5.0)])  # inside the third minute, already closed
    step(ctx)
    rows = {r["window_start"]: r for r in query(ctx, "g", group_by=[], include_open=False)}
    third = rows[datetime.fromtimestamp((start + 120_000) / MS, UTC)]
    assert (third["count"], third["sum"], third["kinds"]) == (7, 11.0, ["late", "window"])


def test_sketch_estimates_match_spark_s_own_count_min_sketch(spark: SparkSession) -> None:
    """The driver-side estimate is Spark's: the JVM's CountMinSketch (an independent
    implementation, reached here through py4j, which the pipeline itself never uses) gives the
    same count for strings of every length mod 4, non-ASCII and empty ones included."""
    rng = random.Random(7)
    alphabet = "abcxyz019 /é漢🙂"
    words = ["", "a", "é", "🙂"] + ["".join(rng.choices(alphabet, k=rng.randint(1, 11))) for _ in range(300)]
    data = [(w,) for w in words for _ in range(1 + len(w) % 3)]
    blob = spark.createDataFrame(data, ["x"]).selectExpr("count_min_sketch(x, 0.05d, 0.9d, 3) AS s").first()["s"]
    jvm = spark.sparkContext._jvm
    sketch = jvm.org.apache.spark.util.sketch.CountMinSketch.readFrom(bytearray(blob))
    probes = [*words, "never seen", "ünseen"]
    assert cms_estimate(blob, probes) == [int(sketch.estimateCount(w)) for w in probes]
