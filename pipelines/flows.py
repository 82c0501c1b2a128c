"""Every flow of the pipeline, declared once: what it reads and writes, how, and what runs it.

A flow is one exactly-once step: it reads the source commits (or messages, or files) it has not
processed yet and writes its targets with its progress in the same commit. Its ``name`` is the one
it has everywhere: in ``medallion run``, in the event log (``_meta/pipeline_events.job``), in its
app ids, in the bundle's tasks and in the report. Flows are grouped into *stages*, the steps the
scheduled job runs one after another (``medallion run <stage>``, one bundle task each).

``medallion run``, ``medallion demo``, ``medallion status`` and the bundle's task list
(:mod:`pipelines.bundle`) all read :data:`FLOWS`. Adding a flow means adding its declaration here,
its transform in its layer and its tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bronze.primitives import micros
from expectations.suites import CLICKHOUSE as CLICKHOUSE_TABLE
from pipelines.errors import InputError
from pipelines.jobs import counters, gold_checks, metrics
from pipelines.jobs import export as export_jobs
from pipelines.jobs import gold as gold_jobs
from pipelines.jobs import silver as silver_jobs
from pipelines.tables import (
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.eventlog import RunRecord
    from pipelines.incremental import FlowRecord, Handoff, MergeRules, StateRules
    from pipelines.quality import Frames
    from pipelines.runner import Context
    from pipelines.settings import Settings
    from pipelines.storage import TableSpec, TableStore

log = logging.getLogger("medallion")

#: How a flow writes its main target: appends, a MERGE, a state table it rewrites per key, or an
#: export to a system outside the lake (with its own log table); ``ingest``: landed from outside.
Mode = Literal["ingest", "append", "merge", "state", "export"]


@dataclass
class RunOptions:
    """What one pass of ``medallion run`` gives its flows."""

    buckets: Sequence[int] | None = None
    #: Treat every window as closed (the end of a backfill).
    drain: bool = False
    #: Shared by the flows of one pass (gold's stage 2 takes stage 1's partials from memory).
    handoff: Handoff | None = None


@dataclass(frozen=True)
class Flow:
    """One flow's declaration."""

    name: str
    stage: str
    sources: tuple[TableSpec, ...]
    targets: tuple[TableSpec, ...]
    mode: Mode
    description: str
    #: Splits by team bucket (``--bucket``): one app id per bucket set.
    by_bucket: bool = False
    #: Where it reads from or writes to outside the lake (Kafka, files, HTTP, ClickHouse).
    external_source: str | None = None
    external_target: str | None = None
    #: Tables whose quality suite gates this flow's writes.
    gated: tuple[str, ...] = field(default=())
    #: The flow's code, given its typed config and its record; the runner does the rest. An
    #: incremental flow's (:mod:`pipelines.incremental`) maps new source rows to target rows (a
    #: :class:`Batch` -> a DataFrame; with ``state``, a :class:`StateBatch` -> a
    #: :class:`StateStep`); an export's (:mod:`pipelines.exports`) sends an :class:`ExportRun`'s
    #: rows to its sink. None: started by ``medallion ingest`` / ``serve``, not by ``medallion run``.
    transform: Callable[[Any, Any, FlowRecord], Any] | None = None
    #: How a ``merge`` flow MERGEs its transform's rows into its target (else they are appended).
    merge: MergeRules | None = None
    #: Its written rows stay cached for the next flow of the pass, if that reads them (Handoff).
    hands_off: bool = False
    #: A flow with state (``mode="state"``; its targets are its output and its state table): how
    #: the runner reads and writes the state.
    state: StateRules | None = None
    #: What its transform gets of the source's new commits: the rows they added, or their change
    #: feed (``_change_type``, ``_commit_version``, ...); or ``all``: the whole source every run.
    reads: Literal["inserts", "changes", "all"] = "inserts"
    #: Builds the transform's typed config from settings, once per run.
    config: Callable[[Settings], Any] | None = None
    #: Why the flow has nothing to do under this config (a noop), else None.
    skip: Callable[[Any], str | None] | None = None
    #: Figures of what was written (the rows appended), after the commit.
    figures: Callable[[DataFrame, Any, FlowRecord], None] | None = None
    #: Table key -> how ``medallion validate`` reads it with the figures that tie it to its
    #: sources (a conservation check of what this flow writes).
    checks: Mapping[str, Callable[[TableStore, Settings], Frames | None]] = field(default_factory=dict)
    #: Parameters the suites of the gated tables take from settings.
    suite_params: Callable[[Settings], dict[str, Any]] | None = None

    @property
    def runnable(self) -> bool:
        """Run by ``medallion run`` (else started by ``medallion ingest`` or ``serve``)."""
        return self.transform is not None

    def execute(self, ctx: Context, options: RunOptions) -> RunRecord:
        """One run of this flow."""
        if self.mode == "export":
            from pipelines.exports import run_export

            return run_export(ctx, self, options)
        if self.transform is not None:
            from pipelines.incremental import run_incremental, run_stateful, run_whole

            if self.state is not None:
                return run_stateful(ctx, self, options)
            return (run_whole if self.reads == "all" else run_incremental)(ctx, self, options)
        raise InputError(f"{self.name} is started by medallion ingest or serve, not run")


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
        transform=silver_jobs.events,
        config=silver_jobs.silver_config,
        figures=silver_jobs.events_figures,
        by_bucket=True,
        gated=(SILVER_EVENTS.key,),
        suite_params=lambda settings: {
            "bucket_count": settings.buckets.count,
            "dedup_horizon_us": micros(settings.silver.dedup_horizon),
        },
    ),
    Flow(
        "silver.page_changes",
        "silver",
        (BRONZE_PAGE_CHANGES,),
        (SILVER_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE),
        "state",
        "bronze page changes -> one change per page per 5-minute window, in order",
        transform=silver_jobs.page_changes,
        state=silver_jobs.PAGE_CHANGE_STATE,
        config=silver_jobs.page_change_config,
        gated=(SILVER_PAGE_CHANGES.key,),
    ),
    Flow(
        "gold.partials",
        "gold",
        (SILVER_EVENTS,),
        (GOLD_PARTIALS,),
        "append",
        "silver events fanned out into (team, property type, key, value) partial counts (stage 1)",
        transform=gold_jobs.partials,
        config=gold_jobs.gold_config,
        figures=gold_jobs.partials_figures,
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
        transform=gold_jobs.merged,
        merge=gold_jobs.GOLD_MERGE,
        config=gold_jobs.gold_config,
        figures=gold_jobs.merged_figures,
        by_bucket=True,
        gated=(GOLD_PROPERTY_VALUES.key,),
        checks={GOLD_PROPERTY_VALUES.key: gold_checks.gold_frames},
    ),
    Flow(
        "export.clickhouse",
        "export",
        (GOLD_PROPERTY_VALUES,),
        (GOLD_EXPORTED, EXPORT_OUTBOX, EXPORTS),
        "export",
        "closed windows' count changes -> ClickHouse property_values, exactly once",
        transform=export_jobs.property_values,
        config=export_jobs.export_config,
        external_target=CLICKHOUSE,
        gated=(CLICKHOUSE_TABLE,),
        checks={CLICKHOUSE_TABLE: gold_checks.clickhouse_frames},
    ),
    Flow(
        "silver.metric_panes",
        "metrics",
        (BRONZE_SAMPLES,),
        (SILVER_METRIC_PANES, SILVER_METRIC_STATE),
        "state",
        "bronze samples -> per-pane sketches of metrics.aggregations",
        transform=metrics.panes,
        state=metrics.METRIC_STATE,
        config=metrics.aggregations,
        skip=metrics.no_aggregations,
    ),
    Flow(
        "gold.metric_windows",
        "metrics",
        (SILVER_METRIC_PANES,),
        (GOLD_METRIC_WINDOWS,),
        "merge",
        "panes -> closed metric windows",
        transform=metrics.windows,
        config=metrics.aggregations,
        figures=metrics.windows_figures,
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


def checks_for(table: str) -> Callable[[TableStore, Settings], Frames | None] | None:
    """How ``medallion validate`` reads ``table`` with its conservation figures, if a flow says."""
    for f in FLOWS:
        if table in f.checks:
            return f.checks[table]
    return None


def suite_params(table: str, settings: Settings) -> dict[str, Any]:
    """The parameters the suite of ``table`` takes from settings, from the flows it gates."""
    params: dict[str, Any] = {}
    for f in FLOWS:
        if table in f.gated and f.suite_params is not None:
            params.update(f.suite_params(settings))
    return params


def runnable() -> list[Flow]:
    return [f for f in FLOWS if f.runnable]


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


def run_pass(
    ctx: Context, flows: Sequence[Flow], buckets: Sequence[int] | None = None, drain: bool = False
) -> Generator[RunRecord, None, None]:
    """One pass: each flow once, in order, yielding its record as it ends. The flows of one pass
    share a handoff (gold's stage 2 takes stage 1's partials from it), released when the pass ends
    or is left (an exception, a stop), and their event-log rows, written then in one commit."""
    from pipelines.incremental import Handoff

    handoff = Handoff()
    options = RunOptions(buckets=buckets, drain=drain, handoff=handoff)
    try:
        with ctx.events.batched():
            for f in flows:
                yield f.execute(ctx, options)
    finally:
        handoff.release()
