"""Incremental flows whose code is a transform: the runner does everything else.

A flow declared with a ``transform`` (:class:`pipelines.flows.Flow`) reads its source's new
commits and appends the transform's rows to its target. Its code sees only a :class:`Batch` (the
new rows and their source versions), the typed config its ``config`` built from settings once per
run, and a :class:`FlowRecord` for its figures. The runner owns the rest:

- ensuring the target, the pending increment and, for flows that split by bucket, the split
  check and the batch cut to the run's buckets;
- the quality gate of the target's suite, the append with the app transaction in the same commit;
- conflict retries and the event-log record (:func:`pipelines.runner.run_job`);
- every frame the flow cached (:meth:`FlowRecord.cache`), released on every exit, errors included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.eventlog import RunRecord
from pipelines.layer_config import bucket_mapping
from pipelines.runner import Context, app_id, check_split, pending, run_job, task_name

if TYPE_CHECKING:
    from pipelines.flows import Flow, RunOptions


@dataclass(frozen=True)
class Batch:
    """What a flow's transform gets: the rows added to its source in versions ``start..end``."""

    rows: DataFrame
    start: int
    end: int
    buckets: Sequence[int] | None = None


@dataclass
class FlowRecord:
    """A flow's figures and progress lines; frames it caches are released by the runner."""

    _record: RunRecord
    _say: Callable[[str], None]
    _cached: list[DataFrame] = field(default_factory=list)

    def incr(self, **figures: float | int) -> None:
        self._record.incr(**figures)

    def add(self, **figures: float | int) -> None:
        self._record.add(**figures)

    def rows(self, rows_in: int, rows_out: int) -> None:
        self._record.rows_in, self._record.rows_out = rows_in, rows_out

    def say(self, message: str) -> None:
        self._say(message)

    def cache(self, df: DataFrame) -> DataFrame:
        """``df`` persisted until the run ends (whatever way it ends)."""
        kept = df.persist()
        self._cached.append(kept)
        return kept

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()
        self._cached.clear()


def run_incremental(ctx: Context, flow: Flow, options: RunOptions) -> RunRecord:
    """One run of ``flow``: its source's new commits through its transform into its target."""
    transform = flow.transform
    assert transform is not None, f"{flow.name} has no transform"
    config: Any = flow.config(ctx.settings) if flow.config is not None else None
    skip = flow.skip(config) if flow.skip is not None else None
    (source,), target = flow.sources, flow.targets[0]
    buckets = options.buckets if flow.by_bucket else None

    def body(record: RunRecord) -> None:
        if skip is not None:
            record.noop(skip)
            return
        ctx.store.ensure(target)
        if flow.by_bucket:
            check_split(ctx.store, flow.name, source, target, buckets, bucket_mapping(ctx.settings).count)
        inc = pending(ctx.store, source, target, app_id(flow.name, source, buckets))
        if inc is None:
            record.noop(f"no new rows in {source.key}")
            return
        figures = FlowRecord(record, ctx.say)
        try:
            rows = (
                inc.read(ctx.store) if flow.reads == "inserts" else ctx.store.read_changes(source, inc.start, inc.end)
            )
            if buckets and "bucket" in source.schema.fieldNames():  # a split run: its buckets' rows only
                rows = rows.where(F.col("bucket").isin(*sorted(set(buckets))))
            out = transform(Batch(rows, inc.start, inc.end, buckets), config, figures)
            if target.key in flow.gated:
                from pipelines import quality

                out = quality.gate(ctx, record, target.key, out, inc.txn)
            ctx.store.append(target, out, [inc.txn])
            if flow.figures is not None:
                flow.figures(out, config, figures)
            record.add(source_from=inc.start, source_to=inc.end)
        finally:
            figures.release()

    return run_job(ctx, task_name(flow.name, buckets), body)
