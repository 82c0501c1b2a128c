"""Running flows: one flow, as its kind of runner runs it, and passes of several.

:func:`execute` hands a flow to its runner by how it writes: an export to
:mod:`pipelines.runtime.exports`, a state flow, a whole-source flow and an incremental one to
:mod:`pipelines.runtime.incremental`. :func:`run_pass` runs flows one after another as ``medallion
run`` does, their event-log rows written in one commit. The functions below it run one flow once, for
tests, the bench and notebooks: ``silver_events(ctx)`` is ``run_flow(ctx, flow_names.SILVER_EVENTS)``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

from pipelines.errors import InputError
from pipelines.flows import flow, flow_names
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.exports import run_export
from pipelines.runtime.flow_types import Export, Flow, Ingest, RunOptions, State
from pipelines.runtime.incremental import run_incremental, run_stateful, run_whole
from pipelines.runtime.runner import Context

#: How a pass runs one of its flows (:func:`execute`; a test gives a runner of its own).
Execute = Callable[[Context, Flow, RunOptions], RunRecord]


def execute(ctx: Context, f: Flow, options: RunOptions) -> RunRecord:
    """One run of ``f`` by its runner."""
    if isinstance(f.write, Ingest) or f.transform is None:
        raise InputError(f"{f.name} is started by medallion ingest or serve, not run")
    if isinstance(f.write, Export):
        return run_export(ctx, f, options)
    if isinstance(f.write, State):
        return run_stateful(ctx, f, options)
    if f.reads == "all":
        return run_whole(ctx, f, options)
    return run_incremental(ctx, f, options)


def run_pass(
    ctx: Context,
    flows: Sequence[Flow],
    buckets: Sequence[int] | None = None,
    drain: bool = False,
    run: Execute = execute,
) -> Generator[RunRecord, None, None]:
    """One pass: each flow once, in order, yielding its record as it ends; their event-log rows are
    written when the pass ends or is left (an exception, a stop), in one commit. Nothing is kept
    in memory between flows: each reads what the one before it committed (gold's stage 2 reads
    the partials stage 1 wrote, a Parquet read, where a cache of them cost more than it saved)."""
    options = RunOptions(buckets=buckets, drain=drain)
    with ctx.events.batched():
        for f in flows:
            yield run(ctx, f, options)


def run_flow(ctx: Context, name: str, buckets: Sequence[int] | None = None, drain: bool = False) -> RunRecord:
    """One run of the flow ``name``, as ``medallion run`` runs it."""
    return execute(ctx, flow(name), RunOptions(buckets=buckets, drain=drain))


def silver_events(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    return run_flow(ctx, flow_names.SILVER_EVENTS, buckets)


def silver_page_changes(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, flow_names.SILVER_PAGE_CHANGES, drain=drain)


def gold_partials(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    return run_flow(ctx, flow_names.GOLD_PARTIALS, buckets)


def gold_merge(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    return run_flow(ctx, flow_names.GOLD_MERGE, buckets)


def gold_property_values(ctx: Context, buckets: Sequence[int] | None = None) -> tuple[RunRecord, RunRecord]:
    """Stage 1 then stage 2 in one pass (stage 2 reads back the partials stage 1 committed)."""
    first, second = run_pass(ctx, [flow(flow_names.GOLD_PARTIALS), flow(flow_names.GOLD_MERGE)], buckets)
    return first, second


def export_property_values(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, flow_names.EXPORT_CLICKHOUSE, drain=drain)


def silver_metric_panes(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, flow_names.SILVER_METRIC_PANES, drain=drain)


def gold_metric_windows(ctx: Context) -> RunRecord:
    return run_flow(ctx, flow_names.GOLD_METRIC_WINDOWS)


def gold_counter_partials(ctx: Context) -> RunRecord:
    return run_flow(ctx, flow_names.GOLD_COUNTER_PARTIALS)


def gold_counters(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, flow_names.GOLD_COUNTERS, drain=drain)


def counter_milestones(ctx: Context) -> RunRecord:
    return run_flow(ctx, flow_names.GOLD_COUNTER_MILESTONES)


def export_counters(ctx: Context) -> RunRecord:
    return run_flow(ctx, flow_names.EXPORT_COUNTERS)
