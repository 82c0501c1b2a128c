"""Backfills of silver page changes: the windows of a range made again from bronze under the rules
in force (a changed window, mode or horizon), with the changes that landed after their window had
closed (dropped as stale then) counted in.

A page's windows are its own (staggered: one opens at the page's first change no open window
covers), so they cross any range's edges, and windows made again can open at other times than the
ones silver holds. A backfill of [T1, T2) therefore works page by page, between two edges no
window of the page crosses, as silver holds them:

- ``_lo``: T1, or the end of the page's window that opens before T1 and reaches past it (that
  window stays as it is, its changes with it);
- ``_up``: the end of the page's last window that opens in the range (T2 where none reaches past
  it), but never past the start of the page's first window from T2 on that silver holds or that is
  still open (those stay as they are).

The page's changes in [``_lo``, ``_up``) are made into windows again, and rule 0 (stale) starts
from the greatest change silver emitted for the page before T1. Every window made again opens in
[T1, the range's replace end), the latest end of a window that opens in the range: the replace
holds the windows that open there; the rows it holds but does not make again are written again as
they were (:func:`kept_rows`).

What a backfill reads, writes and in which order is the edge's
(:mod:`pipelines.runtime.backfill_page_changes`); this module says which rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from silver.backfill import LANDED_ORDER
from silver.dedup import first_copies, mark_repeats
from silver.page_changes import (
    EVENT_COLUMNS,
    KEY,
    LAST_REV,
    LAST_TIME,
    WINDOW_END,
    WINDOW_START,
    apply_merge_rules,
    assign_windows,
    mark_stale,
)

LO, UP = "_lo", "_up"
#: What tells one silver page-change row from another in a backfill's figures.
ROW_KEY = (*KEY, WINDOW_START, WINDOW_END, "rev_id", "event_time", "action", "merged_count", "meta_id")


def replace_end(first: datetime, end: datetime) -> Callable[[DataFrame], DataFrame]:
    """Silver page changes -> one row, ``end``: the latest end of a window that opens in
    [``first``, ``end``), or ``end`` where none reaches past it."""

    def transform(rows: DataFrame) -> DataFrame:
        opens = F.col(WINDOW_START)
        latest = F.max(F.when((opens >= F.lit(first)) & (opens < F.lit(end)), F.col(WINDOW_END)))
        return rows.agg(F.greatest(F.coalesce(latest, F.lit(end)), F.lit(end)).alias("end"))

    return transform


def page_edges(first: datetime, end: datetime, open_windows: DataFrame) -> Callable[[DataFrame], DataFrame]:
    """Silver's page-change rows near the range (every window that ends after ``first`` and opens
    before the replace end) -> per page, the edges of the changes made again (``_lo``, ``_up``; see
    the module). ``open_windows``: the windows still open (``KEY``, ``window_start``), which the
    caller has checked all open at or after ``end``. A page not listed has edges [first, end)."""

    def transform(near: DataFrame) -> DataFrame:
        opens = F.col(WINDOW_START)
        before, inside = opens < F.lit(first), (opens >= F.lit(first)) & (opens < F.lit(end))
        held = near.groupBy(*KEY).agg(
            F.max(F.when(before, F.col(WINDOW_END))).alias("_before_end"),
            F.max(F.when(inside, F.col(WINDOW_END))).alias("_inside_end"),
            F.min(F.when(opens >= F.lit(end), opens)).alias("_next"),
        )
        still_open = open_windows.groupBy(*KEY).agg(F.min(WINDOW_START).alias("_open"))
        edges = held.join(still_open, list(KEY), "full_outer")
        reach = F.greatest(F.coalesce(F.col("_inside_end"), F.lit(end)), F.lit(end))
        return edges.select(
            *KEY,
            F.greatest(F.coalesce(F.col("_before_end"), F.lit(first)), F.lit(first)).alias(LO),
            F.least(reach, F.coalesce(F.col("_next"), reach), F.coalesce(F.col("_open"), reach)).alias(UP),
        )

    return transform


def last_before(rows: DataFrame) -> DataFrame:
    """Silver's page-change rows before a range -> the greatest change emitted per page
    (:data:`silver.page_changes.LAST_EMITTED_SCHEMA`): where rule 0 starts from."""
    last = F.max(F.struct(F.col("rev_id").alias("r"), F.col("event_time").alias("t"))).alias("_p")
    return rows.groupBy(*KEY).agg(last).select(*KEY, F.col("_p.r").alias(LAST_REV), F.col("_p.t").alias(LAST_TIME))


def between_edges(edges: DataFrame, first: datetime, end: datetime) -> Callable[[DataFrame], DataFrame]:
    """Bronze's page changes of the range and past it up to the replace end -> those between their
    page's edges (``edges``, :func:`page_edges`; a page not listed: [``first``, ``end``)), with
    its page's edges (``_from``, ``_to``)."""

    def transform(rows: DataFrame) -> DataFrame:
        bounded = rows.join(edges, list(KEY), "left").select(
            *rows.columns,
            F.coalesce(F.col(LO), F.lit(first)).alias("_from"),
            F.coalesce(F.col(UP), F.lit(end)).alias("_to"),
        )
        inside = (F.col("event_time") >= F.col("_from")) & (F.col("event_time") < F.col("_to"))
        return bounded.where(inside)

    return transform


def made_again(
    emitted_before: DataFrame, mode: str, width: timedelta, horizon: timedelta
) -> Callable[[DataFrame], DataFrame]:
    """Bronze's page changes between their page's edges (:func:`between_edges`) -> silver's rows
    for them under ``mode``, ``width`` and ``horizon`` (of exact repeats of a ``meta.id``, the
    first copy in :data:`~silver.backfill.LANDED_ORDER` is kept; 0: every copy), rule 0 starting
    from ``emitted_before`` (:func:`last_before`)."""

    def transform(changes: DataFrame) -> DataFrame:
        if horizon:
            changes = first_copies(
                changes.transform(mark_repeats(None, horizon, order=LANDED_ORDER, identity=("meta_id",)))
            )
        # A window is cut at its page's edges: a tumbling window that holds the page's first change
        # opens at the lower edge, not before it, and the last window ends at the upper edge where
        # the window silver keeps after it opens (the changes past an edge are that window's).
        windowed = (
            changes.select(*EVENT_COLUMNS, "_from", "_to")
            .transform(assign_windows(mode, width))
            .withColumn(WINDOW_START, F.greatest(F.col(WINDOW_START), F.col("_from")))
            .withColumn(WINDOW_END, F.least(F.col(WINDOW_END), F.col("_to")))
            .drop("_from", "_to")
        )
        marked = windowed.transform(mark_stale(emitted_before))
        return marked.where(~F.col("_stale")).drop("_stale").transform(apply_merge_rules())

    return transform


def kept_rows(edges: DataFrame) -> Callable[[DataFrame], DataFrame]:
    """Silver's rows in the replace's condition -> those a backfill does not make again (a window
    outside its page's edges), to be written again as they were."""

    def transform(held: DataFrame) -> DataFrame:
        opens = F.col(WINDOW_START)
        outside = F.col(LO).isNull() | (opens < F.col(LO)) | (opens >= F.col(UP))
        return held.join(edges, list(KEY), "left").where(outside).drop(LO, UP)

    return transform
