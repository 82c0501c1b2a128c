"""What a backfill costs: one window in the middle of a lake's events counted again, as
``medallion backfill gold`` does it (its export included), on the lake a chain left. The bench
holds the figure at L beside the same at S: a backfill's cost follows its range, not the lake."""

from __future__ import annotations

import statistics
import time
from typing import Any

from pyspark.sql import functions as F

from gold.backfill import window_range
from gold.property_values import WINDOW_START
from pipelines.dev.bench.measure import Bench
from pipelines.runtime.backfill import backfill_gold
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_PROPERTY_VALUES


def one_window_backfill(b: Bench, ctx: Context, repeats: int) -> dict[str, Any]:
    """A 1-window backfill of the lake ``ctx`` holds: median, min and max of ``repeats`` runs after
    a warm-up, and what the lake and the window held."""
    width = ctx.settings.gold.window
    # One row of two values, outside the timing: where the lake's windows are.
    bounds = ctx.store.read(GOLD_PROPERTY_VALUES).agg(F.min(WINDOW_START), F.max(WINDOW_START)).first()
    assert bounds is not None and bounds[0] is not None, "the chain left gold empty"
    low, high = bounds[0].astimezone(), bounds[1].astimezone()  # naive local time, as pyspark collects it
    span = window_range(low + (high - low) / 2, low + (high - low) / 2 + width, width)
    seconds: list[float] = []
    record = None
    for attempt in range(1 + repeats):
        t0 = time.perf_counter()
        record = backfill_gold(ctx, span.first, span.end)
        if attempt:  # the first warms the session up
            seconds.append(round(time.perf_counter() - t0, 3))
        b.say(f"  1-window backfill {span}: {time.perf_counter() - t0:.1f} s")
    assert record is not None
    return {
        "window": str(span),
        "gold_rows": ctx.store.stats(GOLD_PROPERTY_VALUES).rows,
        "tuples": int(record.metrics.get("tuples", 0)),
        "seconds": {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)},
    }


def markdown(result: dict[str, Any]) -> list[str]:
    """The 1-window backfill at the bench's size and, where measured, at S beside it."""
    rows = [(result["size"], result["backfill"])]
    if result.get("backfill_small"):
        rows.insert(0, ("S", result["backfill_small"]))
    small = rows[0][1]["seconds"]["median"] if len(rows) > 1 else None
    lines = [
        "## A 1-window backfill (`medallion backfill gold`, its export included; s)",
        "",
        "| lake | gold rows | window | tuples recounted | median (min-max) | / S |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, r in rows:
        s = r["seconds"]
        ratio = f"{s['median'] / small:.2f}x" if small else "-"
        lines.append(
            f"| {name} | {r['gold_rows']:,} | {r['window']} | {r['tuples']:,} "
            f"| {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | {ratio} |"
        )
    return lines
