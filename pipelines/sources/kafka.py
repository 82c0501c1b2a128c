"""Kafka -> bronze, exactly once, with kafka-python.

Delta is the source of truth for what was landed: every flush records, per partition, the last
offset it wrote as an app transaction ``kafka/<group>/<topic>/<partition>`` in the same commit as
the rows. On assignment the consumer seeks to the recorded offset + 1, so a crash at any point
(kill -9 included) re-reads exactly what was not committed. Kafka offset commits are made after
the Delta commit for lag monitoring only.

Several consumers of one group ("pods") may run at once. A write keeps only rows above the
offsets recorded in the snapshot it read, and commits through that snapshot, so a consumer that
lost its partitions in a rebalance cannot land them twice: either its rows are already below the
recorded offset, or its commit conflicts with the new owner's and is retried against the new
state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from bronze.landing import LANDING_SCHEMA
from pipelines.config.settings import KafkaSettings
from pipelines.errors import InputError
from pipelines.observability import KAFKA_LAG
from pipelines.storage import AppTxn, TableSpec, TableStore
from pipelines.storage.conform import conform

log = logging.getLogger("medallion.kafka")

TopicPartition = tuple[str, int]
LANDING_ARROW_SCHEMA = to_arrow_schema(LANDING_SCHEMA, timezone="UTC")


def app_id(group: str, topic: str, partition: int) -> str:
    return f"kafka/{group}/{topic}/{partition}"


def landing_rows(messages: Sequence[Any], batch_id: str, now: datetime) -> pa.Table:
    """Consumer records -> landing rows (bronze parser input)."""
    n = len(messages)
    # Kafka's timestamps are milliseconds since the epoch: cast by Arrow, not a datetime each.
    millis = pa.array([m.timestamp for m in messages], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    table = pa.table(
        {
            "value": pa.array([m.value for m in messages], pa.binary()),
            "source": pa.repeat(pa.scalar("kafka", pa.string()), n),
            "topic": pa.array([m.topic for m in messages], pa.string()),
            "partition": pa.array([m.partition for m in messages], pa.int32()),
            "offset": pa.array([m.offset for m in messages], pa.int64()),
            "kafka_timestamp": millis.cast(pa.timestamp("us", tz="UTC")),
            "ingest_time": pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), n),
            "batch_id": pa.repeat(pa.scalar(batch_id, pa.string()), n),
        }
    )
    return conform(table, LANDING_ARROW_SCHEMA)


def last_offsets(messages: Sequence[Any]) -> dict[TopicPartition, int]:
    """The highest offset per (topic, partition) among ``messages``."""
    last: dict[TopicPartition, int] = {}
    for m in messages:
        key = (m.topic, m.partition)
        if m.offset > last.get(key, -1):
            last[key] = m.offset
    return last


def write_partitions_once(
    store: TableStore, spec: TableSpec, rows: pa.Table, last_offsets: Mapping[TopicPartition, int], group: str
) -> int:
    """Append the rows of each partition above the offset ``spec`` records for it, and record the
    new last offsets in the same commit. Returns the rows written. Raises CommitConflictError when
    another writer recorded one of these partitions since the snapshot (the caller retries)."""
    apps = {tp: app_id(group, *tp) for tp in last_offsets}
    chunks: list[list[TopicPartition]] = [list(last_offsets)]
    if store.max_txns_per_commit is not None:
        n = store.max_txns_per_commit
        tps = list(last_offsets)
        chunks = [tps[i : i + n] for i in range(0, len(tps), n)]
    written = 0
    for chunk in chunks:
        snap = store.txn_snapshot(spec, [apps[tp] for tp in chunk])
        keep = None
        txns = []
        for topic, partition in chunk:
            done = snap.versions[apps[(topic, partition)]]
            last = last_offsets[(topic, partition)]
            if done is not None and done >= last:
                continue  # another consumer (or an earlier run) landed all of it
            txns.append(AppTxn(apps[(topic, partition)], last))
            mask = pc.and_(pc.equal(rows["topic"], topic), pc.equal(rows["partition"], partition))
            if done is not None:
                mask = pc.and_(mask, pc.greater(rows["offset"], done))
            keep = mask if keep is None else pc.or_(keep, mask)
        if not txns:
            continue
        part = rows.filter(keep) if keep is not None and rows.num_rows else rows.slice(0, 0)
        store.append(spec, part, txns, read_version=snap.table_version)
        written += part.num_rows
    return written


@dataclass
class FlushResult:
    messages: int = 0
    landed: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0
    partitions: int = 0


@dataclass
class IngestStats:
    flushes: int = 0
    messages: int = 0
    landed: int = 0
    quarantined: int = 0
    seconds: float = 0.0


def consumer_config(settings: KafkaSettings, client_id: str) -> dict[str, Any]:
    """kafka-python consumer settings: no auto-commit (Delta holds the offsets), earliest start."""
    session_ms = int(settings.session_timeout.total_seconds() * 1000)
    config: dict[str, Any] = {
        "bootstrap_servers": list(settings.bootstrap_servers),
        "group_id": settings.group_id,
        "client_id": client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": session_ms,
        "heartbeat_interval_ms": max(1000, session_ms // 3),
        "max_poll_interval_ms": max(300_000, session_ms * 2),
        "fetch_max_bytes": 64 * 1024 * 1024,
        "max_partition_fetch_bytes": max(8 * 1024 * 1024, settings.max_message_bytes * 2),
        "security_protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        config["sasl_mechanism"] = settings.sasl_mechanism
        config["sasl_plain_username"] = settings.sasl_username
        config["sasl_plain_password"] = settings.sasl_password.get_secret_value() if settings.sasl_password else None
    return config


class KafkaIngestor:
    """One consumer-group member landing ``topics`` into their bronze tables."""

    def __init__(
        self,
        settings: KafkaSettings,
        store: TableStore,
        targets: Mapping[str, TableSpec],
        flush: Callable[[Mapping[str, list[Any]], str], FlushResult],
        *,
        max_batch: int = 10_000,
        max_wait: float = 5.0,
        once: bool = False,
        stop: threading.Event | None = None,
        consumer_factory: Callable[..., Any] | None = None,
    ) -> None:
        if not targets:
            raise InputError("no topics to consume")
        self.settings = settings
        self.store = store
        self.targets = dict(targets)
        self.flush_fn = flush
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.once = once
        self.stop = stop or threading.Event()
        self.member = f"medallion-{uuid.uuid4().hex[:8]}"
        self._factory = consumer_factory
        self._pending: dict[TopicPartition, list[Any]] = defaultdict(list)
        self._seq = 0
        self.stats = IngestStats()
        # One flush at a time runs on this thread while the main one keeps polling: the consumer
        # (not thread-safe) stays on the main thread, the flush never touches it.
        self._flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="medallion-flush")
        self._inflight: Future[FlushResult] | None = None
        self._inflight_offsets: dict[TopicPartition, int] = {}
        self._failed: Exception | None = None

    # -- rebalance callbacks --------------------------------------------------------------------
    def position_of(self, topic: str, partition: int) -> int | None:
        """Next offset to read per Delta: recorded last offset + 1 (None: from the beginning)."""
        done = self.store.txn_version(self.targets[topic], app_id(self.settings.group_id, topic, partition))
        return None if done is None else done + 1

    def on_assigned(self, consumer: Any, assigned: Sequence[Any]) -> None:
        # Positions come from Delta: let a flush under way commit first, so they include it.
        self._finish_in_callback()
        for tp in assigned:
            position = self.position_of(tp.topic, tp.partition)
            if position is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, position)
        log.info("%s assigned %s", self.member, sorted((tp.topic, tp.partition) for tp in assigned))

    def on_revoked(self, revoked: Sequence[Any]) -> None:
        # A flush under way lands (its commit is fenced by the offsets Delta records, see
        # write_partitions_once), so the new owner's positions include it; rows not flushed yet
        # are simply dropped here, and the new owner re-reads them from Delta's offsets.
        self._finish_in_callback()
        for tp in revoked:
            self._pending.pop((tp.topic, tp.partition), None)
        log.info("%s revoked %s", self.member, sorted((tp.topic, tp.partition) for tp in revoked))

    # -- main loop ------------------------------------------------------------------------------
    def _consumer(self) -> Any:
        from kafka import KafkaConsumer
        from kafka.consumer.subscription_state import ConsumerRebalanceListener

        ingestor = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                ingestor.on_revoked(list(revoked))

            def on_partitions_assigned(self, assigned: Any) -> None:
                ingestor.on_assigned(consumer, list(assigned))

        factory = self._factory or KafkaConsumer
        consumer = factory(**consumer_config(self.settings, self.member))
        consumer.subscribe(topics=list(self.targets), listener=Listener())
        return consumer

    def _pending_count(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def _caught_up(self, consumer: Any) -> bool:
        """Every assigned partition read up to its high watermark as of the last fetch.

        The high watermark comes with each fetch response (the rebalance listener may not block
        on ListOffsets, and some brokers' ListOffsets undercount; fetches do not).
        """
        assigned = consumer.assignment()
        if not assigned:
            return False
        for tp in assigned:
            high = consumer.highwater(tp)
            if high is None or consumer.position(tp) < high:
                return False
        return True

    def flush(self, consumer: Any | None) -> FlushResult:
        """Land what is buffered now and wait for it (after any flush under way)."""
        self._finish_inflight(consumer)
        if not self._start_flush():
            return FlushResult()
        return self._finish_inflight(consumer) or FlushResult()

    def _start_flush(self) -> bool:
        """Hand the buffered messages to the flush thread; False when nothing is buffered."""
        if not self._pending_count():
            return False
        assert self._inflight is None, "one flush at a time"
        by_topic: dict[str, list[Any]] = defaultdict(list)
        for (topic, _), messages in self._pending.items():
            by_topic[topic].extend(messages)
        self._seq += 1
        self._inflight_offsets = {tp: msgs[-1].offset for tp, msgs in self._pending.items() if msgs}
        self._pending = defaultdict(list)
        self._inflight = self._flusher.submit(self.flush_fn, by_topic, f"{self.member}-{self._seq}")
        return True

    def _finish_in_callback(self) -> None:
        # kafka-python logs and swallows what a rebalance listener raises: keep a failed flush
        # for the main loop to raise.
        try:
            self._finish_inflight(None)
        except Exception as exc:
            self._failed = exc

    def _finish_inflight(self, consumer: Any | None, wait: bool = True) -> FlushResult | None:
        """Collect the flush under way (waiting for it unless ``wait`` is False): its figures, and
        its offsets committed to Kafka for monitoring. A failed flush raises here: the process
        stops, and the next one re-reads from the offsets Delta recorded."""
        if self._inflight is None or (not wait and not self._inflight.done()):
            return None
        future, self._inflight = self._inflight, None
        result = future.result()
        self.stats.flushes += 1
        self.stats.messages += result.messages
        self.stats.landed += sum(result.landed.values())
        self.stats.quarantined += result.quarantined
        if consumer is not None and self._inflight_offsets:
            self._commit_for_monitoring(consumer, self._inflight_offsets)
        self._inflight_offsets = {}
        return result

    def _commit_for_monitoring(self, consumer: Any, last: Mapping[TopicPartition, int]) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        try:
            consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o + 1, "", -1) for (t, p), o in last.items()})
        except Exception as exc:  # lag monitoring only: Delta already holds the truth
            log.warning("offset commit for monitoring failed: %s", exc)

    def run(self, idle_timeout: float = 60.0) -> IngestStats:
        """Consume until stopped (or, with ``once``, until caught up with what was there)."""
        t0 = time.perf_counter()
        consumer = self._consumer()
        last_flush = time.monotonic()
        last_activity = time.monotonic()
        try:
            while not self.stop.is_set():
                # A long poll while idle: kafka-python 3.0 drops a group join that completes while
                # the caller is outside poll(), so idle loops should spend their time inside it.
                timeout = 500 if self._pending_count() else 2000
                room = self.max_batch - self._pending_count()
                polled = consumer.poll(timeout_ms=timeout, max_records=max(1, room))
                if self._failed is not None:
                    raise self._failed
                for tp, messages in polled.items():
                    if messages:
                        self._pending[(tp.topic, tp.partition)].extend(messages)
                        last_activity = time.monotonic()
                        end = consumer.highwater(tp)  # from the fetch that brought these: no request
                        if end is not None:
                            KAFKA_LAG.labels(tp.topic, str(tp.partition)).set(max(0, end - messages[-1].offset - 1))
                self._finish_inflight(consumer, wait=False)
                full = self._pending_count() >= self.max_batch
                due = time.monotonic() - last_flush >= self.max_wait
                if full or (due and self._pending_count()):
                    # Pipelined: the batch commits on the flush thread while polling goes on. With
                    # a full buffer and a flush still under way, wait for it (back-pressure: at most
                    # two batches in memory, one landing and one filling).
                    if self._inflight is not None and full:
                        self._finish_inflight(consumer)
                    if self._inflight is None:
                        self._start_flush()
                        last_flush = time.monotonic()
                if self.once and self._caught_up(consumer):
                    break  # what is buffered or landing is finished below
                if self.once and time.monotonic() - last_activity > idle_timeout:
                    log.warning("%s: nothing assigned or received for %.0fs, stopping", self.member, idle_timeout)
                    break
            self.flush(consumer)
        finally:
            try:
                if self._inflight is not None:  # a poll failed while a flush was landing: let it land
                    with contextlib.suppress(Exception):
                        self._inflight.result()
                self._flusher.shutdown(wait=True)
                consumer.close(autocommit=False)
            except Exception as exc:  # closing must not hide the outcome
                log.warning("closing the consumer failed: %s", exc)
        self.stats.seconds = time.perf_counter() - t0
        return self.stats
