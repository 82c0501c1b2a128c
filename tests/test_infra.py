"""The real-server test infrastructure, exercised for real: a broker, Prometheus, node-exporter, vmagent.

These tests pin down what later integration tests rely on (group rebalances, what Prometheus and
vmagent put on the wire), so a change of Tansu or of a Debian package shows up here first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from kafka import TopicPartition

from pipelines.dev.services import KafkaBroker, free_port
from tests.infra.broker import ConsumerThread
from tests.infra.common import unique_name, wait_until
from tests.infra.http_recorder import HttpRecorder, RecordedRequest
from tests.infra.metrics_servers import NodeExporter, Prometheus, VmAgent

pytestmark = pytest.mark.integration

REMOTE_WRITE_HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def _is_write(req: RecordedRequest) -> bool:
    return req.method == "POST" and req.path == "/api/v1/write" and bool(req.body)


@pytest.fixture
def recorder() -> Iterator[HttpRecorder]:
    with HttpRecorder() as rec:
        yield rec


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ------------------------------------------------------------------------------------------------
# Kafka
# ------------------------------------------------------------------------------------------------


def test_kafka_produce_end_offsets_and_read_back(kafka_broker: KafkaBroker) -> None:
    topic = unique_name("infra-produce")
    kafka_broker.create_topic(topic, partitions=3)

    written = kafka_broker.produce(topic, [b"a0", b"a1", b"a2", b"a3"], partition=0)
    kafka_broker.produce(topic, [b"b0", b"b1"], partition=2, key=b"k")

    assert written == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert kafka_broker.end_offsets(topic) == {0: 4, 1: 0, 2: 2}
    records = kafka_broker.consume_all(topic)
    assert [(p, o, v) for p, o, _, v in records] == [
        (0, 0, b"a0"),
        (0, 1, b"a1"),
        (0, 2, b"a2"),
        (0, 3, b"a3"),
        (2, 0, b"b0"),
        (2, 1, b"b1"),
    ]
    assert {k for p, _, k, _ in records if p == 2} == {b"k"}


def test_kafka_end_offsets_survive_batched_producers(kafka_broker: KafkaBroker) -> None:
    """A batching producer (as pipeline code uses) makes Tansu's ListOffsets undercount; ours does not."""
    from kafka import KafkaProducer

    topic = unique_name("infra-batched")
    kafka_broker.create_topic(topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", linger_ms=50)
    for i in range(5):
        producer.send(topic, value=b"%d" % i, partition=0)
    producer.flush()
    producer.close()

    assert kafka_broker.end_offsets(topic) == {0: 5}


def test_kafka_group_commit_seek_and_rebalance(kafka_broker: KafkaBroker) -> None:
    topic, group = unique_name("infra-group"), unique_name("infra-group")
    kafka_broker.create_topic(topic, partitions=4)
    for p in range(4):
        kafka_broker.produce(topic, [b"%d-%d" % (p, i) for i in range(5)], partition=p)
    config = kafka_broker.consumer_config(group)

    first = ConsumerThread(config, topic)
    second: ConsumerThread | None = None
    try:
        # Tansu holds every JoinGroup ~3 s, so the first assignment takes ~3.2 s.
        wait_until(lambda: len(first.records) == 20, 15, "first member reading all records")
        assert first.partitions() == {0, 1, 2, 3}
        first.run(lambda c: c.commit())
        committed = first.run(lambda c: {tp.partition: c.committed(tp) for tp in c.assignment()})
        assert committed == {0: 5, 1: 5, 2: 5, 3: 5}

        # seek() rewinds an assigned partition; end_offsets() answers from the consumer too.
        tp0 = TopicPartition(topic, 0)
        first.run(lambda c: c.seek(tp0, 3))
        wait_until(lambda: first.records.count((0, 4)) == 2, 10, "re-reading partition 0 after seek")
        assert first.run(lambda c: c.end_offsets([tp0])) == {tp0: 5}

        # A second member: heartbeat (<= 2 s) + Tansu's join hold (~3 s) -> split in ~5 s.
        second = ConsumerThread(config, topic)
        members = (first, second)

        def split() -> bool:
            a, b = (m.partitions() for m in members)
            return bool(a and b) and a | b == {0, 1, 2, 3} and not a & b

        took = wait_until(split, 20, "rebalance between two members")
        print(f"rebalance took {took:.1f}s")

        # Each member resumes its partitions at the committed offset 5, not at the earliest (0).
        for p in range(4):
            kafka_broker.produce(topic, [b"late"], partition=p)
        owned = {p: m for m in members for p in m.partitions()}
        wait_until(lambda: all((p, 5) in m.records for p, m in owned.items()), 10, "late records")
        assert all((p, 0) not in second.records for p in range(4))
    finally:
        first.close()
        if second is not None:
            second.close()


_CRASHING_MEMBER = """
import json, sys
from kafka import KafkaConsumer
consumer = KafkaConsumer(**json.loads(sys.argv[1]))
consumer.subscribe([sys.argv[2]])
while True:
    consumer.poll(timeout_ms=200)
"""


@pytest.mark.slow
def test_kafka_group_reassigns_partitions_of_a_killed_member(kafka_broker: KafkaBroker) -> None:
    """A SIGKILLed member leaves no LeaveGroup: its partitions move after the 6 s session timeout."""
    topic, group = unique_name("infra-crash"), unique_name("infra-crash")
    kafka_broker.create_topic(topic, partitions=2)
    config = kafka_broker.consumer_config(group)
    survivor = ConsumerThread(config, topic)
    victim = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_MEMBER, json.dumps(config), topic], stdout=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: len(survivor.partitions()) == 1, 20, "split between survivor and victim")
        victim.kill()
        victim.wait(5)
        took = wait_until(lambda: survivor.partitions() == {0, 1}, 20, "reassignment after the kill")
        print(f"partitions of the killed member reassigned after {took:.1f}s")
        assert took >= 4  # not before the session timeout (minus a heartbeat): it really was a crash
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(5)
        survivor.close()


# ------------------------------------------------------------------------------------------------
# Prometheus, node-exporter, vmagent
# ------------------------------------------------------------------------------------------------


def test_node_exporter_serves_metrics(node_exporter: NodeExporter) -> None:
    import urllib.request

    with urllib.request.urlopen(node_exporter.url, timeout=5) as resp:
        body = resp.read()
    assert b"node_exporter_build_info" in body
    assert b"node_systemd" not in body  # collector off: no systemd here


def test_prometheus_remote_writes_to_receiver(
    node_exporter: NodeExporter, prometheus_factory: Callable[..., Prometheus], recorder: HttpRecorder
) -> None:
    t0 = time.monotonic()
    prometheus_factory(f"{recorder.url}/api/v1/write", [node_exporter.target])

    # First POST ~6 s after start: the remote-write WAL watcher's first pass takes ~5.5 s.
    first, _ = recorder.wait_for(_is_write, count=2, timeout_s=20)
    print(f"first remote-write POST after {first.at - t0:.1f}s")
    for name, value in REMOTE_WRITE_HEADERS.items():
        assert first.headers.get(name) == value, first.headers
    assert first.headers.get("User-Agent", "").startswith("Prometheus/")


def test_vmagent_remote_writes_prometheus_protocol(
    node_exporter: NodeExporter, vmagent_factory: Callable[..., VmAgent]
) -> None:
    """Debian's vmagent 1.79.5 speaks plain Prometheus remote-write, even to a VM-protocol receiver."""
    with HttpRecorder(vm_proto_version="1") as rec:
        t0 = time.monotonic()
        vmagent_factory(f"{rec.url}/api/v1/write", [node_exporter.target])
        first, _ = rec.wait_for(_is_write, count=2, timeout_s=15)
        print(f"first vmagent POST after {first.at - t0:.1f}s")
        for name, value in REMOTE_WRITE_HEADERS.items():
            assert first.headers.get(name) == value, first.headers
        assert first.headers.get("User-Agent") == "vmagent"
        assert not any("get_vm_proto_version" in r.query for r in rec.requests)
