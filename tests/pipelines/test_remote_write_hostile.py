"""The remote-write receiver under hostile input and a busy fleet: stalled and idle connections,
many keep-alive senders, decompression and structure bombs, out-of-range timestamps, early answers
that must keep a connection framed, odd methods and garbage, and a real Prometheus pushed through a
full queue.

Every server binds 127.0.0.1 and is stopped by its test; every wait has a deadline.
"""

from __future__ import annotations

import http.client
import re
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cramjam
import pyarrow.compute as pc
import pytest

from pipelines.sources import remote_write_series as codec
from tests.helpers import PROM_HEADERS, ReceiverCommand, RunningReceiver, start_receiver
from tests.infra.metrics_servers import NodeExporter, Prometheus

ZSTD_HEADERS = {"Content-Encoding": "zstd", "X-VictoriaMetrics-Remote-Write-Version": "1"}


def series_body(n: int, samples: int = 2) -> bytes:
    """A distinct, valid body: 3 series of ``samples`` samples, timestamps in 2023."""
    base = 1_700_000_000_000 + 1_000 * n
    return codec.encode(
        [
            codec.Series(
                (("__name__", f"m{k}"), ("job", "hostile"), ("n", str(n))),
                [base + i for i in range(samples)],
                [float(i) for i in range(samples)],
            )
            for k in range(3)
        ]
    )


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Callable[..., RunningReceiver]]:
    """``start(**settings) -> RunningReceiver`` in this process; stopped at teardown."""
    running: list[tuple[threading.Event, threading.Thread]] = []

    def start(**settings: object) -> RunningReceiver:
        server, stop, thread = start_receiver(tmp_path / f"lake{len(running)}", **settings)
        running.append((stop, thread))
        return server

    yield start
    for stop, thread in running:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def metric(server: RunningReceiver, path: str, code: int) -> int:
    return int(server.metric("medallion_remote_write_requests_total", path=path, code=str(code)))


def closed_by_peer(sock: socket.socket, within_s: float) -> bytes | None:
    """What ``sock`` received before the server closed it, or None if it stayed open ``within_s``."""
    got, closed = read(sock, within_s, quiet_s=None)
    return got if closed else None


def raw_exchange(port: int, data: bytes, timeout_s: float = 5) -> bytes:
    """Send ``data`` on a fresh connection, then read until the server closes it or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        return read(sock, timeout_s, quiet_s=1.0)[0]


def read(sock: socket.socket, within_s: float, quiet_s: float | None) -> tuple[bytes, bool]:
    """What ``sock`` receives within ``within_s`` (or until nothing comes for ``quiet_s``), and
    whether the server closed it."""
    sock.settimeout(quiet_s or 0.2)
    got = b""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if quiet_s is not None:
                return got, False
            continue
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False


# -- slow, stalled and idle connections --------------------------------------------------------------


@pytest.mark.parametrize("fsync", ["request", "interval"])  # bodies decoded on threads, or on the loop
def test_stalled_heads_idle_connections_and_slow_bodies_do_not_hold_back_senders(
    receiver: Callable[..., RunningReceiver], fsync: str
) -> None:
    server = receiver(idle_timeout="2s", body_timeout="2s", fsync=fsync)
    address = ("127.0.0.1", server.port)
    stalled_heads = [socket.create_connection(address) for _ in range(8)]
    for sock in stalled_heads:
        sock.sendall(b"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Enc")
    idle = [http.client.HTTPConnection(*address, timeout=10) for _ in range(8)]
    for conn in idle:  # one request each, then the connection is kept open and idle
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
    slow_bodies = [socket.create_connection(address) for _ in range(8)]
    head = "".join(f"{k}: {v}\r\n" for k, v in PROM_HEADERS.items())
    for sock in slow_bodies:
        sock.sendall(
            f"POST /api/v1/write HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 1000\r\n\r\n".encode() + b"x" * 10
        )
    try:
        # 24 connections held: four senders still land every body, each answered within a second.
        answers: list[tuple[int, float]] = []
        lock = threading.Lock()

        def send(first: int) -> None:
            conn = http.client.HTTPConnection(*address, timeout=10)
            for n in range(first, first + 10):
                t0 = time.monotonic()
                conn.request("POST", "/api/v1/write", body=series_body(n), headers=PROM_HEADERS)
                status = conn.getresponse()
                status.read()
                with lock:
                    answers.append((status.status, time.monotonic() - t0))
            conn.close()

        senders = [threading.Thread(target=send, args=(100 * i,)) for i in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
        assert [s for s, _ in answers] == [204] * 40
        assert max(seconds for _, seconds in answers) < 1.0
        t0 = time.monotonic()
        assert server.get("/healthz") == (200, b"ok\n")
        assert time.monotonic() - t0 < 1.0

        # Then the server sheds them: a stalled head or an idle connection is closed after the idle
        # timeout, a slow body gets 408 after the body timeout and is closed.
        for sock in stalled_heads:
            assert closed_by_peer(sock, within_s=5) == b""
        for sock in slow_bodies:
            answer = closed_by_peer(sock, within_s=5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
        for conn in idle:
            assert conn.sock is not None
            assert closed_by_peer(conn.sock, within_s=5) == b""
        assert metric(server, "/api/v1/write", 408) == 8
        assert metric(server, "/api/v1/write", 204) == 40
    finally:
        for sock in stalled_heads + slow_bodies:
            sock.close()
        for conn in idle:
            conn.close()
    server.receiver.flush()
    assert server.samples().num_rows == 40 * 3 * 2


@pytest.mark.parametrize("fsync", ["request", "interval"])
def test_sixteen_keep_alive_senders_each_get_a_fair_share(receiver: Callable[..., RunningReceiver], fsync: str) -> None:
    server = receiver(fsync=fsync)
    counts = [0] * 16
    first_answer = [float("inf")] * 16
    statuses: set[int] = set()
    start = threading.Barrier(16)
    run_s = 4.0

    def send(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        start.wait()
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < run_s:
            conn.request("POST", "/api/v1/write", body=series_body(10_000 * i + n), headers=PROM_HEADERS)
            response = conn.getresponse()
            response.read()
            statuses.add(response.status)
            if n == 0:
                first_answer[i] = time.monotonic() - t0
            n += 1
        counts[i] = n
        conn.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == {204}
    median = statistics.median(counts)
    assert min(counts) >= 0.5 * median, counts
    assert max(first_answer) < 2.0, first_answer


# -- bombs -------------------------------------------------------------------------------------------


def rss_mb(pid: int, field: str) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    assert m, text
    return int(m.group(1)) / 1024


@pytest.fixture
def command(tmp_path: Path) -> Iterator[ReceiverCommand]:
    """The real ``medallion serve remote-write`` in a process of its own, so its memory is its own."""
    cmd = ReceiverCommand(tmp_path / "lake", processes=1)
    yield cmd
    code, err = cmd.stop()
    assert code == 0, err


def post_timed(cmd: ReceiverCommand, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, float, float]:
    """Status, answer, seconds, and the receiver's peak RSS growth in MB while it handled ``body``."""
    Path(f"/proc/{cmd.proc.pid}/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = rss_mb(cmd.proc.pid, "VmRSS")
    conn = http.client.HTTPConnection("127.0.0.1", cmd.port, timeout=30)
    try:
        t0 = time.monotonic()
        conn.request("POST", "/api/v1/write", body=body, headers=headers)
        response = conn.getresponse()
        answer = response.read()
        seconds = time.monotonic() - t0
    finally:
        conn.close()
    return response.status, answer, seconds, rss_mb(cmd.proc.pid, "VmHWM") - before


def test_a_10_kb_zstd_body_that_decodes_to_60_million_series_gets_413_within_a_second(command: ReceiverCommand) -> None:
    bomb = bytes(cramjam.zstd.compress(b"\x0a\x00" * 60_000_000, level=19))  # 120 MB of empty series
    assert len(bomb) < 12_000
    status, answer, seconds, grown_mb = post_timed(command, bomb, ZSTD_HEADERS)
    assert status == 413, answer
    assert seconds < 1.0
    assert grown_mb < 100, grown_mb
    # The same without a declared size in the frame: only the bounded output stops it.
    compressor = cramjam.zstd.Compressor()
    compressor.compress(b"\x0a\x00" * 60_000_000)
    status, answer, seconds, grown_mb = post_timed(command, bytes(compressor.finish()), ZSTD_HEADERS)
    assert (status, seconds < 1.0, grown_mb < 100) == (413, True, True), (answer, seconds, grown_mb)
    assert command.post(series_body(1)) == 204  # and it goes on serving


def test_a_100_mb_label_value_gets_413_without_decoding_it(command: ReceiverCommand) -> None:
    series = codec.Series((("__name__", "big"), ("v", "a" * 100_000_000)), [1_700_000_000_000], [1.0])
    status, answer, seconds, grown_mb = post_timed(command, codec.encode([series]), PROM_HEADERS)
    assert status == 413 and b"limit is 33554432" in answer, answer
    assert seconds < 1.0 and grown_mb < 100, (seconds, grown_mb)


@pytest.mark.parametrize(
    ("series", "reason"),
    [
        (
            [codec.Series((("__name__", "x"), ("v", "a" * 4097)), [1_700_000_000_000], [1.0])],
            b"label value is 4097 bytes",
        ),
        ([codec.Series((("__name__", "x"), ("n" * 257, "a")), [1_700_000_000_000], [1.0])], b"label name is 257 bytes"),
        ([codec.Series(tuple((f"l{i:02d}", "a") for i in range(31)), [1_700_000_000_000], [1.0])], b"31 labels"),
    ],
)
def test_labels_over_the_limits_get_413_naming_the_limit(
    receiver: Callable[..., RunningReceiver], series: list[codec.Series], reason: bytes
) -> None:
    server = receiver()
    status, answer, _ = server.post(codec.encode(series), PROM_HEADERS)
    assert status == 413 and reason in answer, answer
    server.receiver.flush()
    assert server.samples().num_rows == 0


def test_series_and_samples_over_the_limits_get_413_before_they_are_parsed(command: ReceiverCommand) -> None:
    empty_series = bytes(cramjam.snappy.compress_raw(b"\x0a\x00" * 16_000_000))  # 32 MB: under the decoded limit
    status, answer, seconds, grown_mb = post_timed(command, empty_series, PROM_HEADERS)
    assert status == 413 and b"16000000 series; the limit is 100000" in answer, answer
    assert seconds < 5.0, seconds
    # Parsed in full, these would take about 720 MB; counted first, they take about a third of it.
    assert grown_mb < 400, grown_mb
    samples = b"\x12\x00" * 1_500_000  # one series of 1.5 million empty samples
    one_series = b"\x0a" + varint(len(samples)) + samples
    status, answer, _, _ = post_timed(command, bytes(cramjam.snappy.compress_raw(one_series)), PROM_HEADERS)
    assert status == 413 and b"1500000 samples; the limit is 1000000" in answer, answer


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# -- timestamps --------------------------------------------------------------------------------------


@pytest.mark.parametrize("timestamp_ms", [2**63 - 1, -(2**63), -1, 9_223_372_036_855])
def test_timestamps_outside_1970_to_2262_get_400_naming_the_range_and_never_wrap(
    receiver: Callable[..., RunningReceiver], timestamp_ms: int
) -> None:
    server = receiver()
    good = codec.Series((("__name__", "ok"),), [1_700_000_000_000], [1.0])
    bad = codec.Series((("__name__", "bad"),), [timestamp_ms], [1.0])
    status, answer, _ = server.post(codec.encode([good, bad]), PROM_HEADERS)
    assert status == 400
    assert f"sample timestamp {timestamp_ms} ms is outside the accepted range".encode() in answer
    assert b"1970-01-01T00:00:00.000Z .. 2262-04-11T23:47:16.854Z" in answer
    assert server.post(codec.encode([good]), PROM_HEADERS)[0] == 204
    server.receiver.flush()
    table = server.samples()
    assert table["metric_name"].to_pylist() == ["ok"]  # the refused request landed nothing
    assert table["timestamp"].to_pylist()[0].year == 2023


def test_the_timestamp_range_is_configurable(receiver: Callable[..., RunningReceiver]) -> None:
    server = receiver(min_sample_time="2024-01-01T00:00:00Z")
    old = codec.Series((("__name__", "old"),), [1_700_000_000_000], [1.0])  # 2023-11-14
    status, answer, _ = server.post(codec.encode([old]), PROM_HEADERS)
    assert status == 400 and b"(2024-01-01T00:00:00.000Z .. 2262-04-11T23:47:16.854Z)" in answer, answer


# -- framing, methods, garbage ---------------------------------------------------------------------


@pytest.mark.parametrize("fsync", ["request", "interval"])
def test_a_429_keeps_the_connection_framed_for_the_next_request(
    receiver: Callable[..., RunningReceiver], fsync: str
) -> None:
    server = receiver(max_pending_bytes=1024, fsync=fsync)
    first = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    first.request("POST", "/api/v1/write", body=series_body(1), headers=PROM_HEADERS)
    assert first.getresponse().status == 204  # an empty log takes a body of any size
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for n in range(3):  # refused from the head; the unread body must not be read as a request
        conn.request("POST", "/api/v1/write", body=series_body(2 + n), headers=PROM_HEADERS)
        response = conn.getresponse()
        assert (response.status, response.getheader("Retry-After"), response.read()) == (
            429,
            "2",
            b"write queue is full\n",
        )
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok\n"
    server.receiver.flush()
    conn.request("POST", "/api/v1/write", body=series_body(5), headers=PROM_HEADERS)
    assert conn.getresponse().status == 204  # the same connection, caught up
    conn.close()
    first.close()


def test_413_from_the_head_answers_before_the_body_is_sent(receiver: Callable[..., RunningReceiver]) -> None:
    server = receiver(max_body_bytes=2048)
    head = "".join(f"{k}: {v}\r\n" for k, v in PROM_HEADERS.items())
    answer = raw_exchange(
        server.port, f"POST /api/v1/write HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 10000000\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 413 ") and answer.endswith(b"body over 2048 bytes\n"), answer


@pytest.mark.parametrize("method", ["HEAD", "DELETE", "OPTIONS", "PATCH", "TRACE"])
def test_other_methods_get_405_with_allow(receiver: Callable[..., RunningReceiver], method: str) -> None:
    server = receiver()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(method, "/api/v1/write")
    response = conn.getresponse()
    response.read()
    assert response.status == 405
    assert {m.strip() for m in response.getheader("Allow", "").split(",")} >= {"POST", "PUT"}
    conn.close()
    assert metric(server, "/api/v1/write", 405) == 1


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32) + b"\r\n\r\n",  # a TLS hello
        b"GARBAGE\r\n\r\n",
        b"GET /\x00\x01 HTTP/1.1\r\n\r\n",
        b"POST /api/v1/write HTTP/9.9\r\nContent-Length: 1\r\n\r\nx",
        b"POST /api/v1/write HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /api/v1/write HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
        b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 20_000 + b"\r\n\r\n",
    ],
)
def test_garbage_gets_a_4xx_with_a_status_line_and_is_counted(
    receiver: Callable[..., RunningReceiver], garbage: bytes
) -> None:
    server = receiver()
    answer = raw_exchange(server.port, garbage)
    assert re.match(rb"HTTP/1\.[01] 4\d\d ", answer), answer[:200]
    time.sleep(0.2)  # answers are counted just after they are sent
    counted = [
        value
        for (name, labels), value in server.scrape().items()
        if name == "medallion_remote_write_requests_total" and dict(labels)["code"].startswith("4")
    ]
    assert sum(counted) >= 1


# -- a real Prometheus through a full queue -----------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_prometheus_through_a_full_queue_catches_up_with_nothing_lost(
    receiver: Callable[..., RunningReceiver],
    node_exporter: NodeExporter,
    prometheus_factory: Callable[..., Prometheus],
) -> None:
    """The log holds one request (1 KB), so Prometheus meets 429 on every request until a flush; it
    retries (``retry_on_http_429``) and, once flushed, catches up. Every ``up`` sample Prometheus
    stored lands in bronze once."""
    import json
    import urllib.parse
    import urllib.request

    server = receiver(max_pending_bytes=1024)
    prometheus = prometheus_factory(
        f"http://127.0.0.1:{server.port}/api/v1/write",
        [node_exporter.target],
        {"queue_config": {"retry_on_http_429": True, "max_shards": 2}},
    )
    deadline = time.monotonic() + 60
    while metric(server, "/api/v1/write", 429) < 5:  # Prometheus is being refused
        assert time.monotonic() < deadline, "no 429 within 60 s"
        time.sleep(0.5)
    for _ in range(6):  # the queue drains now and then; Prometheus catches up in between
        time.sleep(1.5)
        server.receiver.flush()
    until = time.time() - 2  # every sample up to here must be in bronze

    def prometheus_ups() -> int:
        query = urllib.parse.urlencode({"query": 'count_over_time(up{job="node"}[10m])', "time": f"{until:.3f}"})
        with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{query}", timeout=10) as response:
            result = json.load(response)["data"]["result"]
        return int(result[0]["value"][1]) if result else 0

    def landed_ups() -> int:
        server.receiver.flush()
        table = server.samples()
        ups = table.filter(pc.equal(table["metric_name"], "up"))
        times = [
            t.timestamp()
            for t, labels in zip(ups["timestamp"].to_pylist(), ups["labels"].to_pylist(), strict=True)
            if dict(labels).get("job") == "node"
        ]
        return sum(1 for t in times if t <= until)

    deadline = time.monotonic() + 60
    expected = prometheus_ups()
    while landed_ups() != expected:
        assert time.monotonic() < deadline, (landed_ups(), expected)
        time.sleep(1)
    assert expected >= 10
    assert metric(server, "/api/v1/write", 429) >= 5
    assert metric(server, "/api/v1/write", 400) == 0
