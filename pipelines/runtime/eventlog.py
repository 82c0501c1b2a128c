"""The pipeline event log (``_meta/pipeline_events``), in the spirit of Lakeflow's event log.

Every job run gets one row: what ran, when, how it ended, rows in and out, and a map of
metrics. The data-quality results of the run (one row per expectation: rows checked, rows failed,
policy, outcome) go to ``_meta/expectation_results`` under the same run id. ``medallion status``
reads both back.

A pass of ``medallion run`` writes its runs' rows together when it ends, one commit per table
(:meth:`EventLog.batched`), not two commits per job: a pass over a small increment cost a commit
per job on top of its work. A job run on its own (``ingest``, ``validate``) writes at once. A pass
killed with ``kill -9`` leaves no rows for the runs it finished (its data commits stand; their
progress is in the tables' app transactions, not here); Prometheus saw each run as it ended.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines import observability
from pipelines.storage import TableSpec, TableStore

log = logging.getLogger("medallion")

PIPELINE_EVENTS_SCHEMA = StructType(
    [
        StructField("run_id", StringType()),
        StructField("job", StringType()),
        StructField("started_at", TimestampType()),
        StructField("ended_at", TimestampType()),
        StructField("status", StringType()),  # ok | failed | noop
        StructField("rows_in", LongType()),
        StructField("rows_out", LongType()),
        StructField("metrics", MapType(StringType(), DoubleType())),
        StructField("details", StringType()),
        StructField("error", StringType()),
    ]
)
PIPELINE_EVENTS = TableSpec("_meta", "pipeline_events", PIPELINE_EVENTS_SCHEMA, description="one row per job run")

EXPECTATION_RESULTS_SCHEMA = StructType(
    [
        StructField("run_id", StringType()),
        StructField("job", StringType()),
        StructField("validated_at", TimestampType()),
        StructField("dataset", StringType()),  # the table (layer/name) validated
        StructField("expectation", StringType()),
        StructField("policy", StringType()),  # warn | drop | fail
        StructField("kind", StringType()),  # row | batch | figures
        StructField("rows_checked", LongType()),
        StructField("rows_failed", LongType()),
        StructField("outcome", StringType()),  # passed | warned | dropped | failed
        StructField("observed", StringType()),
        StructField("description", StringType()),
    ]
)
EXPECTATION_RESULTS = TableSpec(
    "_meta",
    "expectation_results",
    EXPECTATION_RESULTS_SCHEMA,
    description="data-quality results: one row per expectation per validated batch or table",
)


@dataclass
class RunRecord:
    """What a job reports about its run; filled in by the job, written by :func:`recorded`."""

    job: str
    rows_in: int = 0
    rows_out: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    details: str | None = None
    status: str = "ok"
    quality: list[dict[str, Any]] = field(default_factory=list)  # expectation results, see EXPECTATION_RESULTS

    def add(self, **metrics: float | int) -> None:
        """Set figures (a later value replaces an earlier one)."""
        for key, value in metrics.items():
            self.metrics[key] = float(value)

    def incr(self, **metrics: float | int) -> None:
        """Add to figures (from 0 when not set yet)."""
        for key, value in metrics.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + float(value)

    def noop(self, why: str) -> None:
        self.status = "noop"
        self.details = why


def passed_rows(record: RunRecord, table: str) -> int | None:
    """The rows of ``table``'s batch that its gate counted and let through this run (None when no
    gate counted them: quality off, or no check on rows), from the figures
    :func:`pipelines.runtime.quality.record_results` set."""
    if f"quality.{table}.rows" not in record.metrics:
        return None
    return int(record.metrics[f"quality.{table}.rows"] - record.metrics.get(f"quality.{table}.dropped_rows", 0))


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


Held = tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]


class EventLog:
    """Where job runs' rows go: straight to the two tables, or, inside :meth:`batched`, held and
    written together when the block ends. What is held belongs to the thread that opened the block
    (a run on another thread writes on its own), and :attr:`failed` says why the last block's rows
    were not all written (None: they were)."""

    def __init__(self, store: TableStore) -> None:
        self.store = store
        #: What each open block holds, by the thread that opened it (a pass's generator may be
        #: resumed, and closed, on another thread: the block still ends as its opener's).
        self._held_by: dict[int, Held] = {}
        self.failed: str | None = None

    def _held(self) -> Held | None:
        return self._held_by.get(threading.get_ident())

    def write(self, row: Mapping[str, Any], results: Sequence[Mapping[str, Any]] = ()) -> None:
        """One run's row and its expectation results (outside a block: a block of its own)."""
        held = self._held()
        if held is None:
            with self.batched():
                self.write(row, results)
            return
        held[0].append(row)
        held[1].extend(results)

    @contextmanager
    def batched(self) -> Iterator[None]:
        """The rows of every run in this block, written when it ends, also when it ends by an
        exception (an inner block belongs to the outer one). The runs' rows and their check results
        are two commits, each written even if the other fails."""
        if self._held() is not None:
            yield
            return
        opener = threading.get_ident()
        held = self._held_by.setdefault(opener, ([], []))
        try:
            yield
        finally:
            self._held_by.pop(opener, None)
            failures = []
            for what, append, rows in (("runs", _append_events, held[0]), ("check results", _append_results, held[1])):
                try:
                    append(self.store, rows)
                except Exception as exc:  # the log must never hide the jobs' own outcome
                    log.exception("could not write the event log's %s (%d row(s))", what, len(rows))
                    failures.append(f"{what}: {exc}")
            self.failed = "; ".join(failures) or None


def _append_events(store: TableStore, rows: Sequence[Mapping[str, Any]]) -> None:
    if rows:
        store.ensure(PIPELINE_EVENTS)
        events = [{**r, "metrics": list((r.get("metrics") or {}).items())} for r in rows]
        store.append(PIPELINE_EVENTS, pa.Table.from_pylist(events, schema=PIPELINE_EVENTS.arrow_schema))


def _append_results(store: TableStore, results: Sequence[Mapping[str, Any]]) -> None:
    if results:
        store.ensure(EXPECTATION_RESULTS)
        store.append(EXPECTATION_RESULTS, pa.Table.from_pylist(list(results), schema=EXPECTATION_RESULTS.arrow_schema))


@contextmanager
def recorded(events: EventLog, job: str, run_id: str) -> Iterator[RunRecord]:
    """Time a job run and write its event-log row, also when the job fails."""
    record = RunRecord(job)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    error: str | None = None
    try:
        yield record
    except BaseException as exc:
        record.status = "failed"
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        raise
    finally:
        seconds = time.perf_counter() - t0
        record.add(seconds=round(seconds, 3))
        try:
            observability.observe(job, record.status, seconds, record.rows_in, record.rows_out, record.metrics)
        except Exception:  # metrics must never hide the job's own outcome either
            log.exception("could not count the run of %s in the metrics", job)
        row = {
            "run_id": run_id,
            "job": job,
            "started_at": started,
            "ended_at": datetime.now(UTC),
            "status": record.status,
            "rows_in": record.rows_in,
            "rows_out": record.rows_out,
            "metrics": dict(record.metrics),  # as it is now: a pass writes its rows when it ends
            "details": record.details,
            "error": error,
        }
        try:
            events.write(row, result_rows(run_id, job, record.quality))
        except Exception:  # the log must never hide the job's own outcome
            log.exception("could not write the event log row for %s", job)


def totals(store: TableStore, metric: str) -> dict[str, int]:
    """``metric`` summed over every run, per flow (a run split by bucket counts for its flow), for
    the flows that recorded it: one row per flow, a figure, not rows."""
    from pyspark.sql import functions as F

    if store.version(PIPELINE_EVENTS) is None:
        return {}
    return {
        r["flow"]: int(r["n"])
        for r in store.read(PIPELINE_EVENTS)
        .withColumn("flow", F.split("job", "#").getItem(0))
        .groupBy("flow")
        .agg(F.sum(F.col("metrics")[metric]).alias("n"))
        .where("n IS NOT NULL")
        .collect()
    }


def result_rows(run_id: str, job: str, results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Expectation results (dicts with the result fields) as rows of ``_meta/expectation_results``."""
    now = datetime.now(UTC)
    return [{**r, "run_id": run_id, "job": job, "validated_at": r.get("validated_at") or now} for r in results]
