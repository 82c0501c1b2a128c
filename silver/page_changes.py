"""Page-change reordering and dedup per ``(wiki_id, page_id)`` in event-time windows.

Windows:
- ``tumbling``: aligned to multiples of the width W.
- ``staggered``: a key's window opens at the event time of its first event not covered by an open
  window, and covers ``[open, open + W)``. Computed natively: per key, the sorted event times are
  folded with ``aggregate`` into the list of window openings.

Merge rules, applied to the events of one window of one key:
0. stale: an event whose ``(rev_id, event_time)`` is not greater than the last one emitted for its
   key from an earlier window is dropped and counted;
1. per ``rev_id`` keep only the event with the greatest event time; on a tie a delete wins;
2. order the survivors by ``(rev_id, event_time)``;
3. no delete among them: emit the last survivor only;
4. otherwise let ``d`` be the last delete: emit ``d``, then the last survivor if it comes after ``d``.

``merged_count`` says how many input events an emitted row stands for; the emitted rows of a window
sum to the window's non-stale events.

Incremental runs (:func:`dedup_run`): events of windows the watermark has not closed stay in a
buffer; each run re-assigns windows over buffered plus new events, emits the closed windows and
keeps the last emitted ``(rev_id, event_time)`` per key. The last emitted position after a window
is the greatest position among its non-stale events, so rule 0 for a window reduces to "not greater
than the running maximum over the key's earlier windows (and the state)", a window function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from bronze.primitives import micros, plus, window_start

KEY = ("wiki_id", "page_id")
WINDOW_START = "window_start"
WINDOW_END = "window_end"
DELETE = "delete"

SILVER_PAGE_CHANGES_SCHEMA = StructType(
    [
        StructField("wiki_id", StringType()),
        StructField("page_id", LongType()),
        StructField("rev_id", LongType()),
        StructField("event_time", TimestampType()),
        StructField("page_change_kind", StringType()),
        StructField("action", StringType()),  # delete | update
        StructField(WINDOW_START, TimestampType()),
        StructField(WINDOW_END, TimestampType()),
        StructField("merged_count", IntegerType()),
        StructField("meta_id", StringType()),
        StructField("raw", StringType()),
    ]
)
SILVER_PAGE_CHANGES_COLUMNS = [f.name for f in SILVER_PAGE_CHANGES_SCHEMA.fields]

STATE_KIND = "kind"  # event (buffered, window still open) | key (last emitted) | emit (outbox) | progress
#: The dedup state: one table so a run replaces it in one commit (see :func:`next_state`).
PAGE_CHANGE_STATE_SCHEMA = StructType(
    [
        StructField(STATE_KIND, StringType()),
        *SILVER_PAGE_CHANGES_SCHEMA.fields,
        StructField("max_event_time", TimestampType()),
        StructField("bronze_version", LongType()),
    ]
)


def action_of(kind: Column) -> Column:
    """``delete`` for a delete, ``update`` for every other change kind."""
    return F.when(kind == DELETE, F.lit(DELETE)).otherwise(F.lit("update"))


def assign_windows(mode: str, width: timedelta) -> Callable[[DataFrame], DataFrame]:
    """Adds ``window_start``/``window_end`` per event, tumbling or staggered per key."""
    w = micros(width)
    if w <= 0:
        raise ValueError("window width must be positive")

    def tumbling(df: DataFrame) -> DataFrame:
        return df.withColumn(WINDOW_START, window_start(F.col("event_time"), width)).withColumn(
            WINDOW_END, plus(F.col(WINDOW_START), width)
        )

    def staggered(df: DataFrame) -> DataFrame:
        times = df.groupBy(*KEY).agg(F.array_sort(F.collect_set(F.unix_micros("event_time"))).alias("_ts"))
        opens = times.select(
            *KEY,
            F.aggregate(
                "_ts",
                F.array().cast("array<bigint>"),
                lambda acc, t: F.when(
                    (F.size(acc) == 0) | (t >= F.element_at(acc, -1) + F.lit(w)), F.array_append(acc, t)
                ).otherwise(acc),
            ).alias("_opens"),
        ).select(*KEY, F.explode("_opens").alias("_open"))
        # Each event belongs to the latest opening at or before it (always within W of it). A sorted
        # union and a running last() finds it in one pass, where a join on the key would pair every
        # event with every opening of a busy page.
        marks = opens.select(*KEY, F.col("_open").alias("_t"), F.col("_open"), F.lit(0).alias("_is_event"))
        tagged = df.select(
            "*",
            F.unix_micros("event_time").alias("_t"),
            F.lit(None).cast("bigint").alias("_open"),
            F.lit(1).alias("_is_event"),
        )
        ordered = Window.partitionBy(*KEY).orderBy("_t", "_is_event").rowsBetween(Window.unboundedPreceding, 0)
        assigned = (
            tagged.unionByName(marks, allowMissingColumns=True)
            .withColumn("_open", F.last("_open", ignorenulls=True).over(ordered))
            .where(F.col("_is_event") == 1)
        )
        return (
            assigned.withColumn(WINDOW_START, F.timestamp_micros("_open"))
            .withColumn(WINDOW_END, F.timestamp_micros(F.col("_open") + F.lit(w)))
            .drop("_open", "_t", "_is_event")
        )

    if mode == "tumbling":
        return tumbling
    if mode == "staggered":
        return staggered
    raise ValueError(f"unknown window mode {mode!r}: use staggered or tumbling")


POSITION = "_pos"
LAST_REV = "last_rev_id"
LAST_TIME = "last_event_time"

#: Last emitted position per key: the state rule 0 needs across runs.
LAST_EMITTED_SCHEMA = StructType(
    [
        StructField("wiki_id", StringType()),
        StructField("page_id", LongType()),
        StructField(LAST_REV, LongType()),
        StructField(LAST_TIME, TimestampType()),
    ]
)
#: Input of a run: bronze page-change columns the rules use, plus what the output carries.
EVENT_COLUMNS = ["wiki_id", "page_id", "rev_id", "event_time", "page_change_kind", "meta_id", "raw"]


def _pos() -> Column:
    return F.struct(F.col("rev_id").alias("r"), F.col("event_time").alias("t"))


def mark_stale(last_emitted: DataFrame) -> Callable[[DataFrame], DataFrame]:
    """Windowed events -> the same with ``_stale`` (rule 0): not greater than the last emitted
    position of an earlier window of the key, from ``last_emitted`` state or this batch.

    Window functions over the key, not a join of per-window figures back to the events: the events
    stay where the window assignment put them (partitioned by the key), so a run shuffles its events
    once (rules 1-4 group by the key and more), and only the state's last positions move to them."""

    def transform(df: DataFrame) -> DataFrame:
        last = last_emitted.select(
            *KEY, F.struct(F.col(LAST_REV).alias("r"), F.col(LAST_TIME).alias("t")).alias("_state_last")
        )
        # The greatest position among the key's events of windows that open before this one.
        earlier = (
            Window.partitionBy(*KEY).orderBy(F.unix_micros(WINDOW_START)).rangeBetween(Window.unboundedPreceding, -1)
        )
        based = df.withColumn("_earlier_max", F.max(_pos()).over(earlier)).join(last, list(KEY), "left")
        base = (
            F.when(F.col("_state_last").isNull(), F.col("_earlier_max"))
            .when(F.col("_earlier_max").isNull(), F.col("_state_last"))
            .otherwise(F.greatest("_state_last", "_earlier_max"))
        )
        stale = base.isNotNull() & (_pos() <= base)
        return based.withColumn("_stale", F.coalesce(stale, F.lit(False))).drop("_earlier_max", "_state_last")

    return transform


def apply_merge_rules() -> Callable[[DataFrame], DataFrame]:
    """Non-stale events with windows assigned -> the rows rules 1-4 emit, with ``merged_count``."""

    def transform(df: DataFrame) -> DataFrame:
        group = [*KEY, WINDOW_START]
        is_delete = (F.col("page_change_kind") == DELETE).cast("int")
        per_rev = Window.partitionBy(*group, "rev_id")
        ranked = (
            df.withColumn("_is_delete", is_delete)
            .withColumn(
                "_rank", F.row_number().over(per_rev.orderBy(F.col("event_time").desc(), F.col("_is_delete").desc()))
            )
            .withColumn("_rev_events", F.count(F.lit(1)).over(per_rev))
        )
        survivors = ranked.where(F.col("_rank") == 1)
        in_window = Window.partitionBy(*group)
        marked = (
            survivors.withColumn(POSITION, _pos())
            .withColumn("_last", F.max(POSITION).over(in_window))
            .withColumn("_last_delete", F.max(F.when(F.col("_is_delete") == 1, F.col(POSITION))).over(in_window))
            .withColumn("_total", F.sum("_rev_events").over(in_window))
            .withColumn(
                "_upto_delete",
                F.sum(F.when(F.col(POSITION) <= F.col("_last_delete"), F.col("_rev_events")).otherwise(0)).over(
                    in_window
                ),
            )
        )
        no_delete = F.col("_last_delete").isNull()
        is_last = F.col(POSITION) == F.col("_last")
        is_d = F.col(POSITION) == F.col("_last_delete")
        merged = (
            F.when(no_delete, F.col("_total"))
            .when(is_d, F.col("_upto_delete"))
            .otherwise(F.col("_total") - F.col("_upto_delete"))
        )
        emitted = marked.where(
            (no_delete & is_last) | is_d | (~no_delete & is_last & (F.col(POSITION) > F.col("_last_delete")))
        )
        return (
            emitted.withColumn("action", action_of(F.col("page_change_kind")))
            .withColumn("merged_count", merged.cast("int"))
            .select(*SILVER_PAGE_CHANGES_COLUMNS)
        )

    return transform


@dataclass
class DedupResult:
    """What one run produces: rows to emit, events to keep buffered, and the new state."""

    #: Every event of the run with its window, whether it is closed (``_closed``) and, for one that
    #: is, whether rule 0 drops it (``_stale``; :func:`window_counts` counts them)
    windowed: DataFrame
    emitted: DataFrame  # silver/page_changes rows of the windows closed in this run
    buffered: DataFrame  # events of windows still open, with their windows
    last_emitted: DataFrame  # LAST_EMITTED_SCHEMA, for every key (old and updated)
    finalized: DataFrame  # events of the closed windows with their ``_stale`` flag


def dedup_run(
    events: DataFrame,
    last_emitted: DataFrame,
    mode: str,
    width: timedelta,
    watermark: datetime | None,
) -> DedupResult:
    """One incremental run over ``events`` (buffered ones plus new ones, EVENT_COLUMNS).

    Windows end at or before ``watermark`` are emitted; ``None`` emits every window (drain).
    """
    windowed = events.select(*EVENT_COLUMNS).transform(assign_windows(mode, width))
    closed = F.lit(True) if watermark is None else F.col(WINDOW_END) <= F.lit(watermark)
    # Rule 0 over every event: a key's closed windows all open before its open ones, so the events
    # of an open window change no closed event's mark (and are marked again when it closes).
    marked = windowed.withColumn("_closed", closed).transform(mark_stale(last_emitted))
    finalized = marked.where("_closed")
    emitted = finalized.where(~F.col("_stale")).transform(apply_merge_rules())
    buffered = marked.where(~F.col("_closed")).drop("_closed", "_stale")
    updates = emitted.groupBy(*KEY).agg(F.max(_pos()).alias("_p"))
    merged_state = (
        last_emitted.join(updates, list(KEY), "full_outer")
        .select(
            *KEY,
            F.when(F.col("_p").isNull(), F.struct(F.col(LAST_REV).alias("r"), F.col(LAST_TIME).alias("t")))
            .when(F.col(LAST_REV).isNull(), F.col("_p"))
            .otherwise(F.greatest(F.col("_p"), F.struct(F.col(LAST_REV).alias("r"), F.col(LAST_TIME).alias("t"))))
            .alias("_last"),
        )
        .select(*KEY, F.col("_last.r").alias(LAST_REV), F.col("_last.t").alias(LAST_TIME))
    )
    return DedupResult(marked, emitted, buffered, merged_state, finalized)


def dedup_page_changes(mode: str, width: timedelta) -> Callable[[DataFrame], DataFrame]:
    """Bronze page-change rows -> deduplicated, ordered rows per key and window (one run, drained)."""

    def transform(df: DataFrame) -> DataFrame:
        empty = df.sparkSession.createDataFrame([], LAST_EMITTED_SCHEMA)
        return dedup_run(df, empty, mode, width, None).emitted

    return transform


# -- state between runs ---------------------------------------------------------------------------
def state_progress(state: DataFrame) -> DataFrame:
    """State rows -> the progress row (none before the first run): bronze version done, newest event time."""
    return state.where(F.col(STATE_KIND) == "progress").select("bronze_version", "max_event_time")


def state_before(state: DataFrame) -> DataFrame:
    """State rows -> one row: the newest event time seen (null before the first run) and how many
    events the state buffers (``buffered``)."""
    kind = F.col(STATE_KIND)
    return state.agg(
        F.max(F.when(kind == "progress", F.col("max_event_time"))).alias("max_event_time"),
        F.count_if(kind == "event").alias("buffered"),
    )


def state_events(state: DataFrame) -> DataFrame:
    """State rows -> the buffered events of windows still open (EVENT_COLUMNS)."""
    return state.where(F.col(STATE_KIND) == "event").select(*EVENT_COLUMNS)


def state_last_emitted(state: DataFrame) -> DataFrame:
    """State rows -> the last emitted position per key (LAST_EMITTED_SCHEMA)."""
    return state.where(F.col(STATE_KIND) == "key").select(
        *KEY, F.col("rev_id").alias(LAST_REV), F.col("event_time").alias(LAST_TIME)
    )


def event_clock(
    max_seen: datetime | None, batch_max: datetime | None, lateness: timedelta, drain: bool
) -> tuple[datetime | None, datetime | None]:
    """(newest event time seen, this batch included; the watermark windows must end by to close).

    The watermark trails the newest event by ``lateness``; a drain closes every window (None).
    """
    newest = max((t for t in (max_seen, batch_max) if t is not None), default=None)
    return newest, None if drain or newest is None else newest - lateness


def window_counts() -> list[Column]:
    """Aggregates of a run's windowed events (:attr:`DedupResult.windowed`) -> the events of closed
    windows (``closed``) and how many of them rule 0 drops (``stale``), the events of open windows
    (``open``, the next state's buffer) and those windows (``windows``)."""
    closed = F.col("_closed")
    return [
        F.count_if(closed).alias("closed"),
        F.count_if(closed & F.col("_stale")).alias("stale"),
        F.count_if(~closed).alias("open"),
        F.count_distinct(F.when(~closed, F.struct(*KEY, WINDOW_START))).alias("windows"),
    ]


def next_state(
    open_events: DataFrame,
    last_emitted: DataFrame,
    emitted: DataFrame,
    max_seen: datetime | None,
    bronze_version: int | None,
) -> DataFrame:
    """The state a run leaves (PAGE_CHANGE_STATE_SCHEMA columns): events of open windows, the last
    emitted position per key, the run's emitted rows as its outbox (``emit``) and the progress row.

    Replaced in one commit, so the buffer, the keys and the outbox of a run are never out of step.
    """
    progress = emitted.sparkSession.createDataFrame(
        [("progress", max_seen, bronze_version)], "kind string, max_event_time timestamp, bronze_version long"
    )
    keys = last_emitted.select(
        F.lit("key").alias(STATE_KIND), *KEY, F.col(LAST_REV).alias("rev_id"), F.col(LAST_TIME).alias("event_time")
    )
    return (
        open_events.withColumn(STATE_KIND, F.lit("event"))
        .unionByName(keys, allowMissingColumns=True)
        .unionByName(emitted.withColumn(STATE_KIND, F.lit("emit")), allowMissingColumns=True)
        .unionByName(progress, allowMissingColumns=True)
    )
