"""The flows' code, one module per layer or kind, and one run of each flow by name.

Silver buckets events and deduplicates page changes; gold fans events out into partial counts
(stage 1), merges them (stage 2) and exports count differences to ClickHouse; metrics turn
samples into panes and closed windows; counters keep tiered totals and their milestones. Each
module holds transforms and exports that see their batch, their typed config and their record,
never a :class:`~pipelines.runner.Context`; the logic they wire lives in bronze/, silver/ and
gold/, and what the layers are configured with is built in ``pipelines.layer_config``. The
runners (:mod:`pipelines.incremental`, :mod:`pipelines.exports`, and :mod:`pipelines.ingest` for
what lands in bronze) do the rest.

The functions below run one flow once, as ``medallion run <flow>`` does, for tests, the bench and
notebooks: ``silver_events(ctx)`` is ``flow("silver.events").execute(ctx, RunOptions())``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipelines.ingest import KINDS, Landed, ingest_files, ingest_kafka, parse_landing, topic_kinds
from pipelines.layer_config import bucket_mapping, counter_registry, fanout_rules

if TYPE_CHECKING:
    from pipelines.eventlog import RunRecord
    from pipelines.runner import Context


def run_flow(ctx: Context, name: str, buckets: Sequence[int] | None = None, drain: bool = False) -> RunRecord:
    """One run of the flow ``name``, as ``medallion run`` runs it."""
    from pipelines.flows import RunOptions, flow

    return flow(name).execute(ctx, RunOptions(buckets=buckets, drain=drain))


def silver_events(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    return run_flow(ctx, "silver.events", buckets)


def silver_page_changes(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, "silver.page_changes", drain=drain)


def gold_partials(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    return run_flow(ctx, "gold.partials", buckets)


def gold_merge(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    return run_flow(ctx, "gold.merge", buckets)


def gold_property_values(ctx: Context, buckets: Sequence[int] | None = None) -> tuple[RunRecord, RunRecord]:
    """Stage 1 then stage 2 in one pass, stage 2 merging stage 1's partials from memory."""
    from pipelines.flows import flow, run_pass

    first, second = run_pass(ctx, [flow("gold.partials"), flow("gold.merge")], buckets)
    return first, second


def export_property_values(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, "export.clickhouse", drain=drain)


def silver_metric_panes(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, "silver.metric_panes", drain=drain)


def gold_metric_windows(ctx: Context) -> RunRecord:
    return run_flow(ctx, "gold.metric_windows")


def gold_counter_partials(ctx: Context) -> RunRecord:
    return run_flow(ctx, "gold.counter_partials")


def gold_counters(ctx: Context, drain: bool = False) -> RunRecord:
    return run_flow(ctx, "gold.counters", drain=drain)


def counter_milestones(ctx: Context) -> RunRecord:
    return run_flow(ctx, "gold.counter_milestones")


def export_counters(ctx: Context) -> RunRecord:
    return run_flow(ctx, "export.counters")


__all__ = [
    "KINDS",
    "Landed",
    "bucket_mapping",
    "counter_milestones",
    "counter_registry",
    "export_counters",
    "export_property_values",
    "fanout_rules",
    "gold_counter_partials",
    "gold_counters",
    "gold_merge",
    "gold_metric_windows",
    "gold_partials",
    "gold_property_values",
    "ingest_files",
    "ingest_kafka",
    "parse_landing",
    "run_flow",
    "silver_events",
    "silver_metric_panes",
    "silver_page_changes",
    "topic_kinds",
]
