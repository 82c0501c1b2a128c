"""A real Prometheus (Debian's) scraping the long-running commands' /metrics on loopback."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.dev.services import free_port
from pipelines.sources import remote_write_series as codec
from tests.helpers import ReceiverCommand
from tests.infra.metrics_servers import Prometheus

pytestmark = pytest.mark.integration

SAMPLES_PER_BODY = 6


def body(n: int) -> bytes:
    return codec.encode(
        [
            codec.Series((("__name__", f"m{k}"), ("job", "t"), ("n", str(n))), [1_000 * n, 1_000 * n + 1], [n, k])
            for k in range(3)
        ]
    )


def query(prometheus: Prometheus, promql: str) -> list[tuple[dict[str, str], float]]:
    url = f"{prometheus.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return [(r["metric"], float(r["value"][1])) for r in result]


def wait_for(prometheus: Prometheus, promql: str, want: float, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    got = query(prometheus, promql)
    while [v for _, v in got] != [want]:
        assert time.monotonic() < deadline, f"{promql}: {got}, wanted {want}"
        time.sleep(0.5)
        got = query(prometheus, promql)


@pytest.mark.slow
def test_prometheus_scrapes_two_receiver_processes_as_one_receiver_with_no_resets(
    tmp_path: Path, prometheus_factory: Callable[..., Prometheus]
) -> None:
    """Each scrape reaches one of the two processes (SO_REUSEPORT); each answers with the sum over
    both, so the counters Prometheus stores only grow and equal what was sent."""
    lake = tmp_path / "lake"
    command = ReceiverCommand(lake, processes=2, flush_interval="1s")
    try:
        # Prometheus remote-writes nowhere (a closed port): only its scrapes reach the receiver.
        prometheus = prometheus_factory(f"http://127.0.0.1:{free_port()}/api/v1/write", [f"127.0.0.1:{command.port}"])
        wait_for(prometheus, 'up{job="node"}', 1)
        for n in range(40):  # a connection each, so the kernel spreads them over both processes
            assert command.post(body(n)) == 204
            time.sleep(0.1)  # over 4 s: several scrapes land in between
        wait_for(prometheus, "medallion_remote_write_samples_accepted_total", 40 * SAMPLES_PER_BODY)
        wait_for(prometheus, 'medallion_remote_write_requests_total{path="/api/v1/write",code="204"}', 40)
        assert [v for _, v in query(prometheus, "resets(medallion_remote_write_samples_accepted_total[5m])")] == [0.0]
        resets = query(prometheus, "resets(medallion_remote_write_requests_total[5m])")
        assert {v for _, v in resets} == {0.0} and len(resets) >= 2, resets  # the writes and the scrapes
        wait_for(prometheus, "medallion_remote_write_rows_flushed_total", 40 * SAMPLES_PER_BODY)
        wait_for(prometheus, "medallion_remote_write_queue_bytes", 0)
    finally:
        code, err = command.stop()
    assert code == 0, err
    landed = Counter(
        b.split(":")[0] for b in DeltaTable(str(lake / "bronze" / "samples")).to_pyarrow_table()["batch_id"].to_pylist()
    )
    assert set(landed) == {"default", "default.1"}  # both processes took bodies
    assert sum(landed.values()) == 40 * SAMPLES_PER_BODY
