"""Each stage's Spark work as Spark recorded it: its queries, their jobs, the jobs' time and the time
each query took before its first job, from the session's event log.

A stage's wall time is Spark's jobs, what each query does before them (analysis, optimization and
physical planning: a large plan costs on every action) and the driver's own work (Python, Delta
commits). The bench turns on Spark's event log for its session (:func:`confs`) and each timed run
keeps its wall-clock window (:class:`pipelines.dev.bench.measure.Figure`); the queries and jobs
that started inside a run's window are that run's (the bench runs one stage at a time).

- **jobs:** ``SparkListenerJobStart`` / ``SparkListenerJobEnd``; their time is the union of their
  intervals (jobs of one query may overlap).
- **before the first job:** from a query's ``SparkListenerSQLExecutionStart`` to its first job's
  submission: Spark stamps the start before it plans the physical plan, so this is optimization
  and planning (and whatever the query runs first, such as a broadcast's build), per query that
  ran a job.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from pyspark.sql import SparkSession

log = logging.getLogger("medallion.bench")

#: The event log's folder under the bench's output folder.
FOLDER = "spark-events"
_SQL = "org.apache.spark.sql.execution.ui."
_WANTED = tuple(
    f'{{"Event":"{kind}"'
    for kind in ("SparkListenerJobStart", "SparkListenerJobEnd", _SQL + "SparkListenerSQLExecutionStart")
)


def confs(folder: Path) -> dict[str, str]:
    """The confs that make a new session write its event log, uncompressed, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",  # one file, not Spark 4's folder of parts
    }


def log_file(spark: SparkSession) -> Path | None:
    """This session's event log, if it writes one file to a local folder (None: it does not, or it
    is compressed or rolled over several files, or the session is a Spark Connect client's)."""
    try:
        conf = spark.sparkContext.getConf()
        app = spark.sparkContext.applicationId
    except Exception:  # Spark Connect: no SparkContext here
        return None
    if conf.get("spark.eventLog.enabled", "false") != "true" or conf.get("spark.eventLog.compress", "") != "false":
        return None
    if conf.get("spark.eventLog.rolling.enabled", "true") != "false":
        return None
    url = urlparse(conf.get("spark.eventLog.dir", ""))
    if url.scheme not in ("", "file") or not url.path:
        return None
    base = Path(url2pathname(url.path)) / app  # as_uri() wrote a space as %20
    for path in (base.with_name(base.name + ".inprogress"), base):
        if path.exists():
            return path
    return None


@dataclass(frozen=True)
class Job:
    start: float  # seconds since the epoch
    end: float | None
    query: int | None  # the SQL execution it ran for


def read(lines: Iterable[str]) -> tuple[list[Job], dict[int, float]]:
    """Jobs, and each query's start (seconds since the epoch) by its SQL execution id, from the
    event log's lines (JSON, one event each)."""
    starts: dict[int, tuple[float, int | None]] = {}
    ends: dict[int, float] = {}
    queries: dict[int, float] = {}
    for line in lines:
        if not line.startswith(_WANTED):  # tasks, stages, plans' updates: most of the log
            continue
        try:
            event = json.loads(line)
        except ValueError:  # the log's last line while Spark is writing it
            continue
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            query = (event.get("Properties") or {}).get("spark.sql.execution.id")
            starts[event["Job ID"]] = (event["Submission Time"] / 1000, int(query) if query is not None else None)
        elif kind == "SparkListenerJobEnd":
            ends[event["Job ID"]] = event["Completion Time"] / 1000
        elif kind == _SQL + "SparkListenerSQLExecutionStart":
            queries[event["executionId"]] = event["time"] / 1000
    jobs = [Job(start, ends.get(job), query) for job, (start, query) in sorted(starts.items())]
    return jobs, queries


def _busy(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of the intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def window_figures(jobs: Sequence[Job], queries: Mapping[int, float], start: float, end: float) -> dict[str, float]:
    """What ran between ``start`` and ``end``: queries started, jobs submitted, the seconds some job
    was running (a job still running at ``end`` counts up to it) and the seconds the queries that
    ran a job spent before their first one."""
    mine = [j for j in jobs if start <= j.start <= end]
    first: dict[int, float] = {}
    for j in mine:
        if j.query is not None and j.query in queries:
            first[j.query] = min(first.get(j.query, j.start), j.start)
    return {
        "queries": sum(1 for q in queries.values() if start <= q <= end),
        "jobs": len(mine),
        "job_seconds": round(_busy([(j.start, min(j.end if j.end is not None else end, end)) for j in mine]), 3),
        "before_jobs_seconds": round(sum(max(0.0, t - queries[q]) for q, t in first.items()), 3),
    }


def stage_figures(
    jobs: Sequence[Job], queries: Mapping[int, float], windows: Mapping[str, Sequence[tuple[float, float]]]
) -> dict[str, dict[str, float]]:
    """Per stage, the median over its timed runs of :func:`window_figures` and of its wall seconds;
    stages that ran no Spark job are left out."""
    out: dict[str, dict[str, float]] = {}
    for stage, runs in windows.items():
        each = [{**window_figures(jobs, queries, s, e), "seconds": e - s} for s, e in runs]
        if not each or not any(r["jobs"] for r in each):
            continue
        out[stage] = {k: round(statistics.median(r[k] for r in each), 3) for k in each[0]}
    return out


def markdown(figures: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The report's section: a row per stage."""
    if not figures:
        return []
    lines = [
        "",
        "## Spark's jobs per stage (its event log; medians of the timed runs)",
        "",
        "| stage | wall s | queries | Spark jobs | jobs running, s | before each query's first job, s | rest, s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for stage, f in figures.items():
        rest = max(0.0, f["seconds"] - f["job_seconds"] - f["before_jobs_seconds"])
        lines.append(
            f"| {stage} | {f['seconds']:.2f} | {f['queries']:.0f} | {f['jobs']:.0f} | {f['job_seconds']:.2f} "
            f"| {f['before_jobs_seconds']:.2f} | {rest:.2f} |"
        )
    lines += [
        "",
        "- Before each query's first job: from Spark's start of the query to its first job's submission "
        "(optimization, physical planning, and any work the query does first). Rest: the driver's own "
        "work outside Spark's queries (Python, Delta commits, ClickHouse inserts).",
    ]
    return lines


def figures_of(spark: SparkSession, windows: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, Any] | None:
    """The stages' figures from this session's event log; None where the session writes none."""
    path = log_file(spark)
    if path is None:
        return None
    try:  # the bench's other figures must not be lost to this one
        with path.open(encoding="utf-8", errors="replace") as lines:  # Spark may be mid-line
            jobs, queries = read(lines)
        return stage_figures(jobs, queries, windows)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("Spark's event log %s could not be read: %s", path, exc)
        return None
