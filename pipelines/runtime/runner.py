"""How jobs run: incremental reads, exactly-once writes, retries on commit conflicts, the event log.

A job reads only the source commits it has not processed: it records ``app_id -> last source
version`` as a Delta app transaction in the same commit as its output. A crash before that
commit makes the next run redo the work; a crash after it makes the next run skip it.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from pyspark.sql import SparkSession

from pipelines.config.settings import Settings
from pipelines.errors import CommitConflictError, InputError
from pipelines.runtime.eventlog import EventLog, RunRecord, new_run_id, recorded
from pipelines.storage import TableSpec, TableStore

log = logging.getLogger("medallion")
T = TypeVar("T")

CONFLICT_RETRIES = 8


@dataclass
class Context:
    """Everything a job needs: settings, Spark, the table store, the run id and a progress sink."""

    settings: Settings
    spark: SparkSession
    store: TableStore
    run_id: str = field(default_factory=new_run_id)
    say: Callable[[str], None] = field(default=lambda msg: log.info("%s", msg))
    #: The event log the jobs' runs are written to (held for one commit within a pass).
    events: EventLog = field(init=False, repr=False)
    #: ``(target, app id)`` of the bucket splits :func:`check_split` has let through in this process.
    checked_splits: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.events = EventLog(self.store)


def task_name(job: str, buckets: Sequence[int] | None = None) -> str:
    """``job`` as one task of a run split by bucket (``gold.merge#buckets=0,1``), else ``job``:
    the name its event-log rows and quality results carry."""
    return job if not buckets else f"{job}#buckets=" + ",".join(str(b) for b in sorted(set(buckets)))


def app_id(job: str, source: TableSpec, buckets: Sequence[int] | None = None) -> str:
    base, _, scope = task_name(job, buckets).partition("#")
    return f"medallion/{base}<-{source.key}" + (f"#{scope}" if scope else "")


#: Up to this many buckets, every bucket set is checked for progress by :func:`check_split`.
SPLIT_CHECK_ALL_SETS = 8


def check_split(
    store: TableStore,
    job: str,
    source: TableSpec,
    target: TableSpec,
    buckets: Sequence[int] | None,
    count: int,
    checked: set[tuple[str, str]],
) -> None:
    """Refuse a run over ``buckets`` that overlaps, without being, a split ``job`` already ran with
    on ``target`` (which exists: the jobs ensure it first).

    Progress is kept per bucket set (the app id names it), so two different sets that share a
    bucket would each process that bucket's rows: counted twice. With up to
    :data:`SPLIT_CHECK_ALL_SETS` buckets every set is looked up (one read of the target's app
    transactions); with more, all buckets at once and each single bucket, the splits one runs with.

    ``checked`` (the context's) remembers the splits already let through in this process: a
    continuous job looks its split up once, not each pass (on delta-rs each set is a look-up of its
    own, 256 with 8 buckets). Two overlapping splits whose first runs start at the same moment in
    two processes both pass; each is refused when its process next starts, not at its next pass.
    """
    mine = app_id(job, source, buckets)
    if (target.key, mine) in checked:
        return
    everything = tuple(range(count))
    chosen = frozenset(buckets) if buckets else frozenset(everything)
    if count <= SPLIT_CHECK_ALL_SETS:
        sets = [s for n in range(1, count + 1) for s in itertools.combinations(everything, n)]
    else:
        sets = [(b,) for b in everything]
    splits = {app_id(job, source): frozenset(everything)} | {app_id(job, source, s): frozenset(s) for s in sets}
    done = store.txn_snapshot(target, sorted(splits)).versions
    clashes = sorted(a for a, covers in splits.items() if a != mine and done[a] is not None and covers & chosen)
    if clashes:
        names = "; ".join(a.partition("#")[2] or "all buckets at once" for a in clashes)
        asked = "buckets=" + ",".join(map(str, sorted(chosen))) if buckets else "all buckets at once"
        raise InputError(
            f"{job} over {asked}: {target.key} already has progress from runs over {names}. Runs over "
            "different but overlapping bucket sets would each process the shared buckets' rows; keep "
            "one split per lake (the bundle runs one bucket per task)."
        )
    checked.add((target.key, mine))


def with_conflict_retries(fn: Callable[[], T], what: str, attempts: int = CONFLICT_RETRIES) -> T:
    """Run ``fn``; on a commit conflict re-run it (it re-reads what is left to do)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except CommitConflictError:
            if attempt == attempts:
                raise
            delay = min(0.05 * 2**attempt, 2.0)
            log.warning("%s: commit conflict, retry %d/%d in %.2fs", what, attempt, attempts - 1, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def run_job(ctx: Context, job: str, body: Callable[[RunRecord], None]) -> RunRecord:
    """Run ``body`` as ``job``: conflict retries, timing and an event-log row (which counts the
    retries a commit conflict cost, as ``conflict_retries``)."""
    with garbage_collected_after(), recorded(ctx.events, job, ctx.run_id) as record:
        attempts = 0

        def attempt() -> None:
            nonlocal attempts
            attempts += 1
            record.rows_in = record.rows_out = 0
            record.metrics.clear()
            record.quality.clear()
            body(record)

        try:
            with_conflict_retries(attempt, job)
        finally:
            if attempts > 1:
                record.add(conflict_retries=attempts - 1)
        if record.status == "noop":
            ctx.say(f"{job}: nothing to do ({record.details})")
    return record


@contextmanager
def garbage_collected_after() -> Iterator[None]:
    """The cyclic garbage a job made, collected when it ends; the heap from before it is not
    walked again.

    Spark frames a job built may sit in Python reference cycles; until Python collects them the
    JVM keeps their data (small Python objects, large JVM ones), so a loop of jobs grows the heap.
    A full collection walks every object of every imported module (GX's, Spark's): about 0.2 s a
    job in a pass of ``run all``, more in a larger process. So what is alive when the job starts is
    frozen (``gc.freeze`` and ``gc.unfreeze`` move lists, whatever their size) and the collection
    walks only what came since. A heap frozen by the caller (:func:`startup_heap_frozen`) is the
    caller's to undo: it stays frozen, and the collection is as cheap."""
    mine = not gc.get_freeze_count()
    if mine:
        gc.freeze()
    try:
        yield
    finally:
        gc.collect()  # garbage collection of Python objects, not rows
        if mine:
            gc.unfreeze()


@contextmanager
def startup_heap_frozen() -> Iterator[None]:
    """Leave what is alive on entry (modules, Spark's and py4j's objects, settings) to reference
    counting alone while the block runs, out of the cyclic collector's walks (``gc.freeze``).

    For a process that runs jobs in a loop (``ingest kafka``): otherwise every collection, the one
    after each job and the automatic ones its allocations set off, walks every object of every
    imported module again; in an ingest process that was a third of each flush's time. The heap is
    unfrozen on exit, so a caller in the same process (a test, a notebook) keeps its collector.
    """
    if gc.get_freeze_count():  # frozen by the caller: theirs to undo
        yield
        return
    gc.collect()  # garbage collection, not rows: cyclic garbage frozen now would never be freed
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
