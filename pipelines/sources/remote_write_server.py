"""``medallion serve remote-write``: a Prometheus / VictoriaMetrics remote-write receiver.

- ``POST /api/v1/write`` (and ``/api/v1/import``): remote write 1.0, snappy-compressed protobuf
  ``WriteRequest``; VictoriaMetrics' zstd variant after its ``?get_vm_proto_version=1`` probe.
- Answers 204 only once the samples are durable in the write-ahead log (flushed to
  ``bronze/samples`` in batches): fsynced before the answer with ``fsync: request`` (the default),
  or written to the page cache and fsynced every ``fsync_interval`` with ``fsync: interval``
  (as Prometheus' own WAL; a killed process loses nothing, a power loss up to one interval).
- 400 for undecodable bodies and out-of-range timestamps (kept in ``bronze/quarantine``), 408 for
  a body too slow, 411 without a length, 413 over a limit (body, decoded size, series, samples,
  labels), 415 for an unknown encoding or protocol version, 429 with ``Retry-After`` when the log
  is full, 503 while the receiver cannot write. Never a 5xx for bad input.
- ``GET /metrics`` (Prometheus text format) and ``GET /healthz``.

The HTTP side is aiohttp's server on one event loop: an idle or slow connection costs a file
descriptor, never a worker. A connection whose next request head is not complete within
``idle_timeout`` of opening or of its last answer is closed, and a body not received within
``body_timeout`` gets 408. Every early answer (411, 413, 415, 429) leaves the connection framed:
aiohttp reads and drops the unread body (for up to 10 s) before the next request, or closes.
Other methods get 405 with ``Allow``, unknown paths 404, a malformed request line 400; every
answer is counted in ``/metrics``.

Memory stays bounded: at most ``max_in_flight`` requests are read or decoded at once (more wait
for a turn, holding only their head), each body is capped by ``max_body_bytes`` and decodes to at
most ``max_decoded_bytes``, whose series, samples and labels are counted before they are parsed
(:func:`codec.check_shape`); what waits for Delta is on disk, capped by ``max_pending_bytes``.
Decoding and the log's fsync run on ``workers`` threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter

from pipelines import observability
from pipelines.config.settings import RemoteWriteSettings
from pipelines.sources import remote_write as codec
from pipelines.sources.remote_write_rows import request_series, sample_count, samples_of
from pipelines.sources.wal import WalFullError, WriteAheadLog
from pipelines.storage import AppTxn, TableSpec, TableStore

log = logging.getLogger("medallion.remote_write")

WRITE_PATHS = ("/api/v1/write", "/api/v1/import", "/api/v1/push")
RETRY_AFTER_SECONDS = 2
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
    ) -> None:
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
        self.metrics = Metrics()
        self.healthy = True
        self.last_error: str | None = None
        self._flush_lock = threading.Lock()

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
        Blocking (decoding, fsync): the server runs it on a worker thread."""
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
                rows = sample_count if kind == SERIES else pa.Table.__len__
                while True:
                    with self.wal.batch(kind, self.settings.flush_max_rows, rows) as (segments, batch):
                        if not segments or batch is None:
                            break
                        t0 = time.perf_counter()
                        table = samples_of(batch) if kind == SERIES else batch
                        self.store.append(spec, table, [AppTxn(app, segments[-1].seq)])
                        self.wal.remove(segments)
                        elapsed = time.perf_counter() - t0
                        written += table.num_rows
                        self.metrics.rows_flushed.inc(table.num_rows)
                        self.metrics.flush_seconds.observe(elapsed)
                        self.metrics.last_flush.set_to_current_time()
            self._queue_changed()
            return written

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
        self.wal.close()


def _metric_path(path: str) -> str:
    """The ``path`` label of a request: one of the served paths, else ``other`` (so scanners and
    garbage request lines cannot grow the metric's series without bound)."""
    path = path.rstrip("/") or "/"
    return path if path in WRITE_PATHS or path in ("/metrics", "/healthz") else "other"


def _web_response(response: Response) -> web.Response:
    headers = {k: v for k, v in response.headers.items() if k != "Connection"}
    answer = web.Response(status=response.status, body=response.body, headers=headers)
    if response.headers.get("Connection") == "close":
        answer.force_close()
    return answer


def _counting_log(receiver: Receiver) -> type[AbstractAccessLogger]:
    """An access logger that counts every answer by path and status, including the ones aiohttp
    gives itself (404, 405, 400 for a malformed request line), and logs them at debug level."""

    class CountingLog(AbstractAccessLogger):
        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            receiver.metrics.requests.labels(_metric_path(request.path), str(response.status)).inc()
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s %s %s -> %d (%.3f s)", request.remote, request.method, request.path, response.status, time
                )

        @property
        def enabled(self) -> bool:
            return True

    return CountingLog


def application(receiver: Receiver, pool: ThreadPoolExecutor) -> web.Application:
    """The receiver's routes; writes are decoded and logged on ``pool``'s threads."""
    settings = receiver.settings
    in_flight = asyncio.Semaphore(settings.max_in_flight)
    body_timeout = settings.body_timeout.total_seconds()

    async def write(request: web.Request) -> web.Response:
        early = receiver.preflight(request.query, request.headers)
        if early is not None:
            return _web_response(early)
        async with in_flight:
            try:
                async with asyncio.timeout(body_timeout):
                    body = await request.read()
            except TimeoutError:
                # Answer, then close at once: lingering to drain a slow body would hold it longer.
                message = f"body not received within {body_timeout:g} s\n".encode()
                answer = _web_response(Response(408, message, {"Connection": "close"}))
                await answer.prepare(request)
                await answer.write_eof()
                if request.transport is not None:
                    request.transport.close()
                return answer
            if len(body) != int(request.headers["Content-Length"]):
                return _web_response(Response(400, b"body shorter than Content-Length\n", {"Connection": "close"}))
            loop = asyncio.get_running_loop()
            try:
                response = await loop.run_in_executor(pool, receiver.accept, body, request.headers)
            except Exception:  # a bug, not bad input: say so, keep serving
                log.exception("unexpected error handling a write")
                response = Response(500, b"internal error\n", {"Connection": "close"})
        return _web_response(response)

    async def probe(request: web.Request) -> web.Response:
        if request.query.get("get_vm_proto_version"):
            return web.Response(text="1")
        raise web.HTTPMethodNotAllowed(request.method, ["POST", "PUT"])

    async def metrics(request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(pool, receiver.metrics_text)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        if receiver.healthy:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"flush failing: {receiver.last_error}\n")

    # Bodies over the limit are refused from Content-Length before they are read.
    app = web.Application(client_max_size=settings.max_body_bytes + 1)
    for path in WRITE_PATHS:
        for route in (path, path + "/"):
            app.router.add_post(route, write)
            app.router.add_put(route, write)
            app.router.add_get(route, probe)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


def address_family(host: str, port: int) -> socket.AddressFamily:
    """IPv4 or IPv6, as ``host`` resolves (``::1`` and ``::`` are IPv6)."""
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A bound, listening, non-blocking socket. SO_REUSEPORT lets several receiver processes bind
    one port, and the kernel spreads connections over them."""
    sock = socket.socket(address_family(host, port), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _serve_http(
    receiver: Receiver, sock: socket.socket, workers: int, stop: threading.Event, ready: Callable[[int], None]
) -> None:
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="remote-write") as pool:
        runner = web.AppRunner(
            application(receiver, pool),
            handle_signals=False,
            access_log=log,
            access_log_class=_counting_log(receiver),
            keepalive_timeout=receiver.settings.idle_timeout.total_seconds(),
            # The codec decompresses within its limits; aiohttp would inflate zstd bodies unbounded.
            auto_decompress=False,
            shutdown_timeout=receiver.settings.body_timeout.total_seconds(),
        )
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
            ready(sock.getsockname()[1])
            await asyncio.to_thread(stop.wait)
        finally:
            await runner.cleanup()  # stops listening, lets requests in flight finish


def serve(
    receiver: Receiver,
    host: str,
    port: int,
    workers: int,
    stop: threading.Event,
    ready: Callable[[int], None],
    reuse_port: bool = False,
) -> None:
    """Serve until ``stop`` is set; flush what is left before returning."""
    sock = listening_socket(host, port, reuse_port)
    flusher_stop = threading.Event()
    flusher = threading.Thread(target=receiver.flush_loop, args=(flusher_stop,), name="flusher", daemon=True)
    flusher.start()
    if receiver.settings.fsync == "interval":
        threading.Thread(target=receiver.sync_loop, args=(flusher_stop,), name="wal-sync", daemon=True).start()
    try:
        asyncio.run(_serve_http(receiver, sock, workers, stop, ready))
    finally:
        sock.close()
        flusher_stop.set()
        flusher.join(timeout=60)
        receiver.close()
