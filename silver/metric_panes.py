"""Remote-write samples -> panes: slide-sized slices of each aggregation's windows, summarised.

Every sample lands in exactly one pane: the slice ``[floor(t / slide) * slide, + slide)`` of its
aggregation's key. A window is the merge of its ``window / slide`` panes, so a sliding window costs
no more per sample than a tumbling one (see ``gold/metric_windows``).

A pane is written once, final, when the aggregation's watermark (largest sample time seen minus
``allowed_lateness``) passes its end; until then its samples wait in the job's state, so samples
that arrive out of order within the lateness are summarised exactly as if they had come in order.
A sample whose pane is already final is late: ``drop`` counts and discards it, ``forward`` writes it
as an extra pane row flagged ``late`` that queries merge like any other.

Merge rules (what a pane holds and how panes combine):

- ``sum``, ``count``, ``min``, ``max``: of the sample values; combined by sum, sum, min, max.
- ``increase``: per series, the sum over consecutive samples (in time order) of ``v - prev`` when
  ``v >= prev``, else ``v`` (a counter reset restarts from zero); the pair that straddles a pane
  boundary belongs to the pane of its later sample. Per key it is the sum over the key's series, so
  panes and windows combine by sum and consecutive windows add up to the whole increase.
- ``quantiles``: a KLL sketch of the values (``kll_sketch_agg_double``), merged as a sketch.
- ``distinct``: an HLL sketch of the ``aggregated_labels`` values (``hll_sketch_agg``), unioned.
- ``frequency``: a count-min sketch of the ``aggregated_labels`` values (Spark's
  ``count_min_sketch``), merged by adding its counters, plus the pane's ``top_candidates`` most
  frequent values, whose merged counts rank the candidates for a top-N answer.

Samples repeated with the same series and timestamp (a resent request) count once; NaN samples
(Prometheus's staleness markers) are not aggregated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bronze.primitives import plus, window_start
from silver.config import AggregationSettings
from silver.selectors import parse_selector

CMS_SEED = 42

PANE_FIELDS = [
    StructField("aggregation", StringType()),
    StructField("key", StringType()),  # the output key as Prometheus writes it: a="x",b="y"
    StructField("labels", MapType(StringType(), StringType())),
    StructField("pane_start", TimestampType()),
    StructField("pane_end", TimestampType()),
    StructField("late", BooleanType()),  # a forwarded late row for an already-final pane
    StructField("count", LongType()),
    StructField("sum", DoubleType()),
    StructField("min", DoubleType()),
    StructField("max", DoubleType()),
    StructField("increase", DoubleType()),
    StructField("quantiles", BinaryType()),  # KLL (double)
    StructField("distinct", BinaryType()),  # HLL
    StructField("frequency", BinaryType()),  # count-min
    StructField("top_values", MapType(StringType(), LongType())),
    StructField("watermark", TimestampType()),  # the aggregation's watermark when the pane was written
    StructField("run", LongType()),  # the silver run that wrote it (gold reads panes up to a run)
]
METRIC_PANES_SCHEMA = StructType(PANE_FIELDS)
METRIC_PANE_COLUMNS = [f.name for f in PANE_FIELDS]

SAMPLE_FIELDS = [
    StructField("series_id", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("value", DoubleType()),
    StructField("item", StringType()),  # the aggregated_labels values the keyed sketches count
]
SAMPLE_COLUMNS = ["aggregation", "key", "labels", "pane_start", *(f.name for f in SAMPLE_FIELDS)]
#: The bronze/samples columns a run reads.
INPUT_COLUMNS = ["metric_name", "labels", "series_id", "timestamp", "value"]

# The job's state, one table: kind = sample (waiting for its pane to be final), last (a series'
# newest sample in a final pane, for increase), progress (per aggregation: largest sample time;
# one row without aggregation: bronze version done), pane (the outbox of the run's pane rows).
METRIC_STATE_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        *PANE_FIELDS,
        *SAMPLE_FIELDS,
        StructField("max_seen", TimestampType()),
        StructField("dropped", LongType()),
        StructField("bronze_version", LongType()),
    ]
)


@dataclass(frozen=True)
class PaneRun:
    """One aggregation's step: its pane rows, what stays buffered, and the figures."""

    panes: DataFrame
    buffered: DataFrame  # SAMPLE_COLUMNS
    lasts: DataFrame  # aggregation, series_id, timestamp, value
    late: DataFrame  # SAMPLE_COLUMNS of samples behind the watermark (dropped or forwarded)


def key_labels(agg: AggregationSettings, labels: Column) -> Column:
    """The labels kept in the key: grouping_labels, else every label but the name and the rolled up."""
    if agg.grouping_labels is not None:
        if not agg.grouping_labels:
            return F.create_map().cast(MapType(StringType(), StringType()))
        return F.map_from_arrays(
            F.array(*(F.lit(lbl) for lbl in agg.grouping_labels)),
            F.array(*(F.coalesce(labels[lbl], F.lit("")) for lbl in agg.grouping_labels)),
        )
    dropped = ["__name__", *agg.rollup_labels, *agg.aggregated_labels]
    return F.map_filter(labels, lambda k, _v: ~k.isin(dropped))


def key_string(labels: Column) -> Column:
    """``a="x",b="y"`` with labels in name order: one string to group and show."""
    entries = F.array_sort(F.map_entries(labels))
    return F.array_join(F.transform(entries, lambda e: F.concat(e["key"], F.lit('="'), e["value"], F.lit('"'))), ",")


def select_samples(samples: DataFrame, agg: AggregationSettings) -> DataFrame:
    """bronze/samples rows of this aggregation -> SAMPLE_COLUMNS (pane assigned, key built)."""
    # NaN is how Prometheus marks a series stale, not a value to aggregate.
    selected = samples.where(parse_selector(agg.selector).sql()).where(~F.isnan("value"))
    keyed = selected.withColumn("_key_labels", key_labels(agg, F.col("labels")))
    item = (
        F.concat_ws("|", *(F.coalesce(F.col("labels")[lbl], F.lit("")) for lbl in agg.aggregated_labels))
        if agg.aggregated_labels
        else F.lit(None).cast("string")
    )
    pane = window_start(F.col("timestamp"), agg.slide or agg.window)
    return keyed.select(
        F.lit(agg.name).alias("aggregation"),
        key_string(F.col("_key_labels")).alias("key"),
        F.col("_key_labels").alias("labels"),
        (F.col("timestamp") if agg.raw else pane).alias("pane_start"),
        "series_id",
        "timestamp",
        "value",
        item.alias("item"),
    )


def with_deltas(final: DataFrame, lasts: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Per series in time order: each sample's increase over the one before (reset-aware).

    ``lasts`` seeds each series with its newest sample of an earlier final pane. Returns the final
    samples with ``_delta`` and the new lasts.
    """
    seeds = lasts.select("aggregation", "series_id", "timestamp", "value", F.lit(True).alias("_seed"))
    rows = final.withColumn("_seed", F.lit(False)).unionByName(seeds, allowMissingColumns=True)
    by_series = Window.partitionBy("aggregation", "series_id").orderBy("timestamp")
    prev = F.lag("value").over(by_series)
    delta = F.when(prev.isNull(), 0.0).when(F.col("value") >= prev, F.col("value") - prev).otherwise(F.col("value"))
    rows = rows.withColumn("_delta", delta)
    newest = Window.partitionBy("aggregation", "series_id").orderBy(F.col("timestamp").desc())
    new_lasts = (
        rows.withColumn("_n", F.row_number().over(newest))
        .where("_n = 1")
        .select("aggregation", "series_id", "timestamp", "value")
    )
    return rows.where(~F.col("_seed")).drop("_seed"), new_lasts


def summarise(
    samples: DataFrame, agg: AggregationSettings, late: bool, watermark: datetime | None, run: int
) -> DataFrame:
    """Samples (with ``_delta`` when increase is asked for) -> one pane row per key and pane."""
    acc = set(agg.accumulators)
    group = ["aggregation", "key", "pane_start"]
    null_bin, null_dbl = F.lit(None).cast("binary"), F.lit(None).cast("double")
    aggs = [
        F.first("labels").alias("labels"),
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        (F.sum("_delta") if "increase" in acc else null_dbl).alias("increase"),
        (F.kll_sketch_agg_double("value", agg.kll_k) if "quantiles" in acc else null_bin).alias("quantiles"),
        (F.hll_sketch_agg("item", agg.hll_lg_k) if "distinct" in acc else null_bin).alias("distinct"),
        (
            F.count_min_sketch(F.col("item"), F.lit(agg.cms_eps), F.lit(agg.cms_confidence), F.lit(CMS_SEED))
            if "frequency" in acc
            else null_bin
        ).alias("frequency"),
    ]
    panes = samples.groupBy(*group).agg(*aggs)
    if "frequency" in acc:
        panes = panes.join(top_values(samples, group, agg.top_candidates), group, "left")
    else:
        panes = panes.withColumn("top_values", F.lit(None).cast(MapType(StringType(), LongType())))
    end = F.col("pane_start") if agg.raw else plus(F.col("pane_start"), agg.slide or agg.window)
    return panes.select(
        *(
            {
                "pane_end": end.alias("pane_end"),
                "late": F.lit(late).alias("late"),
                "watermark": F.lit(watermark).cast("timestamp").alias("watermark"),
                "run": F.lit(run).cast("long").alias("run"),
            }.get(c, F.col(c))
            for c in METRIC_PANE_COLUMNS
        )
    )


def top_values(samples: DataFrame, group: list[str], k: int) -> DataFrame:
    """Per group, the ``k`` most frequent items with their exact counts, as a map."""
    counts = samples.groupBy(*group, "item").agg(F.count(F.lit(1)).alias("n"))
    rank = Window.partitionBy(*group).orderBy(F.col("n").desc(), F.col("item"))
    return (
        counts.withColumn("_r", F.row_number().over(rank))
        .where(F.col("_r") <= k)
        .groupBy(*group)
        .agg(F.map_from_entries(F.collect_list(F.struct(F.coalesce("item", F.lit("")), "n"))).alias("top_values"))
    )


def late_condition(agg: AggregationSettings, previous_watermark: datetime | None) -> Column | None:
    """Whether a sample (SAMPLE_COLUMNS) of ``agg`` is late: its pane ended at or before the
    watermark the last run left (None: no run left one, nothing is late)."""
    if agg.raw or previous_watermark is None:
        return None
    return plus(F.col("pane_start"), agg.slide or agg.window) <= F.lit(previous_watermark)


def without_repeats(late: DataFrame, counted: DataFrame) -> DataFrame:
    """Late samples less those whose (series, timestamp) is among ``counted`` (the samples earlier
    runs took: a repeat sent again after its pane was final, which a correction would count twice)."""
    return late.join(counted.select("series_id", "timestamp").distinct(), ["series_id", "timestamp"], "left_anti")


def pane_run(
    agg: AggregationSettings,
    new: DataFrame,
    buffered: DataFrame,
    lasts: DataFrame,
    previous_watermark: datetime | None,
    watermark: datetime | None,
    run: int,
    close_all: bool = False,
    counted: DataFrame | None = None,
) -> PaneRun:
    """One aggregation's step: ``new`` samples (SAMPLE_COLUMNS) against the state it left.

    Samples whose pane ended at or before ``previous_watermark`` are late, less the repeats of
    ``counted`` (:func:`without_repeats`; None: none checked). Panes that end at or before
    ``watermark`` become final; ``close_all`` (draining) makes every pane final, and ``watermark``
    is then what the panes record (far enough to close every window they are in).
    """
    if agg.raw:
        deduped = new.dropDuplicates(["series_id", "timestamp"])
        empty = new.limit(0)
        return PaneRun(summarise(deduped, agg, False, watermark, run), empty, lasts.limit(0), empty)
    pane_end = plus(F.col("pane_start"), agg.slide or agg.window)
    is_late = late_condition(agg, previous_watermark)
    if is_late is not None:
        late, on_time = new.where(is_late), new.where(~is_late)
        if counted is not None:
            late = without_repeats(late, counted)
    else:
        late, on_time = new.limit(0), new
    pending = buffered.unionByName(on_time).dropDuplicates(["aggregation", "series_id", "timestamp"])
    if close_all:
        final, keep = pending, pending.limit(0)
    elif watermark is None:
        final, keep = pending.limit(0), pending
    else:
        final_when = pane_end <= F.lit(watermark)
        final, keep = pending.where(final_when), pending.where(~final_when)
    if "increase" in agg.accumulators:
        final, lasts = with_deltas(final, lasts)
    panes = summarise(final, agg, False, watermark, run)
    if agg.late == "forward":
        forwarded = late.dropDuplicates(["aggregation", "series_id", "timestamp"])
        panes = panes.unionByName(summarise(forwarded, agg, True, watermark, run))
    return PaneRun(panes, keep, lasts, late)


# -- state between runs ---------------------------------------------------------------------------
PROGRESS_ROWS_SCHEMA = "kind string, aggregation string, max_seen timestamp, dropped long, bronze_version long"


def state_progress(state: DataFrame) -> DataFrame:
    """State rows -> the progress rows: one per aggregation, and one without aggregation for bronze."""
    return state.where(F.col("kind") == "progress")


def state_samples(state: DataFrame) -> DataFrame:
    """State rows -> the samples waiting for their pane to be final (SAMPLE_COLUMNS)."""
    return state.where(F.col("kind") == "sample").select(*SAMPLE_COLUMNS)


def state_lasts(state: DataFrame) -> DataFrame:
    """State rows -> each series' newest sample in a final pane (for increase)."""
    return state.where(F.col("kind") == "last").select("aggregation", "series_id", "timestamp", "value")


@dataclass(frozen=True)
class PaneClock:
    """An aggregation's event-time clock in one run."""

    max_seen: datetime | None  # the largest sample time seen, this run's samples included
    previous: datetime | None  # the watermark the last run left: a sample of a pane ending by it is late
    watermark: datetime | None  # max_seen - allowed_lateness
    closes: datetime | None  # panes ending by this are final: the watermark, or a window past max_seen on a drain
    recorded: datetime | None  # the max_seen the state keeps


def pane_clock(
    agg: AggregationSettings, prev_seen: datetime | None, batch_max: datetime | None, drain: bool
) -> PaneClock:
    """The clock of ``agg`` after a run whose samples end at ``batch_max``, from the ``prev_seen`` it kept."""
    max_seen = max((t for t in (prev_seen, batch_max) if t is not None), default=None)
    lateness = agg.allowed_lateness
    watermark = None if max_seen is None else max_seen - lateness
    if max_seen is None:
        closes = recorded = None
    elif drain:
        # Draining made every pane final and closed every window holding one: from now on a sample
        # for them is late, so the recorded clock moves to where that holds.
        closes, recorded = max_seen + agg.window, max_seen + agg.window + lateness
    else:
        closes, recorded = watermark, max_seen
    previous = None if prev_seen is None else prev_seen - lateness
    return PaneClock(max_seen, previous, watermark, closes, recorded)


def progress_row(agg: AggregationSettings, clock: PaneClock, dropped_before: int | None, late: int) -> dict[str, Any]:
    """The progress row of ``agg`` after a run: its clock and the samples dropped as late so far."""
    dropped = (dropped_before or 0) + (late if agg.late == "drop" else 0)
    return {"kind": "progress", "aggregation": agg.name, "max_seen": clock.recorded, "dropped": dropped}


def carried_state(buffered: Sequence[DataFrame], lasts: Sequence[DataFrame]) -> DataFrame:
    """What a run carries to the next, from each aggregation's step: samples of panes not final yet
    (``sample``) and each series' newest counted sample (``last``)."""
    samples = reduce(DataFrame.unionByName, buffered).withColumn("kind", F.lit("sample"))
    last_rows = reduce(DataFrame.unionByName, lasts).withColumn("kind", F.lit("last"))
    return samples.unionByName(last_rows, allowMissingColumns=True)


def next_state(
    carried: DataFrame, panes: Sequence[DataFrame], progress: Sequence[dict[str, Any]], bronze_version: int | None
) -> DataFrame:
    """The state a run leaves (METRIC_STATE_SCHEMA columns): what it carries, its pane rows as the
    outbox (``pane``), the aggregations' progress rows and the bronze version done.

    Replaced in one commit, so the buffer, the clocks and the outbox of a run are never out of step.
    """
    rows = [*progress, {"kind": "progress", "aggregation": None, "bronze_version": bronze_version}]
    outbox = reduce(DataFrame.unionByName, panes).withColumn("kind", F.lit("pane"))
    return carried.unionByName(outbox, allowMissingColumns=True).unionByName(
        carried.sparkSession.createDataFrame(rows, PROGRESS_ROWS_SCHEMA), allowMissingColumns=True
    )
