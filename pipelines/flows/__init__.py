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

from expectations.suites import CLICKHOUSE as CLICKHOUSE_TABLE
from pipelines.errors import InputError
from pipelines.flows import checks, clickhouse, counters, gold, metric_windows, silver
from pipelines.runtime.flow_types import Flow, TableCheck
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
    GOLD_EXPORTED,
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
FLOWS: tuple[Flow, ...] = (
    Flow(
        "ingest.kafka",
        "ingest",
        (),
        (BRONZE_EVENTS, BRONZE_PAGE_CHANGES, BRONZE_QUARANTINE),
        "ingest",
        "Kafka messages -> bronze rows, offsets committed with them (medallion ingest kafka)",
        external_source="Kafka",
        gated=(BRONZE_EVENTS.key, BRONZE_PAGE_CHANGES.key),
    ),
    Flow(
        "ingest_file.events",
        "ingest",
        (),
        (BRONZE_EVENTS, BRONZE_QUARANTINE),
        "ingest",
        "JSON-lines files of product events -> bronze, each file once (medallion ingest file)",
        external_source="files",
        gated=(BRONZE_EVENTS.key,),
    ),
    Flow(
        "ingest_file.page_changes",
        "ingest",
        (),
        (BRONZE_PAGE_CHANGES, BRONZE_QUARANTINE),
        "ingest",
        "JSON-lines files of MediaWiki page changes -> bronze, each file once (medallion ingest file)",
        external_source="files",
        gated=(BRONZE_PAGE_CHANGES.key,),
    ),
    Flow(
        "ingest.remote_write",
        "ingest",
        (),
        (BRONZE_SAMPLES,),
        "ingest",
        "Prometheus remote write -> bronze samples, through a write-ahead log (medallion serve remote-write)",
        external_source="remote write",
    ),
    Flow(
        "silver.events",
        "silver",
        (BRONZE_EVENTS,),
        (SILVER_EVENTS,),
        "append",
        "bronze events -> silver events with their team bucket",
        transform=silver.events,
        config=silver.silver_config,
        figures=silver.events_figures,
        by_bucket=True,
        gated=(SILVER_EVENTS.key,),
    ),
    Flow(
        "silver.page_changes",
        "silver",
        (BRONZE_PAGE_CHANGES,),
        (SILVER_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE),
        "state",
        "bronze page changes -> one change per page per 5-minute window, in order",
        transform=silver.page_changes,
        state=silver.PAGE_CHANGE_STATE,
        config=silver.page_change_config,
        gated=(SILVER_PAGE_CHANGES.key,),
    ),
    Flow(
        "gold.partials",
        "gold",
        (SILVER_EVENTS,),
        (GOLD_PARTIALS,),
        "append",
        "silver events fanned out into (team, property type, key, value) partial counts (stage 1)",
        transform=gold.partials,
        config=gold.gold_config,
        figures=gold.partials_figures,
        hands_off=True,
        by_bucket=True,
        gated=(GOLD_PARTIALS.key,),
    ),
    Flow(
        "gold.merge",
        "gold",
        (GOLD_PARTIALS,),
        (GOLD_PROPERTY_VALUES,),
        "merge",
        "partials merged into one count per tuple per window (stage 2)",
        transform=gold.merged,
        merge=gold.GOLD_MERGE,
        config=gold.gold_config,
        figures=gold.merged_figures,
        by_bucket=True,
        gated=(GOLD_PROPERTY_VALUES.key,),
        checks={GOLD_PROPERTY_VALUES.key: checks.gold_frames},
    ),
    Flow(
        "export.clickhouse",
        "export",
        (GOLD_PROPERTY_VALUES,),
        (GOLD_EXPORTED, EXPORT_OUTBOX, EXPORTS),
        "export",
        "closed windows' count changes -> ClickHouse property_values, exactly once",
        transform=clickhouse.property_values,
        config=clickhouse.export_config,
        external_target=CLICKHOUSE,
        gated=(CLICKHOUSE_TABLE,),
        checks={CLICKHOUSE_TABLE: checks.clickhouse_frames},
    ),
    Flow(
        "silver.metric_panes",
        "metrics",
        (BRONZE_SAMPLES,),
        (SILVER_METRIC_PANES, SILVER_METRIC_STATE),
        "state",
        "bronze samples -> per-pane sketches of metrics.aggregations",
        transform=metric_windows.panes,
        state=metric_windows.METRIC_STATE,
        config=metric_windows.aggregations,
        skip=metric_windows.no_aggregations,
    ),
    Flow(
        "gold.metric_windows",
        "metrics",
        (SILVER_METRIC_PANES,),
        (GOLD_METRIC_WINDOWS,),
        "merge",
        "panes -> closed metric windows",
        transform=metric_windows.windows,
        config=metric_windows.aggregations,
        figures=metric_windows.windows_figures,
    ),
    Flow(
        "gold.counter_partials",
        "counters",
        (SILVER_EVENTS,),
        (GOLD_COUNTER_PARTIALS,),
        "append",
        "silver events -> per-entity counter increments",
        transform=counters.partials,
        config=counters.counter_config,
        skip=counters.no_registry,
        figures=counters.partials_figures,
    ),
    Flow(
        "gold.counters",
        "counters",
        (GOLD_COUNTER_PARTIALS,),
        (GOLD_COUNTERS,),
        "merge",
        "increments -> tiered counter totals",
        transform=counters.flush,
        reads="all",
        merge=counters.COUNTER_FLUSH,
        config=counters.counter_config,
        skip=counters.no_registry,
        figures=counters.flush_figures,
    ),
    Flow(
        "gold.counter_milestones",
        "counters",
        (GOLD_COUNTERS,),
        (GOLD_COUNTER_MILESTONES,),
        "append",
        "counter changes -> thresholds crossed",
        transform=counters.milestones,
        reads="changes",
        config=counters.counter_config,
        skip=counters.no_registry,
        figures=counters.milestones_figures,
    ),
    Flow(
        "export.counters",
        "counters",
        (GOLD_COUNTERS,),
        (COUNTER_EXPORTS,),
        "export",
        "counter changes -> ClickHouse counters, exactly once",
        transform=counters.to_clickhouse,
        config=counters.clickhouse_settings,
        external_target=CLICKHOUSE,
    ),
)
#: Spellings of earlier releases: accepted with a warning.
RENAMED = {
    "silver-events": "silver.events",
    "silver-page-changes": "silver.page_changes",
    "gold-partials": "gold.partials",
    "gold-merge": "gold.merge",
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
