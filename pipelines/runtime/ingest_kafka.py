"""The Kafka ingest: a consumer group's flushes landed in bronze, each partition's offsets committed
with its rows.

A flush's messages are parsed in this process where the parse is certain (:mod:`bronze.event_values`)
and by Spark otherwise, validated in Arrow, and written with their offsets (:mod:`pipelines.sources.kafka`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from bronze.landing import LANDING_COLUMNS
from pipelines.errors import InputError
from pipelines.flows import flow_names
from pipelines.runtime import quality
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.ingest import KINDS, parse_landing
from pipelines.runtime.runner import Context, run_job
from pipelines.runtime.tables import BRONZE_QUARANTINE
from pipelines.sources import kafka
from pipelines.storage.conform import conform


def land_messages(
    ctx: Context, record: RunRecord, kind: str, messages: Sequence[Any], batch_id: str, now: datetime
) -> tuple[pa.Table, pa.Table]:
    """A flush's messages -> (bronze rows, quarantine rows) in Arrow, validated.

    Events the in-process parser is sure of skip Spark (``kafka.parse_in_process``); the others,
    and every page change, are parsed by Spark. All rows are then validated in one pass.
    """
    spec = KINDS[kind]
    target, columns = spec.target, spec.columns
    landing = kafka.landing_rows(messages, batch_id, now)
    schema = target.arrow_schema
    good: list[pa.Table] = []
    bad: list[pa.Table] = []
    rest = landing
    if spec.parse_values is not None and ctx.settings.kafka.parse_in_process:
        parsed = spec.parse_values([m.value for m in messages], ctx.settings.kafka.max_message_bytes)
        if parsed.accepted:
            where = landing.take(pa.array(parsed.accepted, pa.int64()))
            fields = {**{c: parsed.rows[c] for c in parsed.rows.column_names}, **{c: where[c] for c in LANDING_COLUMNS}}
            good.append(conform(pa.table({c: fields[c] for c in columns}), schema))
        rest = landing.take(pa.array(parsed.deferred, pa.int64()))
        record.add(parsed_in_process=len(parsed.accepted), parsed_by_spark=len(parsed.deferred))
    if rest.num_rows:
        landed = parse_landing(ctx, record, kind, rest, gate=False)
        try:
            # Bounded by --max-batch: the rows of one flush, which commit with their offsets.
            good.append(conform(landed.good.toArrow(), schema))
            bad.append(conform(landed.bad.toArrow(), BRONZE_QUARANTINE.arrow_schema))
            landed.count(record)
        finally:
            landed.release()
    rows = pa.concat_tables(good) if good else schema.empty_table()
    kept, dropped = quality.gate_arrow(ctx, record, target.key, rows, kind)
    return kept, pa.concat_tables([*bad, dropped])


def topic_kinds(ctx: Context, topics: Sequence[str] | None = None) -> dict[str, str]:
    """Topic name -> bronze kind, for the configured topics (or the subset named)."""
    configured = {
        ctx.settings.kafka.topics.events: "events",
        ctx.settings.kafka.topics.page_changes: "page_changes",
    }
    if not topics:
        return configured
    unknown = [t for t in topics if t not in configured]
    if unknown:
        raise InputError(
            f"unknown topic(s) {', '.join(unknown)}: configured are {', '.join(configured)} "
            "(MEDALLION_KAFKA__TOPICS__EVENTS / __PAGE_CHANGES)"
        )
    return {t: configured[t] for t in topics}


def _land_topic(
    ctx: Context,
    record: RunRecord,
    result: kafka.FlushResult,
    kind: str,
    topic: str,
    messages: list[Any],
    batch_id: str,
    now: datetime,
) -> None:
    """One topic's messages of a flush landed, each partition's offsets committed with its rows."""
    group = ctx.settings.kafka.group_id
    # A flush's rows were born in this process (the consumer) and are bounded by
    # --max-batch: they stay in Arrow so each partition's offsets commit with them.
    good, bad = land_messages(ctx, record, kind, messages, batch_id, now)
    last = kafka.last_offsets(messages)
    # Positions come from the target's offsets alone; the quarantine's only keep a redo
    # from quarantining a row twice, so a flush with nothing to quarantine skips its commit.
    if bad.num_rows:
        kafka.write_partitions_once(ctx.store, BRONZE_QUARANTINE, bad, last, group)
    landed = kafka.write_partitions_once(ctx.store, KINDS[kind].target, good, last, group)
    result.messages += len(messages)
    result.landed[topic] = landed
    result.quarantined += bad.num_rows
    result.partitions += len(last)
    record.add(**{f"topic.{topic}.messages": len(messages), f"topic.{topic}.landed": landed})


def _flush_figures(
    ctx: Context, record: RunRecord, result: kafka.FlushResult, by_topic: Mapping[str, list[Any]], batch_id: str
) -> None:
    """A flush's figures on its event-log row, and its progress line."""
    record.rows_in = result.messages
    record.rows_out = sum(result.landed.values())
    record.add(quarantined=result.quarantined, partitions=result.partitions)
    stamps = [t for ms in by_topic.values() for m in ms if (t := getattr(m, "timestamp", None) or 0) > 0]
    if stamps:  # the Kafka time of the newest message landed: its age is what an operator alerts on
        record.add(newest_timestamp=max(stamps) / 1000)
    record.details = batch_id
    ctx.say(
        f"kafka: {result.messages:,} messages from {result.partitions} partition(s) -> "
        f"{record.rows_out:,} landed, {result.quarantined:,} quarantined"
    )


def ingest_kafka(
    ctx: Context,
    topics: Sequence[str] | None = None,
    *,
    max_batch: int = 10_000,
    max_wait: float = 5.0,
    once: bool = False,
    stop: threading.Event | None = None,
) -> kafka.IngestStats:
    """Consume the topics as one member of the consumer group, landing each flush exactly once."""
    kinds = topic_kinds(ctx, topics)
    for kind in set(kinds.values()):
        ctx.store.ensure(KINDS[kind].target)
    ctx.store.ensure(BRONZE_QUARANTINE)

    def flush(by_topic: Mapping[str, list[Any]], batch_id: str) -> kafka.FlushResult:
        result = kafka.FlushResult()

        def body(record: RunRecord) -> None:
            nonlocal result
            result = kafka.FlushResult()
            now = datetime.now(UTC)
            for topic, messages in by_topic.items():
                _land_topic(ctx, record, result, kinds[topic], topic, messages, batch_id, now)
            _flush_figures(ctx, record, result, by_topic, batch_id)

        run_job(ctx, flow_names.INGEST_KAFKA, body)
        return result

    ingestor = kafka.KafkaIngestor(
        ctx.settings.kafka,
        ctx.store,
        {topic: KINDS[kind].target for topic, kind in kinds.items()},
        flush,
        max_batch=max_batch,
        max_wait=max_wait,
        once=once,
        stop=stop,
    )
    return ingestor.run()
