"""Real Prometheus and node-exporter (Debian packages) remote-writing into the receiver on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.helpers import RunningReceiver, start_receiver
from tests.infra.metrics_servers import NodeExporter, Prometheus, VmAgent

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver(tmp_path) -> Iterator[RunningReceiver]:  # type: ignore[no-untyped-def]
    running, stop, thread = start_receiver(tmp_path / "lake")
    yield running
    stop.set()
    thread.join(30)


def wait_for_samples(receiver: RunningReceiver, ready: Callable[[pa.Table], bool], timeout_s: float = 45) -> pa.Table:
    deadline = time.monotonic() + timeout_s
    table = receiver.samples()
    while not ready(table):
        if time.monotonic() > deadline:
            names = sorted(set(table["metric_name"].to_pylist()))[:20]
            raise AssertionError(f"samples not in bronze within {timeout_s}s; got {table.num_rows} rows of {names}")
        time.sleep(1)
        table = receiver.samples()
    return table


def label_sets(table: pa.Table, metric: str) -> list[dict[str, str]]:
    return [dict(m) for m in table.filter(pc.equal(table["metric_name"], metric))["labels"].to_pylist()]


def test_prometheus_remote_write_lands_up_and_node_metrics_with_job_and_instance(
    receiver: RunningReceiver,
    node_exporter: NodeExporter,
    prometheus_factory: Callable[..., Prometheus],
) -> None:
    prometheus_factory(f"http://127.0.0.1:{receiver.port}/api/v1/write", [node_exporter.target])

    def ready(t: pa.Table) -> bool:
        names = set(t["metric_name"].to_pylist())
        return "up" in names and "node_cpu_seconds_total" in names and "node_load1" in names

    table = wait_for_samples(receiver, ready)
    ups = label_sets(table, "up")
    assert {"job": "node", "instance": node_exporter.target, "__name__": "up"} in ups
    node = label_sets(table, "node_cpu_seconds_total")
    assert all(lbl["job"] == "node" and lbl["instance"] == node_exporter.target for lbl in node)
    assert {lbl["mode"] for lbl in node} >= {"idle", "user", "system"}
    up_values = table.filter(pc.equal(table["metric_name"], "up"))["value"].to_pylist()
    assert set(up_values) <= {0.0, 1.0} and 1.0 in up_values
    assert set(table["source"].to_pylist()) == {"prometheus"}
    assert receiver.get("/healthz")[0] == 200


def test_vmagent_remote_write_lands_node_metrics(
    receiver: RunningReceiver,
    node_exporter: NodeExporter,
    vmagent_factory: Callable[..., VmAgent],
) -> None:
    vmagent_factory(f"http://127.0.0.1:{receiver.port}/api/v1/write", [node_exporter.target])
    table = wait_for_samples(receiver, lambda t: "node_load1" in set(t["metric_name"].to_pylist()))
    assert all(lbl.get("instance") == node_exporter.target for lbl in label_sets(table, "node_load1"))


def test_prometheus_cpu_seconds_give_plausible_rates_by_mode(
    spark,  # type: ignore[no-untyped-def]
    receiver: RunningReceiver,
    node_exporter: NodeExporter,
    prometheus_factory: Callable[..., Prometheus],
) -> None:
    """Real node_cpu_seconds_total through panes and windows: a non-negative rate per mode, at most
    the machine's CPU count (CPU seconds per second), with idle and user time present."""
    import os

    from pipelines.app.metric_queries import query
    from pipelines.config.settings import load_settings
    from pipelines.runtime import passes
    from pipelines.runtime.runner import Context
    from pipelines.storage import open_store

    prometheus_factory(f"http://127.0.0.1:{receiver.port}/api/v1/write", [node_exporter.target])

    def enough(t: pa.Table) -> bool:
        cpu = t.filter(pc.equal(t["metric_name"], "node_cpu_seconds_total"))
        if cpu.num_rows == 0:
            return False
        span = pc.max(cpu["timestamp"]).as_py() - pc.min(cpu["timestamp"]).as_py()
        return span.total_seconds() >= 8

    wait_for_samples(receiver, enough, timeout_s=60)
    aggregation = {
        "name": "cpu",
        "selector": "node_cpu_seconds_total",
        "window": "4s",
        "slide": "2s",
        "accumulators": ["increase", "count"],
        "grouping_labels": ["mode"],
        "allowed_lateness": "0s",
    }
    settings = load_settings(lake_root=str(receiver.lake), metrics={"aggregations": [aggregation]})
    ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark))
    passes.silver_metric_panes(ctx, drain=True)
    passes.gold_metric_windows(ctx)
    rows = query(ctx, "cpu", group_by=["mode"], include_open=False)
    assert rows, "no closed windows"
    assert {r["mode"] for r in rows} >= {"idle", "user", "system"}
    cpus = os.cpu_count() or 1
    for r in rows:
        assert 0 <= r["rate"] <= cpus * 1.5, r  # scrape jitter stretches a window's deltas a little
    assert any(r["rate"] > 0 for r in rows if r["mode"] == "idle")
    assert any(r["rate"] > 0 for r in rows if r["mode"] == "user")
