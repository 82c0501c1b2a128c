"""Every flow of the pipeline, declared once: what it reads and writes, how, and what runs it.

A flow is one exactly-once step: it reads the source commits (or messages, or files) it has not
processed yet and writes its targets with its progress in the same commit. Its ``name`` is the one
it has everywhere: in ``medallion run``, in the event log (``_meta/pipeline_events.job``), in its
app ids, in the bundle's tasks and in the report. Flows are grouped into *stages*, the steps the
scheduled job runs one after another (``medallion run <stage>``, one bundle task each).

``medallion run``, ``medallion demo``, ``medallion status`` and the bundle's task list
(:mod:`pipelines.app.bundle`) all read :data:`FLOWS`. Adding a flow means adding its declaration here,
its transform in its layer and its tests.
"""

from __future__ import annotations

import logging
from typing import Any

from expectations.suites import CLICKHOUSE as CLICKHOUSE_TABLE
from pipelines.errors import InputError
from pipelines.flows import checks, clickhouse, counters, flow_names, gold, metric_windows, page_changes, silver
from pipelines.runtime.flow_types import Append, Export, Flow, Ingest, Merge, State, TableCheck
from pipelines.runtime.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_QUARANTINE,
    BRONZE_SAMPLES,
    COUNTER_EXPORTS,
    EXPORT_OUTBOX,
    EXPORTS,
    GOLD_COUNTER_MILESTONES,
    GOLD_COUNTER_PARTIALS,
    GOLD_COUNTERS,
    GOLD_METRIC_WINDOWS,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
    SILVER_EVENTS,
    SILVER_METRIC_PANES,
    SILVER_METRIC_STATE,
    SILVER_PAGE_CHANGE_STATE,
    SILVER_PAGE_CHANGES,
)

log = logging.getLogger("medallion")


CLICKHOUSE = "ClickHouse"
FLOWS: tuple[Flow[Any], ...] = (
    Flow(
        flow_names.INGEST_KAFKA,
        "ingest",
        (),
        (BRONZE_EVENTS, BRONZE_PAGE_CHANGES, BRONZE_QUARANTINE),
        Ingest("Kafka"),
        "Kafka messages -> bronze rows, offsets committed with them (medallion ingest kafka)",
        gated=(BRONZE_EVENTS.key, BRONZE_PAGE_CHANGES.key),
    ),
    Flow(
        flow_names.INGEST_FILE_EVENTS,
        "ingest",
        (),
        (BRONZE_EVENTS, BRONZE_QUARANTINE),
        Ingest("files"),
        "JSON-lines files of product events -> bronze, each file once (medallion ingest file)",
        gated=(BRONZE_EVENTS.key,),
    ),
    Flow(
        flow_names.INGEST_FILE_PAGE_CHANGES,
        "ingest",
        (),
        (BRONZE_PAGE_CHANGES, BRONZE_QUARANTINE),
        Ingest("files"),
        "JSON-lines files of MediaWiki page changes -> bronze, each file once (medallion ingest file)",
        gated=(BRONZE_PAGE_CHANGES.key,),
    ),
    Flow(
        flow_names.INGEST_REMOTE_WRITE,
        "ingest",
        (),
        (BRONZE_SAMPLES,),
        Ingest("remote write"),
        "Prometheus remote write -> bronze samples, through a write-ahead log (medallion serve remote-write)",
    ),
    Flow(
        flow_names.SILVER_EVENTS,
        "silver",
        (BRONZE_EVENTS,),
        (SILVER_EVENTS,),
        Append(),
        "bronze events -> silver events with their team bucket",
        transform=silver.events,
        config=silver.silver_config,
        figures=silver.events_figures,
        by_bucket=True,
        lookups=(SILVER_EVENTS,),  # the copies it already holds, for deduplication by identity
        gated=(SILVER_EVENTS.key,),
    ),
    Flow(
        flow_names.SILVER_PAGE_CHANGES,
        "silver",
        (BRONZE_PAGE_CHANGES,),
        (SILVER_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE),
        State(page_changes.PAGE_CHANGE_STATE),
        "bronze page changes -> one change per page per 5-minute window, in order",
        transform=page_changes.page_changes,
        config=page_changes.page_change_config,
        gated=(SILVER_PAGE_CHANGES.key,),
    ),
    Flow(
        flow_names.GOLD_PARTIALS,
        "gold",
        (SILVER_EVENTS,),
        (GOLD_PARTIALS,),
        Append(),
        "silver events fanned out into (team, property type, key, value) partial counts (stage 1)",
        transform=gold.partials,
        config=gold.gold_config,
        figures=gold.partials_figures,
        by_bucket=True,
        gated=(GOLD_PARTIALS.key,),
        increment_only=True,
    ),
    Flow(
        flow_names.GOLD_MERGE,
        "gold",
        (GOLD_PARTIALS,),
        (GOLD_PROPERTY_VALUES,),
        Merge(gold.GOLD_MERGE),
        "partials merged into one count per tuple per window (stage 2)",
        transform=gold.merged,
        config=gold.gold_config,
        figures=gold.merged_figures,
        by_bucket=True,
        gated=(GOLD_PROPERTY_VALUES.key,),
        checks={GOLD_PROPERTY_VALUES.key: checks.gold_frames},
    ),
    Flow(
        flow_names.EXPORT_CLICKHOUSE,
        "export",
        (GOLD_PROPERTY_VALUES,),
        (EXPORT_OUTBOX, EXPORTS),
        Export(CLICKHOUSE),
        "closed windows' count changes -> ClickHouse property_values, exactly once",
        transform=clickhouse.property_values,
        config=clickhouse.export_config,
        gated=(CLICKHOUSE_TABLE,),
        checks={CLICKHOUSE_TABLE: checks.clickhouse_frames},
    ),
    Flow(
        flow_names.SILVER_METRIC_PANES,
        "metrics",
        (BRONZE_SAMPLES,),
        (SILVER_METRIC_PANES, SILVER_METRIC_STATE),
        State(metric_windows.METRIC_STATE),
        "bronze samples -> per-pane sketches of metrics.aggregations",
        transform=metric_windows.panes,
        config=metric_windows.aggregations,
        skip=metric_windows.no_aggregations,
    ),
    Flow(
        flow_names.GOLD_METRIC_WINDOWS,
        "metrics",
        (SILVER_METRIC_PANES,),
        (GOLD_METRIC_WINDOWS,),
        Append(),
        "panes -> closed metric windows",
        transform=metric_windows.windows,
        config=metric_windows.aggregations,
        figures=metric_windows.windows_figures,
    ),
    Flow(
        flow_names.GOLD_COUNTER_PARTIALS,
        "counters",
        (SILVER_EVENTS,),
        (GOLD_COUNTER_PARTIALS,),
        Append(),
        "silver events -> per-entity counter increments",
        transform=counters.partials,
        config=counters.counter_config,
        skip=counters.no_registry,
        figures=counters.partials_figures,
    ),
    Flow(
        flow_names.GOLD_COUNTERS,
        "counters",
        (GOLD_COUNTER_PARTIALS,),
        (GOLD_COUNTERS,),
        Merge(counters.COUNTER_FLUSH),
        "increments -> tiered counter totals",
        transform=counters.flush,
        reads="all",
        config=counters.counter_config,
        skip=counters.no_registry,
        figures=counters.flush_figures,
    ),
    Flow(
        flow_names.GOLD_COUNTER_MILESTONES,
        "counters",
        (GOLD_COUNTERS,),
        (GOLD_COUNTER_MILESTONES,),
        Append(),
        "counter changes -> thresholds crossed",
        transform=counters.milestones,
        reads="changes",
        config=counters.counter_config,
        skip=counters.no_registry,
        figures=counters.milestones_figures,
    ),
    Flow(
        flow_names.EXPORT_COUNTERS,
        "counters",
        (GOLD_COUNTERS,),
        (COUNTER_EXPORTS,),
        Export(CLICKHOUSE),
        "counter changes -> ClickHouse counters, exactly once",
        transform=counters.to_clickhouse,
        config=counters.clickhouse_settings,
    ),
)
#: Spellings of earlier releases: accepted with a warning.
RENAMED = {
    "silver-events": flow_names.SILVER_EVENTS,
    "silver-page-changes": flow_names.SILVER_PAGE_CHANGES,
    "gold-partials": flow_names.GOLD_PARTIALS,
    "gold-merge": flow_names.GOLD_MERGE,
}


# Everything below reads FLOWS when called, so a test can declare a flow of its own beside them.
def flow(name: str) -> Flow:
    """The flow called ``name``."""
    for f in FLOWS:
        if f.name == name:
            return f
    raise InputError(f"no flow {name!r}; flows: {', '.join(f.name for f in FLOWS)}")


def table_checks() -> dict[str, TableCheck]:
    """Table key -> how ``medallion validate`` reads it with its conservation figures, as the
    flows that write those tables declare (:func:`pipelines.runtime.quality.validate_tables`)."""
    return {table: check for f in FLOWS for table, check in f.checks.items()}


def runnable() -> list[Flow]:
    """The flows ``medallion run`` runs (the others are started by ``medallion ingest`` or ``serve``)."""
    return [f for f in FLOWS if f.transform is not None]


def stages() -> tuple[str, ...]:
    """The stages ``medallion run`` runs, in the order a pass runs them (``all`` is every one)."""
    return tuple(dict.fromkeys(f.stage for f in runnable()))


def names() -> list[str]:
    """What ``medallion run`` takes: the stages, every runnable flow, and ``all``."""
    return [*stages(), *(f.name for f in runnable()), "all"]


def resolve(name: str) -> list[Flow]:
    """The flows ``medallion run NAME`` runs, in pipeline order."""
    if name in RENAMED:
        log.warning("%r is now called %r", name, RENAMED[name])
        name = RENAMED[name]
    if name == "all":
        return runnable()
    if name in stages():
        return [f for f in runnable() if f.stage == name]
    found = [f for f in runnable() if f.name == name]
    if not found:
        raise InputError(f"no flow or stage {name!r}; one of: {', '.join(names())}")
    return found
