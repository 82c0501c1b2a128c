"""A recording HTTP receiver on loopback, to see what real clients (Prometheus, vmagent) send."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from pipelines.dev.services import LOOPBACK


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    at: float = field(repr=False)  # time.monotonic() on arrival


class HttpRecorder:
    """A loopback HTTP server that records every request and answers 204 (or a fixed probe answer).

    It stands in for a remote-write receiver when a test wants to see exactly what Prometheus or
    vmagent put on the wire. ``vm_proto_version`` answers VictoriaMetrics' ``?get_vm_proto_version=1``
    probe (GET or POST) with that body; None answers it 404 like a plain Prometheus receiver.
    """

    def __init__(self, *, vm_proto_version: str | None = None, status: int = 204) -> None:
        self.vm_proto_version = vm_proto_version
        self.status = status
        self._requests: list[RecordedRequest] = []
        self._cond = threading.Condition()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.started_at = 0.0

    @property
    def port(self) -> int:
        assert self._server is not None, "recorder not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._requests)

    def _record(self, req: RecordedRequest) -> None:
        with self._cond:
            self._requests.append(req)
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[RecordedRequest], bool], count: int = 1, timeout_s: float = 15.0
    ) -> list[RecordedRequest]:
        """The first ``count`` matching requests; raises TimeoutError with what did arrive."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                matched = [r for r in self._requests if predicate(r)]
                if len(matched) >= count:
                    return matched[:count]
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(r.method, r.path) for r in self._requests[:10]]
                    raise TimeoutError(f"{len(matched)}/{count} matching requests in {timeout_s}s; saw {seen}")
                self._cond.wait(left)

    def start(self) -> Self:
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real receivers do

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                recorder._record(
                    RecordedRequest(self.command, split.path, query, dict(self.headers), body, time.monotonic())
                )
                if "get_vm_proto_version" in query:
                    if recorder.vm_proto_version is None:
                        self._reply(404, b"")
                    else:
                        self._reply(200, recorder.vm_proto_version.encode())
                    return
                self._reply(recorder.status, b"")

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body:
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the recorded requests are the log

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-recorder", daemon=True)
        self._thread.start()
        self.started_at = time.monotonic()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
