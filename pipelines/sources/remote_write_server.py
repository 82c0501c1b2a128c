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
(:func:`pipelines.sources.remote_write.check_shape`); what waits for Delta is on disk, capped by
``max_pending_bytes``.

Where a write is handled: with ``fsync: interval``, a snappy body that declares at most
:data:`INLINE_DECODED_BYTES` decoded (what Prometheus sends by default: a few thousand samples,
about 100 KB) is decoded and logged on the event loop itself, about a millisecond of work whose log
write goes to the page cache, not through an fsync. Handing it to a thread would cost more than the
work: each hand-off is two switches of the interpreter lock, and a profile of the receiver under
four keep-alive senders showed a third of its CPU time in the kernel's task switching. Larger
bodies, zstd bodies (whose declared size may lie), and every body with ``fsync: request`` (which
waits on the disk) are decoded and logged on ``workers`` threads, off the event loop. The loop is
uvloop's where it is installed (Linux, macOS), asyncio's otherwise.

This module is the HTTP side; what each write is answered, the log and the flusher are the
:class:`~pipelines.sources.remote_write_receiver.Receiver`'s.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST

from pipelines.sources import remote_write as codec
from pipelines.sources.remote_write_receiver import Receiver, Response

log = logging.getLogger("medallion.remote_write")

WRITE_PATHS = ("/api/v1/write", "/api/v1/import", "/api/v1/push")
#: With ``fsync: interval``, snappy bodies that decode to at most this many bytes are handled on the
#: event loop (see above): at most a few milliseconds of decoding for the other connections to wait.
INLINE_DECODED_BYTES = 256 * 1024


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


async def _accept(receiver: Receiver, pool: ThreadPoolExecutor, body: bytes, headers: Any) -> Response:
    """:meth:`Receiver.accept` on the event loop for a small body with ``fsync: interval``, on a
    worker thread otherwise (see the module's docstring)."""
    if (
        receiver.settings.fsync == "interval"
        and codec.inline_size(body, headers.get("Content-Encoding")) <= INLINE_DECODED_BYTES
    ):
        return receiver.accept(body, headers)
    return await asyncio.get_running_loop().run_in_executor(pool, receiver.accept, body, headers)


def application(receiver: Receiver, pool: ThreadPoolExecutor) -> web.Application:
    """The receiver's routes; writes are decoded and logged on the loop or on ``pool``'s threads."""
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
            try:
                response = await _accept(receiver, pool, body, request.headers)
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


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed: less of the interpreter lock per request."""
    try:
        import uvloop
    except ImportError:  # Windows, or not installed: asyncio's own loop
        return None
    return uvloop.new_event_loop


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
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve_http(receiver, sock, workers, stop, ready))
    finally:
        sock.close()
        flusher_stop.set()
        flusher.join(timeout=60)
        receiver.close()
