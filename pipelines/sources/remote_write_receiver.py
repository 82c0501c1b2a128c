"""The remote-write receiver's protocol logic, apart from its HTTP server
(:mod:`pipelines.sources.remote_write_server`), so tests and the bench can call it directly: the
answer a write gets from its head (:meth:`Receiver.preflight`) and from its body
(:meth:`Receiver.accept`: decoded, checked against the limits and made durable in the write-ahead
log, or kept in quarantine), the flusher that moves the log to ``bronze/samples`` and
``bronze/quarantine``, and the receiver's metrics.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter

from pipelines import observability
from pipelines.config.settings import RemoteWriteSettings
from pipelines.runtime.eventlog import EventLog, new_run_id
from pipelines.sources import remote_write as codec
from pipelines.sources.remote_write_repeats import REASONS, Claimed, LandedKeys
from pipelines.sources.remote_write_rows import request_series, sample_count, samples_of
from pipelines.sources.remote_write_series import SeriesIds
from pipelines.sources.wal import Segment, WalFullError, WriteAheadLog
from pipelines.storage import AppTxn, TableSpec, TableStore

log = logging.getLogger("medallion.remote_write")

RETRY_AFTER_SECONDS = 2
#: The event log's job for a flush that dropped repeated samples.
REPEATS_JOB = "remote_write.repeats"
# Kinds of write-ahead log segment: a request's tagged series, a rejected body, and sample rows
# (what earlier versions logged; still flushed after an upgrade).
SERIES, QUARANTINE, LEGACY_SAMPLES = "series", "quarantine", "samples"


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class Metrics:
    """The receiver's metrics (prometheus_client), in a registry of its own. With several receiver
    processes their values go to the shared multiprocess folder, and ``/metrics`` sums them."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = PromCounter(
            "medallion_remote_write_requests", "Requests by path and status code.", ["path", "code"], registry=r
        )
        self.samples_accepted = PromCounter(
            "medallion_remote_write_samples_accepted", "Samples made durable.", registry=r
        )
        self.bodies_rejected = PromCounter(
            "medallion_remote_write_bodies_rejected", "Bodies refused after reading (kept in quarantine).", registry=r
        )
        self.flush_seconds = Histogram(
            "medallion_remote_write_flush_seconds", "Time to write a batch to Delta.", registry=r, buckets=FLUSH_BUCKETS
        )
        self.flush_errors = PromCounter(
            "medallion_remote_write_flush_errors", "Flushes that failed and were retried.", registry=r
        )
        self.rows_flushed = PromCounter("medallion_remote_write_rows_flushed", "Rows written to Delta.", registry=r)
        self.samples_repeated = PromCounter(
            "medallion_remote_write_samples_repeated",
            "Samples not landed: their (series, timestamp) landed before, with the same value (duplicate) or "
            "another (conflicting_value; the first wins).",
            ["reason"],
            registry=r,
        )
        for reason in REASONS:
            self.samples_repeated.labels(reason)
        self.samples_replayed = PromCounter(
            "medallion_remote_write_samples_replayed",
            "Samples landed from the log after a flush that claimed them stopped before its commit.",
            registry=r,
        )
        self.repeat_horizon = Gauge(
            "medallion_remote_write_repeat_horizon_seconds",
            "How long a landed sample's (series, timestamp) is remembered (shorter than remote_write.repeat_horizon "
            "when remote_write.repeat_keys filled first).",
            registry=r,
            multiprocess_mode="min",
        )
        self.queue_bytes = observability.gauge(
            "medallion_remote_write_queue_bytes", "Bytes in the write-ahead log not yet in Delta.", r
        )
        self.queue_segments = observability.gauge(
            "medallion_remote_write_queue_segments", "Log segments not yet in Delta.", r
        )
        self.last_flush = Gauge(
            "medallion_remote_write_last_flush_timestamp_seconds",
            "When a flush to Delta last succeeded.",
            registry=r,
            multiprocess_mode="max",
        )

    def text(self) -> bytes:
        return observability.exposition(self.registry)


FLUSH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Receiver:
    """The protocol logic, independent of the HTTP server so tests can call it directly."""

    def __init__(
        self,
        settings: RemoteWriteSettings,
        store: TableStore,
        samples: TableSpec,
        quarantine: TableSpec,
        wal_dir: Path,
        keys_dir: Path | None = None,
    ) -> None:
        """``keys_dir``: the folder of the landed keys the receivers of one lake share (default:
        ``<wal_dir>.keys``)."""
        self.settings = settings
        self.store = store
        self.samples_spec = samples
        self.quarantine_spec = quarantine
        self.app_samples = f"remote-write/{settings.receiver_id}"
        self.app_quarantine = f"remote-write/{settings.receiver_id}/quarantine"
        for spec in (samples, quarantine):
            store.ensure(spec)
        committed = max(
            store.txn_version(samples, self.app_samples) or 0,
            store.txn_version(quarantine, self.app_quarantine) or 0,
        )
        self.wal = WriteAheadLog(
            wal_dir, settings.max_pending_bytes, first_seq=committed + 1, fsync_each=settings.fsync == "request"
        )
        self.limits = settings.limits()
        self.landed = LandedKeys(
            keys_dir or wal_dir.with_name(f"{wal_dir.name}.keys"),
            settings.receiver_id,
            settings.repeat_horizon,
            # A generation takes a whole batch: up to flush_max_rows, and the request that fills it.
            max(settings.repeat_keys, settings.flush_max_rows + settings.max_samples_per_request),
        )
        self.metrics = Metrics()
        self.metrics.repeat_horizon.set(self.landed.horizon_in_force)
        self.healthy = True
        self.last_error: str | None = None
        self._flush_lock = threading.Lock()
        self._series_ids = SeriesIds()  # the flusher's, under the lock
        # Commits run on one long-lived thread: the store keeps a table per thread and brings it up
        # to date with the commits since, where a new thread would load the table whole.
        self._lander = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lander")

    # -- requests -------------------------------------------------------------------------------
    def preflight(self, query: Mapping[str, Any], headers: Any) -> Response | None:
        """The answer a write gets from its head alone (probe, protocol, encoding, length, a full
        queue), or None when its body is to be read and passed to :meth:`accept`."""
        if query.get("get_vm_proto_version"):
            return Response(200, b"1", {"Content-Type": "text/plain"})
        version = headers.get("X-Prometheus-Remote-Write-Version", "")
        content_type = headers.get("Content-Type", "") or ""
        if version and not version.startswith(("0.", "1.")):
            return Response(415, f"remote write version {version} is not supported (1.0 is)\n".encode())
        if "proto=io.prometheus.write.v2" in content_type:
            return Response(415, b"remote write 2.0 messages are not supported (1.0 is)\n")
        encoding = (headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in (codec.SNAPPY, codec.ZSTD):
            return Response(
                415, f"unsupported Content-Encoding {encoding or '(none)'!r}: use snappy or zstd\n".encode()
            )
        length_header = headers.get("Content-Length")
        if length_header is None:
            return Response(411, b"Content-Length is required\n")
        try:
            length = int(length_header)
        except ValueError:
            return Response(400, b"bad Content-Length\n", {"Connection": "close"})
        if length < 0:
            return Response(400, b"bad Content-Length\n", {"Connection": "close"})
        if length > self.settings.max_body_bytes:
            return Response(413, f"body over {self.settings.max_body_bytes} bytes\n".encode())
        if not self.wal.has_room(length):
            return Response(429, b"write queue is full\n", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        return None

    def accept(self, body: bytes, headers: Any) -> Response:
        """Decode a write's body, check it against the limits and log it: 204 once durable.
        Blocking (decoding, and the fsync with ``fsync: request``): the server runs it on a worker
        thread, or on its event loop for a small body with ``fsync: interval``."""
        encoding = (headers.get("Content-Encoding") or "").strip().lower()
        vm = encoding == codec.ZSTD or bool(headers.get("X-VictoriaMetrics-Remote-Write-Version"))
        source = "victoriametrics" if vm else "prometheus"
        now = datetime.now(UTC)
        batch_id = f"{self.settings.receiver_id}:{hashlib.sha256(body).hexdigest()[:16]}"
        try:
            series = codec.decode(body, encoding, self.settings.max_decoded_bytes, self.limits)
        except codec.RemoteWriteError as exc:
            self._quarantine(body, str(exc), source, now, batch_id)
            return Response(exc.status, f"{exc}\n".encode())
        samples = sample_count(series)
        try:
            if samples:
                self.wal.append(SERIES, request_series(series, source, batch_id, now))
        except WalFullError:
            return Response(429, b"write queue is full\n", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        except OSError as exc:
            log.error("cannot write the write-ahead log: %s", exc)
            return Response(503, b"cannot store samples now\n", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.metrics.samples_accepted.inc(samples)
        self._queue_changed()
        return Response(204)

    def _quarantine(self, body: bytes, reason: str, source: str, now: datetime, batch_id: str) -> None:
        self.metrics.bodies_rejected.inc()
        row = {
            "kind": "remote_write",
            "raw": body,
            "reason": reason,
            "expectation": None,
            "source": source,
            "ingest_time": now,
            "batch_id": batch_id,
        }
        schema = self.quarantine_spec.arrow_schema
        try:
            self.wal.append(QUARANTINE, pa.Table.from_pylist([row], schema=schema))
        except (WalFullError, OSError) as exc:
            log.error("could not keep a rejected body (%d bytes) in quarantine: %s", len(body), exc)

    # -- flushing -------------------------------------------------------------------------------
    def flush(self) -> int:
        """Move waiting segments to Delta; returns rows written. Safe to call from any thread.

        Sample rows are built here, for a whole batch of requests at once, from the series the
        log holds. Segments of sample rows (what earlier versions logged) land first: they were
        written before any series segment, so the app transaction's version only moves forward.
        """
        with self._flush_lock:
            written = 0
            for kind, spec, app in (
                (LEGACY_SAMPLES, self.samples_spec, self.app_samples),
                (SERIES, self.samples_spec, self.app_samples),
                (QUARANTINE, self.quarantine_spec, self.app_quarantine),
            ):
                done = self.store.txn_version(spec, app) or 0
                stale = [s for s in self.wal.segments(kind) if s.seq <= done]
                if stale:  # landed before a crash, not yet deleted
                    self.wal.remove(stale)
                written += self._land_all(kind, spec, app)
            self._queue_changed()
            return written

    def _land_all(self, kind: str, spec: TableSpec, app: str) -> int:
        """Land the segments of ``kind`` in order, a batch at a time. The next batch is read and its
        rows built while the last one is written (delta-rs encodes and writes without the
        interpreter lock, on its own threads), and each commit waits for the one before, so the
        app transaction's version only moves forward. A failed commit stops the rest: its segments
        and the later ones stay in the log for the next flush."""
        rows = sample_count if kind == SERIES else pa.Table.__len__
        written = 0
        landing: Future[int] | None = None

        def wait_for_more() -> bool:
            """A batch not yet full waits for the write under way, then takes what arrived
            meanwhile: small batches would each pay a commit."""
            if landing is None or landing.done():
                return False
            wait([landing])
            return True

        try:
            for segments, batch, counts in self.wal.batches(kind, self.settings.flush_max_rows, rows, wait_for_more):
                table = samples_of(batch, self._series_ids) if kind == SERIES else batch
                claimed = None
                if kind != QUARANTINE:  # sample rows: each (series, timestamp) lands once
                    table, claimed = self._first_of_each(segments, counts, table)
                if landing is not None:
                    written += landing.result()
                landing = self._lander.submit(self._land, spec, app, segments, table, claimed)
            if landing is not None:
                written += landing.result()
        except BaseException as exc:
            # The next flush must not start behind a commit still under way: wait for it, and say
            # if it failed too, which the error raised here would otherwise hide.
            if landing is not None and (error := landing.exception()) is not None and error is not exc:
                log.error("a commit to %s failed as well: %s", spec.key, error)
            raise
        return written

    def _first_of_each(self, segments: list[Segment], counts: list[int], table: pa.Table) -> tuple[pa.Table, Claimed]:
        """The batch's samples whose (series, timestamp) no receiver of the lake landed before
        (:mod:`~pipelines.sources.remote_write_repeats`), claimed before they are committed."""
        claimed = self.landed.claim(
            table.column("series_id").to_numpy(),
            pc.cast(table.column("timestamp"), pa.int64()).to_numpy(),
            table.column("value").to_numpy(),
            np.repeat(np.array([s.seq for s in segments], np.int64), counts),
        )
        self.metrics.repeat_horizon.set(self.landed.horizon_in_force)
        if claimed.repeated:
            table = table.filter(pa.array(claimed.keep))
        return table, claimed

    def _land(
        self, spec: TableSpec, app: str, segments: list[Segment], table: pa.Table, claimed: Claimed | None = None
    ) -> int:
        t0 = time.perf_counter()
        self.store.append(spec, table, [AppTxn(app, segments[-1].seq)])
        self.wal.remove(segments)
        self.metrics.rows_flushed.inc(table.num_rows)
        self.metrics.flush_seconds.observe(time.perf_counter() - t0)
        self.metrics.last_flush.set_to_current_time()
        if claimed is not None and (claimed.repeated or claimed.replayed):
            self._count_repeats(segments, table.num_rows, claimed)
        return int(table.num_rows)

    def _count_repeats(self, segments: list[Segment], landed: int, claimed: Claimed) -> None:
        """A landed batch's repeats (and replayed samples) on ``/metrics`` and in the event log:
        they come after a sender's resend or a receiver's restart, so a row per such batch is few."""
        for reason, count in claimed.by_reason().items():
            self.metrics.samples_repeated.labels(reason).inc(count)
        self.metrics.samples_replayed.inc(claimed.replayed)
        log.info(
            "remote write: %d repeated samples not landed (%s), %d landed from a replay of the log",
            claimed.repeated,
            ", ".join(f"{k} {v}" for k, v in claimed.by_reason().items()),
            claimed.replayed,
        )
        now = datetime.now(UTC)
        row = {
            "run_id": new_run_id(),
            "job": REPEATS_JOB,
            "started_at": now,
            "ended_at": now,
            "status": "ok",
            "rows_in": landed + claimed.repeated,
            "rows_out": landed,
            "metrics": {
                **{f"samples_repeated_{k}": float(v) for k, v in claimed.by_reason().items()},
                "samples_replayed": float(claimed.replayed),
            },
            "details": f"{self.settings.receiver_id}: log segments {segments[0].seq}-{segments[-1].seq}",
            "error": None,
        }
        EventLog(self.store).write(row)  # logs, never raises: the samples are landed

    def flush_loop(self, stop: threading.Event) -> None:
        interval = self.settings.flush_interval.total_seconds()
        while not stop.wait(interval):
            self._flush_guarded()
        self._flush_guarded()

    def sync_loop(self, stop: threading.Event) -> None:
        """With ``fsync: interval``: make what was acknowledged durable every ``fsync_interval``."""
        interval = self.settings.fsync_interval.total_seconds()
        while not stop.wait(interval):
            try:
                self.wal.sync()
            except OSError as exc:
                log.error("cannot fsync the write-ahead log: %s", exc)

    def _flush_guarded(self) -> None:
        try:
            self.flush()
            self.healthy, self.last_error = True, None
        except Exception as exc:  # keep serving; segments stay on disk and are retried
            self.healthy, self.last_error = False, str(exc)
            self.metrics.flush_errors.inc()
            log.error("flush to Delta failed (will retry): %s", exc)

    # -- observability --------------------------------------------------------------------------
    def _queue_changed(self) -> None:
        self.metrics.queue_bytes.set(self.wal.pending_bytes)
        self.metrics.queue_segments.set(self.wal.pending_segments)

    def metrics_text(self) -> bytes:
        self._queue_changed()
        return self.metrics.text()

    def close(self) -> None:
        self._lander.shutdown(wait=True)
        self.wal.close()
        self.landed.close()
