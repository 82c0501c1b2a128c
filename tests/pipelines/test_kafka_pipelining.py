"""The ingest loop with a consumer double: a batch lands on the flush thread while polling goes on,
the buffer stays bounded, and a failed flush stops the ingest with its error.

The double stands in for kafka-python only (no broker, no Spark, no Delta): the exactly-once
behaviour against a real broker and lake is in test_kafka_ingest.py.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kafka import TopicPartition

from pipelines.config.settings import load_settings
from pipelines.runtime.tables import BRONZE_EVENTS
from pipelines.sources.kafka import FlushResult, KafkaIngestor

TOPIC = "events"
TP = TopicPartition(TOPIC, 0)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    value: bytes
    timestamp: int | None = None


class Consumer:
    """One partition holding ``n`` records; serves at most ``max_records`` per poll."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.next = 0
        self.polls = 0
        self.listener: Any = None
        self.assigned = False
        self.lock = threading.Lock()

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Record]]:
        if not self.assigned:
            self.assigned = True
            self.listener.on_partitions_assigned([TP])
        with self.lock:
            self.polls += 1
            take = range(self.next, min(self.n, self.next + max_records))
            self.next += len(take)
        if not take:
            threading.Event().wait(timeout_ms / 10_000)  # a short idle wait
            return {}
        return {TP: [Record(TOPIC, 0, i, b"{}") for i in take]}

    def assignment(self) -> set[TopicPartition]:
        return {TP} if self.assigned else set()

    def highwater(self, tp: TopicPartition) -> int:
        return self.n

    def position(self, tp: TopicPartition) -> int:
        return self.next

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.next = offset

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.next = 0

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        pass

    def close(self, autocommit: bool = False) -> None:
        pass


class NoStore:
    """No offsets recorded yet: every partition starts from the beginning."""

    def txn_version(self, spec: Any, app_id: str) -> None:
        return None


def ingestor(consumer: Consumer, flush: Any, max_batch: int) -> KafkaIngestor:
    settings = load_settings(lake_root="/nonexistent", kafka={"topics": {"events": TOPIC}})
    return KafkaIngestor(
        settings.kafka,
        NoStore(),  # type: ignore[arg-type]
        {TOPIC: BRONZE_EVENTS},
        flush,
        max_batch=max_batch,
        max_wait=0.0,
        once=True,
        consumer_factory=lambda **_: consumer,
    )


def offsets(by_topic: Mapping[str, list[Record]]) -> list[int]:
    return [m.offset for m in by_topic[TOPIC]]


def test_polling_goes_on_while_a_batch_lands_and_every_record_lands_once_in_order() -> None:
    consumer = Consumer(300)
    landed: list[int] = []
    polled_during: list[bool] = []

    def flush(by_topic: Mapping[str, list[Record]], batch_id: str) -> FlushResult:
        before = consumer.polls
        # Land slowly: hold the batch until the main thread has polled again (or 1 s passes).
        for _ in range(100):
            if consumer.polls > before or consumer.next >= consumer.n:
                break
            threading.Event().wait(0.01)
        polled_during.append(consumer.polls > before)
        landed.extend(offsets(by_topic))
        return FlushResult(messages=len(by_topic[TOPIC]), landed={TOPIC: len(by_topic[TOPIC])})

    stats = ingestor(consumer, flush, max_batch=50).run(idle_timeout=10)
    assert landed == list(range(300))
    assert stats.messages == stats.landed == 300 and stats.flushes == len(polled_during) >= 6
    assert any(polled_during), "the consumer was never polled while a batch was landing"


def test_a_full_buffer_waits_for_the_batch_under_way() -> None:
    consumer = Consumer(200)
    release = threading.Event()
    buffered: list[int] = []

    def flush(by_topic: Mapping[str, list[Record]], batch_id: str) -> FlushResult:
        if not release.is_set():
            threading.Event().wait(0.5)  # the first batch lands slowly
            release.set()
        # Read from the consumer what it has handed out beyond the batch that just landed.
        buffered.append(consumer.next - (offsets(by_topic)[-1] + 1))
        return FlushResult(messages=len(by_topic[TOPIC]))

    stats = ingestor(consumer, flush, max_batch=20).run(idle_timeout=10)
    assert stats.messages == 200
    # One batch landing, at most one batch filling: never more than max_batch records beyond it.
    assert max(buffered) <= 20, buffered


def test_a_failed_flush_stops_the_ingest_with_its_error() -> None:
    consumer = Consumer(100)
    calls: list[str] = []

    def flush(by_topic: Mapping[str, list[Record]], batch_id: str) -> FlushResult:
        calls.append(batch_id)
        if len(calls) == 2:
            raise RuntimeError("the lake is read-only")
        return FlushResult(messages=len(by_topic[TOPIC]))

    with pytest.raises(RuntimeError, match="the lake is read-only"):
        ingestor(consumer, flush, max_batch=10).run(idle_timeout=10)
    assert len(calls) == 2, "no batch is handed over after one failed"
