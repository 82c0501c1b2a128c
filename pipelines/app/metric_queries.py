"""Queries over precomputed metric windows: ``medallion query`` and the Python API.

``query(ctx, "cpu", group_by=["mode"], start=..., end=...)`` merges, per window, every stored row
of the range (closed windows, forwarded late rows, raw rows) and, for windows not closed yet, the
final panes so far (shown as ``open``), then evaluates each accumulator: quantiles from the merged
KLL sketch (never an average of quantiles), distinct counts from the HLL union, top values ranked
by the merged count-min sketch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import functions as F

from gold.metric_windows import WINDOW_KEY, answer, merged, panes_after, windows_of
from pipelines.errors import InputError
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_METRIC_WINDOWS, SILVER_METRIC_PANES, SILVER_METRIC_STATE


def query(
    ctx: Context,
    aggregation: str,
    group_by: Sequence[str] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99),
    top: int = 5,
    include_open: bool = True,
) -> list[dict[str, Any]]:
    """One row per window (and group): ``group_by`` None keeps each key, [] merges every key."""
    agg = ctx.settings.metrics.get(aggregation)
    bad = [q for q in quantiles if not 0 <= q <= 1]
    if bad:
        raise InputError(f"quantiles must be between 0 and 1, got {bad}")
    if start is not None and end is not None and end <= start:
        raise InputError(f"--to ({end}) must be after --from ({start})")
    if group_by:
        outside = (
            [g for g in group_by if g not in agg.grouping_labels]
            if agg.grouping_labels is not None
            else [g for g in group_by if g in ("__name__", *agg.rollup_labels, *agg.aggregated_labels)]
        )
        if outside:
            raise InputError(
                f"{aggregation}: cannot group by {outside}: the stored key has "
                + (
                    f"only {agg.grouping_labels}"
                    if agg.grouping_labels is not None
                    else "no rolled-up or aggregated labels"
                )
            )
    for spec in (GOLD_METRIC_WINDOWS, SILVER_METRIC_PANES):
        ctx.store.ensure(spec)
    where = f"aggregation = '{aggregation}'"
    rows = ctx.store.read(GOLD_METRIC_WINDOWS, where=where).drop("closed_through")
    if include_open and not agg.raw:
        closed = rows.where("kind = 'window'").agg(F.max("window_end").alias("c")).first()
        through = closed["c"] if closed else None
        panes = ctx.store.read(SILVER_METRIC_PANES, where=where)
        if through is not None:
            panes = panes.where(panes_after(through, agg))
        candidates = windows_of(panes, agg)
        if through is not None:
            candidates = candidates.where(F.col("window_end") > F.lit(through))
        opened = merged(candidates, WINDOW_KEY, agg.top_candidates).withColumn("kind", F.lit("open"))
        rows = rows.withColumn("frequency", F.array("frequency")).unionByName(opened)
    else:
        rows = rows.withColumn("frequency", F.array("frequency"))
    if start is not None:
        rows = rows.where(F.col("window_start") >= F.lit(start))
    if end is not None:
        rows = rows.where(F.col("window_end") <= F.lit(end))
    return answer(ctx.spark, agg, rows, group_by, quantiles, top)


def dropped_late(ctx: Context, aggregation: str) -> int:
    """Samples the aggregation has dropped as late so far (``late: drop``)."""
    if not ctx.store.exists(SILVER_METRIC_STATE):
        return 0
    row = (
        ctx.store.read(SILVER_METRIC_STATE, where=f"kind = 'progress' AND aggregation = '{aggregation}'")
        .select("dropped")
        .first()
    )
    return int(row["dropped"] or 0) if row else 0
