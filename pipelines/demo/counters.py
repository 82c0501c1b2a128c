"""The demo's counters: page views per path and autocaptures per host, on the landed events.

Without a registry in the settings, the demo writes this one to ``<lake>/_landing/counters.yaml``
and uses it, so ``medallion counters show`` can read the demo's counters afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from pipelines.app.counter_queries import show
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import COUNTER_EXPORTS, GOLD_COUNTER_MILESTONES, GOLD_COUNTER_PARTIALS, GOLD_COUNTERS

REGISTRY = """\
counters:
  - name: pageviews_by_path
    event: $pageview
    entity: $pathname
    tiers:
      - {below: 10, interval: 0s}       # new paths show up on every run
      - {below: 10000, interval: 1m}
      - {interval: 5m}                  # hot paths are batched
    milestones: [10, 100, 1000, 10000]
  - name: autocaptures_by_host
    event: $autocapture
    where: {$event_type: click}
    entity: $host
    milestones: [10, 100, 1000]
"""


def prepare_counters(ctx: Context) -> Path | None:
    """The demo's counter registry, unless settings name one: the file it wrote, or None."""
    if ctx.settings.counters.registry is not None:
        return None
    registry = Path(ctx.settings.lake_root) / "_landing" / "counters.yaml"
    registry.parent.mkdir(parents=True, exist_ok=True)
    registry.write_text(REGISTRY)
    ctx.settings.counters.registry = registry
    return registry


def counters_summary(ctx: Context, registry: Path | None) -> dict[str, Any]:
    """What the counters flows made of silver/events: increments, writes, milestones, the top."""
    increments = ctx.store.read(GOLD_COUNTER_PARTIALS).agg(F.coalesce(F.sum("count"), F.lit(0))).first()
    writes = ctx.store.read_changes(GOLD_COUNTERS, 0).where("_change_type IN ('insert', 'update_postimage')").count()
    n_in = int(increments[0]) if increments else 0
    exported = ctx.store.read(COUNTER_EXPORTS).agg(F.coalesce(F.sum("rows"), F.lit(0))).first()
    return {
        "registry": str(ctx.settings.counters.registry),
        "written_registry": registry is not None,
        "increments": n_in,
        "counter_writes": writes,
        "clickhouse_rows": int(exported[0]) if exported else 0,
        "increments_per_write": round(n_in / writes, 1) if writes else 0.0,
        "milestones": ctx.store.stats(GOLD_COUNTER_MILESTONES).rows,
        "counters": {name: show(ctx, name, top=5) for name in ("pageviews_by_path", "autocaptures_by_host")}
        if registry is not None
        else {},
    }
