"""Reading counters: ``medallion counters show`` and the Python API."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from pipelines.config.layers import counter, counter_registry
from pipelines.errors import SettingsError
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_COUNTER_MILESTONES, GOLD_COUNTER_PARTIALS, GOLD_COUNTERS


def show(ctx: Context, name: str, top: int = 10) -> dict[str, Any]:
    """The ``top`` entities of counter ``name`` by total, with milestones and pending increments."""
    registry = counter_registry(ctx.settings)
    if registry is None:
        raise SettingsError(["no counter registry configured: set MEDALLION_COUNTERS__REGISTRY to a YAML file"])
    found = counter(registry, name)
    for spec in (GOLD_COUNTERS, GOLD_COUNTER_MILESTONES, GOLD_COUNTER_PARTIALS):
        ctx.store.ensure(spec)
    where = f"counter = '{name}'"
    rows = ctx.store.read(GOLD_COUNTERS, where=where)
    summary = rows.agg(F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("total"), F.lit(0)).alias("sum")).first()
    best = rows.orderBy(F.col("total").desc(), "entity").limit(top)
    pending = (
        ctx.store.read(GOLD_COUNTER_PARTIALS, where=where)
        .join(best.select("entity", "flushed_seq"), "entity")
        .where(F.col("seq") > F.col("flushed_seq"))
        .groupBy("entity")
        .agg(F.sum("count").alias("pending"))
    )
    marks = (
        ctx.store.read(GOLD_COUNTER_MILESTONES, where=where)
        .groupBy("entity")
        .agg(F.array_sort(F.collect_list("threshold")).alias("milestones"))
    )
    joined = best.join(pending, "entity", "left").join(marks, "entity", "left").orderBy(F.col("total").desc(), "entity")
    tiers = ", ".join(
        (f"< {t.below:,}: " if t.below else "above: ") + (f"every {t.interval}" if t.interval else "every run")
        for t in found.tiers
    )
    return {
        "counter": name,
        "entities": int(summary["n"]) if summary else 0,
        "total": int(summary["sum"]) if summary else 0,
        "tiers": tiers,
        "top": [
            {
                "entity": r["entity"],
                "total": r["total"],
                "pending": int(r["pending"] or 0),
                "flushes": r["flushes"],
                "flushed_at": r["flushed_at"].isoformat() if r["flushed_at"] else None,
                "milestones": list(r["milestones"] or []),
            }
            for r in joined.collect()
        ],
    }
