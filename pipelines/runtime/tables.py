"""Every table of the lake: its place (``<layer>/<name>``), schema and partitioning.

Schemas live next to the code that produces the rows; this module only gathers them, so
``medallion status`` and ``medallion sql`` can list every table and jobs can name them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from bronze.events import BRONZE_EVENTS_SCHEMA
from bronze.landing import QUARANTINE_SCHEMA
from bronze.page_changes import BRONZE_PAGE_CHANGES_SCHEMA
from bronze.primitives import micros
from bronze.samples import BRONZE_SAMPLES_SCHEMA
from gold.counters import COUNTER_PARTIALS_SCHEMA, COUNTERS_SCHEMA, MILESTONES_SCHEMA
from gold.export import OUTBOX_SCHEMA
from gold.metric_windows import METRIC_WINDOWS_SCHEMA
from gold.property_values import PARTIALS_SCHEMA, PROPERTY_VALUES_SCHEMA, WINDOW_START
from pipelines.runtime.eventlog import EXPECTATION_RESULTS, PIPELINE_EVENTS
from pipelines.storage import TableSpec
from silver.events import SILVER_EVENTS_SCHEMA
from silver.metric_panes import METRIC_PANES_SCHEMA, METRIC_STATE_SCHEMA
from silver.page_changes import PAGE_CHANGE_STATE_SCHEMA, SILVER_PAGE_CHANGES_SCHEMA

if TYPE_CHECKING:
    from pipelines.config.settings import Settings

BRONZE_EVENTS = TableSpec("bronze", "events", BRONZE_EVENTS_SCHEMA, description="product events as ingested")
BRONZE_PAGE_CHANGES = TableSpec(
    "bronze",
    "page_changes",
    BRONZE_PAGE_CHANGES_SCHEMA,
    description="mediawiki.page_change.v1 events as ingested",
)
BRONZE_SAMPLES = TableSpec(
    "bronze",
    "samples",
    BRONZE_SAMPLES_SCHEMA,
    description="Prometheus / VictoriaMetrics remote-write samples",
)
BRONZE_QUARANTINE = TableSpec(
    "bronze", "quarantine", QUARANTINE_SCHEMA, description="input that could not be landed, with the reason"
)
#: A Bloom filter on ``uuid``: deduplication reads silver for the few identities a small batch holds.
SILVER_EVENTS = TableSpec(
    "silver",
    "events",
    SILVER_EVENTS_SCHEMA,
    partition_by=("bucket",),
    description="events with team buckets",
    # A read of a range of event times (deduplication's horizon, a backfill's range) skips the
    # files and row groups of the others, where a sender's files each span a day.
    cluster_by=("event_time",),
    file_rows=50_000,
    bloom_filter=("uuid",),
)
SILVER_PAGE_CHANGES = TableSpec(
    "silver",
    "page_changes",
    SILVER_PAGE_CHANGES_SCHEMA,
    description="page changes reordered and deduplicated",
)
SILVER_PAGE_CHANGE_STATE = TableSpec(
    "silver",
    "page_change_state",
    PAGE_CHANGE_STATE_SCHEMA,
    description="dedup state: open-window events, last emitted per key, outbox, progress",
)
SILVER_METRIC_PANES = TableSpec(
    "silver",
    "metric_panes",
    METRIC_PANES_SCHEMA,
    description="final panes (slide-sized slices) of each metric aggregation, summarised",
)
SILVER_METRIC_STATE = TableSpec(
    "silver",
    "metric_pane_state",
    METRIC_STATE_SCHEMA,
    description="metric state: samples of open panes, newest counted sample per series, progress, outbox",
)
GOLD_METRIC_WINDOWS = TableSpec(
    "gold",
    "metric_windows",
    METRIC_WINDOWS_SCHEMA,
    description="closed windows of each metric aggregation (plus late and raw rows)",
)
GOLD_COUNTER_PARTIALS = TableSpec(
    "gold",
    "counter_partials",
    COUNTER_PARTIALS_SCHEMA,
    description="counter increments per counter, entity, window and silver batch",
)
GOLD_COUNTERS = TableSpec(
    "gold", "counters", COUNTERS_SCHEMA, description="one row per (counter, entity): the running total"
)
GOLD_COUNTER_MILESTONES = TableSpec(
    "gold",
    "counter_milestones",
    MILESTONES_SCHEMA,
    description="one row per counter threshold crossed by an entity",
)
COUNTER_EXPORTS = TableSpec(
    "_meta",
    "counter_exports",
    StructType(
        [
            StructField("counters_version", LongType()),
            StructField("rows", LongType()),
            StructField("exported_at", TimestampType()),
        ]
    ),
    description="each gold/counters version sent to ClickHouse, recorded with its app transaction",
)
GOLD_PARTIALS = TableSpec(
    "gold",
    "property_value_partials",
    PARTIALS_SCHEMA,
    partition_by=("bucket",),
    description="stage 1: partial tuple counts per window and source batch",
    # A backfill replaces some windows' partials: it rewrites only the files that hold them.
    cluster_by=(WINDOW_START,),
    file_rows=50_000,
)
GOLD_PROPERTY_VALUES = TableSpec(
    "gold",
    "property_values",
    PROPERTY_VALUES_SCHEMA,
    partition_by=("bucket",),
    description="stage 2: one row per (team, property_type, key, value), bucket and window",
    # A MERGE of late counts, and the export's read of some windows, touch those windows' files.
    cluster_by=(WINDOW_START,),
    file_rows=50_000,
)
EXPORT_OUTBOX = TableSpec(
    "_meta",
    "export_outbox",
    OUTBOX_SCHEMA,
    description="each export batch, recorded before it is sent so a retry sends the same rows",
    # The driver streams a batch's files to ClickHouse a row group at a time: files (and so row
    # groups) of at most this many rows keep that memory the same however large the batch.
    file_rows=100_000,
)
EXPORTS = TableSpec(
    "_meta",
    "exports",
    StructType(
        [
            StructField("sink", StringType()),
            StructField("target", StringType()),
            StructField("source", StringType()),
            StructField("from_version", LongType()),
            StructField("to_version", LongType()),
            StructField("rows", LongType()),
            StructField("count_sum", LongType()),
            StructField("exported_at", TimestampType()),
        ]
    ),
    description="what each export sent, recorded with the export's app transaction",
)

ALL_TABLES: tuple[TableSpec, ...] = (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_SAMPLES,
    BRONZE_QUARANTINE,
    SILVER_EVENTS,
    SILVER_PAGE_CHANGES,
    SILVER_PAGE_CHANGE_STATE,
    SILVER_METRIC_PANES,
    SILVER_METRIC_STATE,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
    GOLD_METRIC_WINDOWS,
    GOLD_COUNTER_PARTIALS,
    GOLD_COUNTERS,
    GOLD_COUNTER_MILESTONES,
    COUNTER_EXPORTS,
    PIPELINE_EVENTS,
    EXPECTATION_RESULTS,
    EXPORT_OUTBOX,
    EXPORTS,
)
BY_KEY = {t.key: t for t in ALL_TABLES}

#: The column whose newest value says how fresh each table is: the time of the newest event (or
#: window, or write) it holds. ``medallion report`` shows its age.
TIME_COLUMNS: dict[str, str] = {
    BRONZE_EVENTS.key: "timestamp",
    BRONZE_PAGE_CHANGES.key: "event_time",
    BRONZE_SAMPLES.key: "timestamp",
    BRONZE_QUARANTINE.key: "ingest_time",
    SILVER_EVENTS.key: "event_time",
    SILVER_PAGE_CHANGES.key: "event_time",
    SILVER_PAGE_CHANGE_STATE.key: "max_event_time",
    SILVER_METRIC_PANES.key: "pane_end",
    SILVER_METRIC_STATE.key: "max_seen",
    GOLD_PARTIALS.key: "max_event_time",
    GOLD_PROPERTY_VALUES.key: "max_event_time",
    GOLD_METRIC_WINDOWS.key: "window_end",
    GOLD_COUNTER_PARTIALS.key: "window_end",
    GOLD_COUNTERS.key: "updated_at",
    GOLD_COUNTER_MILESTONES.key: "crossed_at",
    COUNTER_EXPORTS.key: "exported_at",
    EXPORT_OUTBOX.key: "newest_event",
    EXPORTS.key: "exported_at",
    PIPELINE_EVENTS.key: "ended_at",
    EXPECTATION_RESULTS.key: "validated_at",
}


def table(key: str) -> TableSpec:
    """The spec for ``layer/name`` (e.g. ``bronze/events``)."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown table {key!r}; known: {', '.join(sorted(BY_KEY))}") from None


#: What a table's quality suite (:data:`expectations.suites.SUITES`) takes from settings, beside
#: the table it gates: silver's checks know the bucket count and how far back a repeat is looked for.
SUITE_SETTINGS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    SILVER_EVENTS.key: lambda settings: {
        "bucket_count": settings.buckets.count,
        "dedup_horizon_us": micros(settings.silver.dedup_horizon),
    },
}


def suite_params(key: str, settings: Settings) -> dict[str, Any]:
    """The parameters the suite of table ``key`` takes from ``settings`` (none for most)."""
    found = SUITE_SETTINGS.get(key)
    return found(settings) if found is not None else {}
