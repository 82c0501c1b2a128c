"""The demo's metrics section: node-exporter-like samples, two aggregations, their answers.

The samples stand for what Prometheus would remote-write from 4 hosts over an hour (15 s scrapes):
``node_cpu_seconds_total`` per cpu and mode (one host restarts half-way, so its counters reset)
and ``http_request_duration_seconds`` per path. They go into ``bronze/samples`` through the
receiver's own row builder, once (an app transaction), so a second demo run changes nothing.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from pipelines.app.metric_queries import dropped_late, query
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_SAMPLES, GOLD_METRIC_WINDOWS, SILVER_METRIC_PANES
from pipelines.sources.remote_write_rows import samples_table
from pipelines.sources.remote_write_series import Series, from_series
from pipelines.storage import AppTxn
from silver.config import AggregationSettings

START = datetime(2024, 6, 1, tzinfo=UTC)
HOSTS = ("web-1", "web-2", "web-3", "db-1")
MODES = {"idle": 0.70, "user": 0.20, "system": 0.08, "iowait": 0.02}
PATHS = ("/", "/login", "/search", "/api/items", "/api/cart", "/checkout", "/static/app.js")
DEMO_APP = "demo/samples"

AGGREGATIONS = [
    AggregationSettings(
        name="cpu_by_mode",
        selector='node_cpu_seconds_total{mode!="iowait"}',
        window=timedelta(minutes=5),
        slide=timedelta(minutes=1),
        accumulators=["increase", "count"],
        grouping_labels=["mode"],
        allowed_lateness=timedelta(seconds=30),
    ),
    AggregationSettings(
        name="http_latency",
        selector="http_request_duration_seconds",
        window=timedelta(minutes=10),
        accumulators=["count", "max", "quantiles", "distinct", "frequency"],
        rollup_labels=["instance"],
        aggregated_labels=["path"],
        late="forward",
    ),
]


def demo_series(seed: int = 3, minutes: int = 60) -> list[Series]:
    rng = random.Random(seed)
    steps = minutes * 4
    t0 = int(START.timestamp() * 1000)
    times = [t0 + i * 15_000 for i in range(steps)]
    out = []
    for host in HOSTS:
        for cpu in ("0", "1"):
            for mode, share in MODES.items():
                value, values = rng.uniform(1e4, 1e5), []
                for i in range(steps):
                    if host == "web-2" and i == steps // 2:
                        value = 0.0  # the host restarted: its counters start again
                    value += 15 * share * rng.uniform(0.5, 1.5)
                    values.append(round(value, 2))
                labels = (("__name__", "node_cpu_seconds_total"), ("cpu", cpu), ("instance", host), ("mode", mode))
                out.append(Series(labels, times, values))
        for path in PATHS:
            base = 0.02 if path.startswith("/static") else 0.15
            route = (("__name__", "http_request_duration_seconds"), ("instance", host), ("path", path))
            hits = [t for t in times if rng.random() < (0.9 if path in ("/", "/api/items") else 0.4)]
            out.append(Series(route, hits, [rng.lognormvariate(0, 0.6) * base for _ in hits]))
    return out


def prepare_metrics(ctx: Context) -> Path | None:
    """The demo's aggregations (unless settings name some; then None) and its samples, landed once."""
    config = None
    if not ctx.settings.metrics.aggregations:
        ctx.settings.metrics.aggregations = list(AGGREGATIONS)
        # The demo's aggregations as a config file, so `medallion query` can ask about them later.
        config = Path(ctx.settings.lake_root) / "_landing" / "metrics.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        aggs = [a.model_dump(mode="json", exclude_defaults=True) for a in AGGREGATIONS]
        config.write_text(yaml.safe_dump({"metrics": {"aggregations": aggs}}, sort_keys=False))
    ctx.store.ensure(BRONZE_SAMPLES)
    if ctx.store.txn_version(BRONZE_SAMPLES, DEMO_APP) is None:
        table = samples_table(from_series(demo_series()), "prometheus", "demo", START + timedelta(hours=1))
        ctx.store.append(BRONZE_SAMPLES, table, [AppTxn(DEMO_APP, 1)])
        ctx.say(f"bronze: landed {table.num_rows:,} remote-write samples")
    return config


def metrics_summary(ctx: Context, config: Path | None) -> dict[str, Any]:
    """What the metric flows made of the samples, and two queries' answers."""
    out: dict[str, Any] = {
        "samples": ctx.store.stats(BRONZE_SAMPLES).rows,
        "panes": ctx.store.stats(SILVER_METRIC_PANES).rows,
        "windows": ctx.store.stats(GOLD_METRIC_WINDOWS).rows,
        "aggregations": [a.name for a in ctx.settings.metrics.aggregations],
        "config": str(config) if config else None,
    }
    names = set(out["aggregations"])
    if "cpu_by_mode" in names:
        rows = query(ctx, "cpu_by_mode", group_by=["mode"], include_open=False)
        # The newest window the samples cover whole (drained windows at the end hold fewer panes).
        full = max((r["count"] for r in rows), default=0)
        last = max((r["window_end"] for r in rows if r["count"] == full), default=None)
        out["cpu_rate_by_mode"] = {r["mode"]: round(r["rate"], 3) for r in rows if r["window_end"] == last}
        out["cpu_window"] = str(last)
        out["cpu_dropped_late"] = dropped_late(ctx, "cpu_by_mode")
    if "http_latency" in names:
        rows = query(ctx, "http_latency", group_by=[], quantiles=(0.5, 0.99), top=3, include_open=False)
        out["http_latency"] = [
            {
                "window_start": str(r["window_start"]),
                "requests": r["count"],
                "p50_ms": round(1000 * r["q0.5"], 1),
                "p99_ms": round(1000 * r["q0.99"], 1),
                "distinct_paths": r["distinct"],
                "top_paths": [f"{p} ({n:,})" for p, n in r["top"]],
            }
            for r in rows
        ]
    return out
