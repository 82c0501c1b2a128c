"""The remote-write receiver over real HTTP on loopback: status codes, durability, Delta landing."""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.sources import remote_write as codec
from pipelines.sources import remote_write_server
from pipelines.sources.remote_write_receiver import LEGACY_SAMPLES
from pipelines.sources.remote_write_rows import request_series, samples_of, samples_table
from pipelines.sources.remote_write_series import Series, encode, from_series, series_id
from pipelines.sources.remote_write_server import INLINE_DECODED_BYTES
from pipelines.sources.wal import WriteAheadLog
from tests.helpers import PROM_HEADERS, RunningReceiver, start_receiver

SERIES = [
    Series((("__name__", "up"), ("instance", "a:9100"), ("job", "node")), [1_700_000_000_000], [1.0]),
    Series(
        (("__name__", "node_load1"), ("instance", "a:9100"), ("job", "node")),
        [1_700_000_000_000, 1_700_000_001_000],
        [0.5, 0.75],
    ),
]


@pytest.fixture(params=["request", "interval"])
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunningReceiver]:
    """A receiver with each request's log segment fsynced before its answer (decoded on the worker
    threads), and one that fsyncs the log every second (small bodies decoded on the event loop)."""
    running, stop, thread = start_receiver(tmp_path / "lake", fsync=request.param)
    yield running
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_prometheus_write_is_acknowledged_and_lands_every_sample(server: RunningReceiver) -> None:
    status, _, _ = server.post(encode(SERIES), PROM_HEADERS)
    assert status == 204
    table = server.samples()
    rows = sorted(
        zip(table["metric_name"].to_pylist(), table["value"].to_pylist(), table["source"].to_pylist(), strict=True)
    )
    assert rows == [("node_load1", 0.5, "prometheus"), ("node_load1", 0.75, "prometheus"), ("up", 1.0, "prometheus")]
    labels = dict(table.filter(pc.equal(table["metric_name"], "up"))["labels"].to_pylist()[0])
    assert labels == {"__name__": "up", "instance": "a:9100", "job": "node"}
    ids = set(table["series_id"].to_pylist())
    assert ids == {series_id(s.labels) for s in SERIES}


def test_samples_table_rows_written_out_by_hand() -> None:
    """One row per sample; a series' name is its last __name__ label; series without samples add nothing."""
    body = encode(
        [
            Series((("job", "a"), ("__name__", "x")), [1_000, 2_000], [1.5, -0.0]),
            Series((("job", "b"),), [3_000], [2.0]),
            Series((("__name__", "gone"),), [], []),
            Series((("__name__", "first"), ("__name__", "second")), [4_000], [3.0]),
        ]
    )
    now = datetime(2026, 1, 1, tzinfo=UTC)
    table = samples_table(codec.decode(body, codec.SNAPPY, 1 << 20), "prometheus", "b1", now)
    rows = [
        (r["metric_name"], r["labels"], r["timestamp"], r["value"], r["ingest_time"], r["source"], r["batch_id"])
        for r in table.to_pylist()
    ]
    at = [datetime(1970, 1, 1, 0, 0, s, tzinfo=UTC) for s in (1, 2, 3, 4)]
    assert rows == [
        ("x", [("__name__", "x"), ("job", "a")], at[0], 1.5, now, "prometheus", "b1"),
        ("x", [("__name__", "x"), ("job", "a")], at[1], -0.0, now, "prometheus", "b1"),
        (None, [("job", "b")], at[2], 2.0, now, "prometheus", "b1"),
        ("second", [("__name__", "first"), ("__name__", "second")], at[3], 3.0, now, "prometheus", "b1"),
    ]
    assert table["series_id"].to_pylist() == [
        series_id(labels)
        for labels in [(("job", "a"), ("__name__", "x"))] * 2
        + [(("job", "b"),), (("__name__", "first"), ("__name__", "second"))]
    ]


def test_requests_flushed_together_keep_their_own_source_batch_and_arrival() -> None:
    """The log holds each request's series with its tags; one flush builds the rows of many."""
    first, second = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    up = Series((("__name__", "up"), ("job", "a")), [1_000, 2_000], [1.0, 0.0])
    batch = pa.concat_tables(
        [
            request_series(from_series([up]), "prometheus", "p1", first),
            request_series(from_series([up, Series((("job", "b"),), [3_000], [7.0])]), "vm", "v1", second),
        ]
    )
    table = samples_of(batch)
    rows = [(r["metric_name"], r["value"], r["ingest_time"], r["source"], r["batch_id"]) for r in table.to_pylist()]
    assert rows == [
        ("up", 1.0, first, "prometheus", "p1"),
        ("up", 0.0, first, "prometheus", "p1"),
        ("up", 1.0, second, "vm", "v1"),
        ("up", 0.0, second, "vm", "v1"),
        (None, 7.0, second, "vm", "v1"),
    ]
    up_id = series_id(up.labels)
    assert table["series_id"].to_pylist() == [up_id] * 4 + [series_id((("job", "b"),))]


def test_sample_rows_logged_by_an_earlier_version_land_after_an_upgrade(tmp_path: Path) -> None:
    """Segments of sample rows (the log's earlier form) are flushed before the series after them."""
    lake = tmp_path / "lake"
    wal = WriteAheadLog(lake / "_wal", 1 << 30)
    legacy = samples_table(from_series(SERIES[:1]), "prometheus", "old", datetime(2026, 1, 1, tzinfo=UTC))
    wal.append(LEGACY_SAMPLES, legacy)
    wal.close()
    running, stop, thread = start_receiver(lake)
    try:
        body = encode(SERIES[1:])
        assert running.post(body, PROM_HEADERS)[0] == 204
        table = running.samples()
        new = "default:" + hashlib.sha256(body).hexdigest()[:16]
        assert sorted(zip(table["batch_id"].to_pylist(), table["value"].to_pylist(), strict=True)) == [
            (new, 0.5),
            (new, 0.75),
            ("old", 1.0),
        ]
        assert running.receiver.wal.segments() == []
    finally:
        stop.set()
        thread.join(30)


def test_victoriametrics_probe_then_zstd_is_accepted(server: RunningReceiver) -> None:
    assert server.get("/api/v1/write?get_vm_proto_version=1") == (200, b"1")
    headers = {"Content-Encoding": "zstd", "X-VictoriaMetrics-Remote-Write-Version": "1"}
    assert server.post(encode(SERIES, codec.ZSTD), headers)[0] == 204
    assert server.post(encode(SERIES, codec.ZSTD), headers, path="/api/v1/import")[0] == 204
    assert set(server.samples()["source"].to_pylist()) == {"victoriametrics"}


def test_bad_requests_get_the_right_4xx_and_bodies_go_to_quarantine(server: RunningReceiver) -> None:
    assert server.post(b"\x00garbage", PROM_HEADERS)[0] == 400
    truncated = encode(SERIES)[:-3]
    assert server.post(truncated, PROM_HEADERS)[0] == 400
    assert server.post(encode(SERIES), {**PROM_HEADERS, "Content-Encoding": "gzip"})[0] == 415
    assert server.post(encode(SERIES), {**PROM_HEADERS, "X-Prometheus-Remote-Write-Version": "2.0.0"})[0] == 415
    assert server.get("/nope")[0] == 404
    server.receiver.flush()
    quarantine = DeltaTable(str(server.lake / "bronze" / "quarantine")).to_pyarrow_table()
    assert quarantine.num_rows == 2
    assert set(quarantine["kind"].to_pylist()) == {"remote_write"}
    assert b"\x00garbage" in quarantine["raw"].to_pylist()


def test_oversized_body_gets_413_and_a_full_queue_gets_429_with_retry_after(tmp_path: Path) -> None:
    running, stop, thread = start_receiver(tmp_path / "lake", max_body_bytes=2048, max_pending_bytes=4096)
    try:
        assert running.post(b"x" * 4096, PROM_HEADERS)[0] == 413
        body = encode(SERIES)
        statuses = [running.post(body, PROM_HEADERS) for _ in range(30)]
        assert {s for s, _, _ in statuses} == {204, 429}
        assert all(h.get("Retry-After") == "2" for s, _, h in statuses if s == 429)
        running.receiver.flush()  # the queue drains into Delta ...
        assert running.post(body, PROM_HEADERS)[0] == 204  # ... and takes writes again
    finally:
        stop.set()
        thread.join(30)


@pytest.mark.parametrize("fsync", ["request", "interval"])
def test_acknowledged_samples_survive_a_crash_before_the_flush(tmp_path: Path, fsync: str) -> None:
    lake = tmp_path / "lake"
    running, stop, thread = start_receiver(lake, fsync=fsync)
    assert running.post(encode(SERIES), PROM_HEADERS)[0] == 204
    # Simulate a crash: no flush, the process is gone; only the write-ahead log remains.
    running.receiver.flush = lambda: 0  # type: ignore[method-assign]
    stop.set()
    thread.join(30)
    assert not DeltaTable(str(lake / "bronze" / "samples")).to_pyarrow_table().num_rows
    again, stop2, thread2 = start_receiver(lake, fsync=fsync)
    try:
        assert again.samples().num_rows == 3
        again.receiver.flush()
        assert again.samples().num_rows == 3  # replayed once, not twice
    finally:
        stop2.set()
        thread2.join(30)


def test_a_body_too_large_for_the_event_loop_is_decoded_on_a_worker_and_lands(tmp_path: Path) -> None:
    """With ``fsync: interval`` small snappy bodies are decoded on the event loop, larger ones (by
    their declared decoded size) and zstd ones on the worker threads; every kind lands whole."""
    running, stop, thread = start_receiver(tmp_path / "lake", fsync="interval")
    accept, handled_on = running.receiver.accept, []

    def recording(body: bytes, headers: object) -> object:
        handled_on.append(threading.current_thread().name)
        return accept(body, headers)

    running.receiver.accept = recording  # type: ignore[method-assign]
    try:
        rng = random.Random(5)
        big = [
            Series(
                (("__name__", "m"), ("i", str(i))),
                [1_700_000_000_000 + k for k in range(4)],
                [rng.random() for _ in range(4)],
            )
            for i in range(30_000)
        ]
        body = encode(big)
        assert codec.inline_size(body, "snappy") > INLINE_DECODED_BYTES >= codec.inline_size(encode(SERIES), "snappy")
        assert running.post(body, PROM_HEADERS)[0] == 204
        assert running.post(encode(SERIES), PROM_HEADERS)[0] == 204
        zstd = {"Content-Encoding": "zstd", "X-VictoriaMetrics-Remote-Write-Version": "1"}
        assert running.post(encode(SERIES, "zstd"), {**PROM_HEADERS, **zstd})[0] == 204
        on_worker = [name.startswith("remote-write") for name in handled_on]
        assert on_worker == [True, False, True], handled_on  # big, small (the loop's thread), zstd
        table = running.samples()
        # The zstd body repeats the small one's samples: they land once.
        assert table.num_rows == 30_000 * 4 + 3
        assert set(table.filter(pc.equal(table["metric_name"], "m"))["series_id"].to_pylist()) == {
            series_id(s.labels) for s in big
        }
    finally:
        stop.set()
        thread.join(30)


def test_on_asyncio_s_own_loop_where_uvloop_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_write_server, "_loop_factory", lambda: None)
    running, stop, thread = start_receiver(tmp_path / "lake", fsync="interval")
    try:
        assert running.post(encode(SERIES), PROM_HEADERS)[0] == 204
        assert running.post(b"\x00garbage", PROM_HEADERS)[0] == 400
        assert running.samples().num_rows == 3
    finally:
        stop.set()
        thread.join(30)


def test_metrics_and_healthz(server: RunningReceiver) -> None:
    server.post(encode(SERIES), PROM_HEADERS)
    server.post(b"junk", PROM_HEADERS)
    assert server.metric("medallion_remote_write_samples_accepted_total") == 3
    assert server.metric("medallion_remote_write_bodies_rejected_total") == 1
    assert server.metric("medallion_remote_write_requests_total", path="/api/v1/write", code="204") == 1
    assert server.metric("medallion_remote_write_requests_total", path="/api/v1/write", code="400") == 1
    scraped = server.scrape()
    assert scraped[("medallion_remote_write_queue_bytes", ())] > 0  # both bodies wait in the log
    assert scraped[("medallion_remote_write_queue_segments", ())] == 2
    server.receiver.flush()
    assert server.metric("medallion_remote_write_rows_flushed_total") == 4  # 3 samples, 1 quarantined body
    assert server.metric("medallion_remote_write_flush_seconds_count") == 2  # the samples and the quarantine
    scraped = server.scrape()
    assert scraped[("medallion_remote_write_queue_bytes", ())] == 0
    assert scraped[("medallion_remote_write_queue_segments", ())] == 0
    assert server.get("/healthz") == (200, b"ok\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(max_size=512),
    encoding=st.sampled_from(["snappy", "zstd", "gzip", "", "SNAPPY"]),
)
def test_no_body_or_encoding_gets_a_5xx(server: RunningReceiver, body: bytes, encoding: str) -> None:
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": encoding}
    status, _, _ = server.post(body, headers)
    assert status in (204, 400, 413, 415)


def test_cli_serves_until_sigterm_and_flushes_what_it_acknowledged(tmp_path: Path) -> None:
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    from deltalake import DeltaTable

    from tests.helpers import RunningReceiver

    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    env |= {"MEDALLION_LAKE_ROOT": str(lake), "MEDALLION_REMOTE_WRITE__FLUSH_INTERVAL": "1h"}
    cmd = [sys.executable, "-m", "pipelines.app.cli", "serve", "remote-write", "--port", "0"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            m = re.search(r"http://127\.0\.0\.1:(\d+)/api/v1/write", proc.stderr.readline())
            port = int(m.group(1)) if m else None
        assert port, "the receiver did not say where it listens"
        client = RunningReceiver(None, port, lake)  # type: ignore[arg-type]
        assert client.post(encode(SERIES), PROM_HEADERS)[0] == 204
        assert client.get("/healthz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    # The flush interval is an hour: only the shutdown flush can have put the samples in Delta.
    assert DeltaTable(str(lake / "bronze/samples")).to_pyarrow_table().num_rows == 3


def test_an_append_that_finishes_after_a_later_one_is_not_taken_for_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent requests may finish out of order. The flusher records the highest segment it
    landed, and a restart drops everything at or below it, so it must never land segment 2 while
    segment 1 is still being written."""
    import os
    import threading

    from pipelines.config.settings import load_settings
    from pipelines.sources.remote_write_processes import open_receiver
    from pipelines.sources.remote_write_receiver import SERIES as SERIES_KIND
    from pipelines.storage.deltars import DeltaRsStore

    lake = tmp_path / "lake"
    receiver = open_receiver(load_settings(lake_root=str(lake)), DeltaRsStore(None, str(lake)))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first, second = (
        request_series(from_series([s]), "prometheus", name, now) for s, name in zip(SERIES, ("b1", "b2"), strict=True)
    )
    entered, release = threading.Event(), threading.Event()
    replace = os.replace

    def slow_first(src: str, dst: str) -> None:
        if str(dst).endswith("000000000001.series.arrow"):
            entered.set()
            release.wait(30)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", slow_first)
    writer = threading.Thread(target=receiver.wal.append, args=(SERIES_KIND, first))
    writer.start()
    assert entered.wait(30)
    receiver.wal.append(SERIES_KIND, second)  # number 2, done while number 1 is still being written
    receiver.flush()
    release.set()
    writer.join(30)
    receiver.flush()
    receiver.close()
    table = DeltaTable(str(lake / "bronze" / "samples")).to_pyarrow_table()
    assert sorted(table["batch_id"].to_pylist()) == ["b1", "b2", "b2"]


def test_with_fsync_interval_the_log_is_synced_every_interval(tmp_path: Path) -> None:
    running, stop, thread = start_receiver(tmp_path / "lake", fsync="interval", fsync_interval="0.2s")
    synced = threading.Event()
    wal_sync = running.receiver.wal.sync

    def sync() -> None:
        wal_sync()
        synced.set()

    running.receiver.wal.sync = sync  # type: ignore[method-assign]
    try:
        assert running.receiver.wal.fsync_each is False
        assert running.post(encode(SERIES), PROM_HEADERS)[0] == 204
        assert synced.wait(5)
    finally:
        stop.set()
        thread.join(30)


def test_batches_land_in_order_and_a_failed_commit_leaves_it_and_the_later_ones_for_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flusher builds the next batch while the last one is written; the commits still go one
    after another, each recording the last segment it holds, so a commit that fails leaves its
    segments and every later one in the log, and the next flush lands them once."""
    from pipelines.config.settings import load_settings
    from pipelines.sources.remote_write_processes import open_receiver
    from pipelines.sources.remote_write_receiver import SERIES as SERIES_KIND
    from pipelines.storage.deltars import DeltaRsStore

    lake = tmp_path / "lake"
    settings = load_settings(lake_root=str(lake), remote_write={"flush_max_rows": 3})
    store = DeltaRsStore(None, str(lake))
    receiver = open_receiver(settings, store)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(1, 6):  # 3 samples each (a minute apart from the last request's): one request to a batch
        later = [Series(s.labels, [t + n * 60_000 for t in s.timestamps_ms], s.values) for s in SERIES]
        receiver.wal.append(SERIES_KIND, request_series(from_series(later), "prometheus", f"b{n}", now))
    append, commits = store.append, []

    def third_fails(spec: object, table: pa.Table, txns: list) -> int:  # type: ignore[type-arg]
        commits.append(txns[0].version)
        if len(commits) == 3:
            raise OSError("storage went away")
        return append(spec, table, txns)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "append", third_fails)
    with pytest.raises(OSError, match="storage went away"):
        receiver.flush()
    assert commits == [1, 2, 3]  # in order, and nothing after the failure
    assert [s.seq for s in receiver.wal.segments()] == [3, 4, 5]
    assert receiver.flush() == 9
    assert commits == [1, 2, 3, 3, 4, 5]
    receiver.close()
    table = DeltaTable(str(lake / "bronze" / "samples")).to_pyarrow_table()
    assert sorted(table["batch_id"].to_pylist()) == sorted(f"b{n}" for n in range(1, 6) for _ in range(3))
    assert receiver.store.txn_version(receiver.samples_spec, receiver.app_samples) == 5
