"""Export flows: the runner of flows that send lake rows to a system outside the lake.

An export (``mode="export"``) has its own exactly-once protocol with its sink: an outbox, insert
tokens, a log table of what was sent, commits between sends. So its code drives its commits, but
like a transform it never sees a :class:`~pipelines.runtime.runner.Context`. It gets an
:class:`~pipelines.runtime.flow_types.ExportRun`: the lake limited to the tables its flow
declares, whether the run drains, and the quality gate; plus the typed config its ``config`` built
from settings once (its sink's settings among them) and a
:class:`~pipelines.runtime.flow_types.FlowRecord` for its figures. The runner ensures the declared
tables, runs the code under conflict retries with its event-log record, and releases every frame
the code cached, whatever way the run ends.
"""

from __future__ import annotations

from pipelines.config.spark import small_increment
from pipelines.runtime import quality
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.flow_types import DeclaredTables, ExportRun, Flow, FlowRecord, RunOptions
from pipelines.runtime.incremental import configured
from pipelines.runtime.runner import Context, run_job


def run_export(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of an export flow (see the module's docstring)."""
    code, config, skip = configured(ctx, flow)
    declared = flow.reads_tables

    def body(record: RunRecord) -> None:
        if skip is not None:
            record.noop(skip)
            return
        for spec in declared:
            ctx.store.ensure(spec)
        figures = FlowRecord(record, ctx.say)
        run = ExportRun(
            DeclaredTables(ctx.store, flow.name, declared),
            RunOptions(None, options.drain),
            lambda table, df, txn: quality.gate_in_write(ctx, record, table, df, txn),
            lambda rows: small_increment(ctx.spark, ctx.settings, rows),
        )
        try:
            code(run, config, figures)
        finally:
            figures.release()

    return run_job(ctx, flow.name, body)
