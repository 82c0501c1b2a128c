"""Prometheus metrics of the long-running commands, with prometheus_client.

- Every job run (a Kafka flush, a file landing, each job of ``medallion run``) is counted here
  when the event log records it (:func:`observe`): runs by status, rows in and out, rows
  quarantined, its duration, commit-conflict retries, and the time of its last success.
- ``ingest kafka`` also sets each partition's consumer lag and the Kafka time of the newest
  message it landed.
- ``ingest kafka --metrics-port P`` and ``run --metrics-port P`` serve :data:`REGISTRY` on
  ``/metrics`` (:func:`serve`). The remote-write receiver serves its own on its port.
- Several receiver processes (``serve remote-write --processes N``) write their values to files
  in one folder (prometheus_client's multiprocess mode, :func:`multiprocess_dir`), and each
  process's ``/metrics`` sums the folder: one scrape sees the whole receiver, whichever process
  answers, so its counters never jump back.

What an operator alerts on, with the metric to use:
``increase(medallion_job_runs_total{status="failed"}[15m]) > 0``,
``time() - medallion_job_last_success_timestamp_seconds > 900``,
``max(medallion_kafka_consumer_lag) > 100000``,
``time() - medallion_newest_row_timestamp_seconds > 600``,
``rate(medallion_job_commit_conflict_retries_total[5m]) > 0``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import multiprocess as mp

prometheus_client.disable_created_metrics()  # no *_created series: counters only, as Prometheus reads them

#: The jobs' metrics in this process.
REGISTRY = CollectorRegistry()
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

JOB_RUNS = Counter(
    "medallion_job_runs", "Job runs by job and status (ok, noop, failed).", ["job", "status"], registry=REGISTRY
)
JOB_SECONDS = Histogram(
    "medallion_job_duration_seconds", "How long a job run took.", ["job"], registry=REGISTRY, buckets=DURATION_BUCKETS
)
ROWS_IN = Counter("medallion_job_rows_in", "Rows a job read (records, for an ingest).", ["job"], registry=REGISTRY)
ROWS_OUT = Counter("medallion_job_rows_out", "Rows a job wrote (landed, for an ingest).", ["job"], registry=REGISTRY)
QUARANTINED = Counter(
    "medallion_job_rows_quarantined", "Rows a job sent to bronze/quarantine.", ["job"], registry=REGISTRY
)
CONFLICT_RETRIES = Counter(
    "medallion_job_commit_conflict_retries",
    "Runs of a job repeated after a commit conflict.",
    ["job"],
    registry=REGISTRY,
)
LAST_SUCCESS = Gauge(
    "medallion_job_last_success_timestamp_seconds",
    "When a run of the job last ended ok or noop.",
    ["job"],
    registry=REGISTRY,
)
NEWEST_ROW = Gauge(
    "medallion_newest_row_timestamp_seconds",
    "Source time (Kafka timestamp) of the newest row a job landed; its age is time() minus this.",
    ["job"],
    registry=REGISTRY,
)
KAFKA_LAG = Gauge(
    "medallion_kafka_consumer_lag",
    "Messages behind the partition's end, as of the last poll.",
    ["topic", "partition"],
    registry=REGISTRY,
)


def observe(job: str, status: str, seconds: float, rows_in: int, rows_out: int, metrics: Mapping[str, float]) -> None:
    """Count one job run (called when the event log records it)."""
    JOB_RUNS.labels(job, status).inc()
    JOB_SECONDS.labels(job).observe(seconds)
    ROWS_IN.labels(job).inc(rows_in)
    ROWS_OUT.labels(job).inc(rows_out)
    QUARANTINED.labels(job).inc(metrics.get("quarantined", 0))
    CONFLICT_RETRIES.labels(job).inc(metrics.get("conflict_retries", 0))
    if status in ("ok", "noop"):
        LAST_SUCCESS.labels(job).set_to_current_time()
    if "newest_timestamp" in metrics:
        NEWEST_ROW.labels(job).set(metrics["newest_timestamp"])


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Serve :data:`REGISTRY` on ``http://host:port/metrics`` from a thread; returns the port."""
    server, _ = prometheus_client.start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_port)


def multiprocess_dir(root: Path) -> Path:
    """A fresh folder for the values of several processes, named in the environment so that
    processes started after this call write there (set before they import prometheus_client)."""
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="metrics-", dir=root))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return folder


def exposition(registry: CollectorRegistry) -> bytes:
    """``registry`` in the text format; in multiprocess mode, the sum over every process instead."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        registry = CollectorRegistry()
        mp.MultiProcessCollector(registry, path=folder)
    return bytes(prometheus_client.generate_latest(registry))


def gauge(name: str, doc: str, registry: CollectorRegistry, **kw: Any) -> Gauge:
    """A gauge that several processes add up (``livesum``)."""
    return Gauge(name, doc, registry=registry, multiprocess_mode="livesum", **kw)
