"""The bench's remote-write peers: real VictoriaMetrics and Prometheus (Debian's), started and
stopped by the bench on loopback, counting what they stored by their own counters."""

from __future__ import annotations

import http.client
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.dev.bench.ingest_remote_write import OWN_COUNTERS, counter_value, wait_counted
from pipelines.dev.bench.peers import PEERS, PROMETHEUS, VICTORIA_METRICS, Peer, PeerKind
from pipelines.sources import remote_write_series as codec
from tests.helpers import PROM_HEADERS
from tests.infra.apt import ensure_apt_packages
from tests.infra.common import require_or_skip

pytestmark = pytest.mark.integration

T0 = 1_717_200_000_000


def body() -> bytes:
    """Two metrics whose other labels are the same, 3 samples each, out of order in one series
    (which Prometheus counts apart)."""
    return codec.encode(
        [
            codec.Series((("__name__", "a_total"), ("job", "j")), [T0 + 30_000, T0, T0 + 15_000], [3.0, 1.0, 2.0]),
            codec.Series((("__name__", "b_total"), ("job", "j")), [T0, T0 + 15_000, T0 + 30_000], [1.0, 2.0, 3.0]),
        ]
    )


@pytest.mark.parametrize("kind", PEERS, ids=lambda k: k.name)
def test_a_peer_counts_every_sample_it_was_sent_then_stops(tmp_path: Path, kind: PeerKind) -> None:
    reason = ensure_apt_packages(kind.package)
    if reason is not None:
        require_or_skip(f"{kind.name} unavailable: {reason}")
    with Peer(kind, tmp_path / kind.binary) as peer:
        conn = http.client.HTTPConnection("127.0.0.1", peer.port, timeout=10)
        conn.request("POST", "/api/v1/write", body=body(), headers=PROM_HEADERS)
        response = conn.getresponse()
        assert (response.status, response.read()) == (204, b"")
        conn.close()
        counter = OWN_COUNTERS[kind.name]
        assert wait_counted(f"{peer.url}/metrics", counter, 6, kind.name, timeout=30) == 6
        time.sleep(0.5)  # nothing counted twice
        assert counter_value(f"{peer.url}/metrics", counter) == 6
    assert peer.proc.poll() is not None  # stopped on leaving the block


def test_a_missing_peer_says_how_to_install_it() -> None:
    absent = replace(VICTORIA_METRICS, binary="victoria-metrics-not-installed")
    assert absent.missing() == (
        "`victoria-metrics-not-installed` is not installed (Debian: apt-get install victoria-metrics)"
    )
    assert replace(PROMETHEUS, binary="prometheus-not-installed").missing() == (
        "`prometheus-not-installed` is not installed (Debian: apt-get install prometheus)"
    )
