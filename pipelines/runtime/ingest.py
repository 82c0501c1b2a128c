"""The ingest runner: land files and Kafka messages in bronze as they came, each batch exactly once.

The ingest flows (``ingest.kafka``, ``ingest_file.<kind>``) start at the edge: a consumer group or
files given on the command line. What each kind lands is its :class:`Kind`, bronze's parse and
checks (Context-free, in bronze/); this module reads the source, gates the parsed rows and commits
them with their offsets or file digests, as :mod:`pipelines.runtime.incremental` does for the other flows.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from bronze.event_values import ParsedValues, parse_event_values
from bronze.events import BRONZE_EVENTS_COLUMNS, duplicate_keys, parse_events
from bronze.landing import LANDING_COLUMNS, REASON, quarantined, valid
from bronze.page_changes import BRONZE_PAGE_CHANGES_COLUMNS, parse_page_changes
from pipelines.config.spark import observed_as_read
from pipelines.errors import InputError
from pipelines.flows import flow_names
from pipelines.runtime import quality
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.progress import append_once
from pipelines.runtime.runner import Context, run_job
from pipelines.runtime.tables import BRONZE_EVENTS, BRONZE_PAGE_CHANGES, BRONZE_QUARANTINE
from pipelines.sources import kafka
from pipelines.sources.files import LandingFile, compression_of, file_digests, landing_rows
from pipelines.storage import AppTxn, TableSpec
from pipelines.storage.conform import conform


@dataclass(frozen=True)
class Kind:
    """What bronze lands for one kind of document: its table, its parse and columns, and what of
    bronze's checks it adds."""

    target: TableSpec
    #: ``(max_bytes, notation)`` -> landing rows -> parsed rows (with ``REASON`` for the ones
    #: quarantined); the notation of the numbers in the property documents the parse builds.
    parse: Callable[[int, str], Callable[[DataFrame], DataFrame]]
    columns: list[str]
    #: Parsed rows -> whether the row's document repeats a key (counted as ``duplicate_keys``).
    repeats_keys: Callable[[DataFrame], Column] | None = None
    #: Parses message values in this process (``kafka.parse_in_process``), without Spark.
    parse_values: Callable[[Sequence[bytes | None], int, str], ParsedValues] | None = None


KINDS = {
    "events": Kind(
        BRONZE_EVENTS,
        parse_events,
        BRONZE_EVENTS_COLUMNS,
        repeats_keys=lambda parsed: duplicate_keys(parsed["raw"]),
        parse_values=parse_event_values,
    ),
    "page_changes": Kind(
        BRONZE_PAGE_CHANGES, lambda max_bytes, _: parse_page_changes(max_bytes), BRONZE_PAGE_CHANGES_COLUMNS
    ),
}


@dataclass
class Landed:
    """Landing rows parsed once: rows for the bronze table and rows for the quarantine.

    Both derive from one cached parse. The pass that fills the cache counts the rows parsed and
    the documents that repeat a key as it reads them (``DataFrame.observe``): :meth:`count` them
    once a first action has read the rows, then :meth:`release` the cache.
    """

    good: DataFrame
    bad: DataFrame
    cached: DataFrame
    observed: Callable[[], dict[str, Any]]
    #: Whether a pass has read the rows (the gate's): the figures are then known.
    read: bool = False
    #: Good rows the gate's ``drop`` checks moved to ``bad`` (at most: a row failing two counts twice).
    dropped: int = 0

    @functools.cached_property
    def figures(self) -> dict[str, Any]:
        """The observed figures, taken once (where no pass gave them, one query counts them)."""
        return self.observed()

    def none_bad(self) -> bool:
        """Whether the batch is known to hold no row for the quarantine, with no pass of its own."""
        return self.read and not self.dropped and not self.figures["bad"]

    def count(self, record: RunRecord) -> int:
        """The rows parsed (good and bad); the repeated keys go into ``record``."""
        figures = self.figures
        if "duplicate_keys" in figures:
            record.incr(duplicate_keys=int(figures["duplicate_keys"]))
        return int(figures["rows"])

    def release(self) -> None:
        self.cached.unpersist()


def parse_landing(
    ctx: Context, record: RunRecord, kind: str, landing: pa.Table | DataFrame, gate: bool = True
) -> Landed:
    """Landing rows -> the rows for the bronze table of ``kind`` and for the quarantine, one parse.

    The parsed rows are validated with the bronze table's suite (unless ``gate`` is False: the
    caller validates them); rows a ``drop`` expectation removes join the quarantine rows, so both
    land in the same commits as the batch.
    """
    spec = KINDS[kind]
    target = spec.target
    rows = ctx.spark.createDataFrame(landing) if isinstance(landing, pa.Table) else landing
    parsed = rows.transform(spec.parse(ctx.settings.kafka.max_message_bytes, ctx.settings.bronze.number_notation))
    counted = {"rows": F.count(F.lit(1)), "bad": F.count_if(F.col(REASON).isNotNull())}
    if spec.repeats_keys is not None:
        counted["duplicate_keys"] = F.count_if(F.col(REASON).isNull() & spec.repeats_keys(parsed))
    observed, figures = observed_as_read(parsed, **counted)
    parsed = observed.persist()
    landed = Landed(valid(parsed, spec.columns), quarantined(parsed, kind), parsed, figures)
    if gate and quality.enabled(ctx):
        try:
            checked = quality.run_suite(ctx, record, quality.suite_for(ctx, target.key).for_batches(), landed.good)
        except BaseException:
            landed.release()  # a failing gate: nothing is written, and the cache is not the caller's
            raise
        landed.good, landed.read, landed.dropped = checked.kept, True, checked.dropped_rows
        if checked.dropped is not None:
            landed.bad = landed.bad.unionByName(quality.to_quarantine(checked.dropped, kind))
    return landed


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
        settings = ctx.settings
        parsed = spec.parse_values(
            [m.value for m in messages], settings.kafka.max_message_bytes, settings.bronze.number_notation
        )
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


def _of(files: Sequence[tuple[LandingFile, AppTxn]]) -> Column:
    return F.col("source_file").isin([str(b.path) for b, _ in files])


def _rows_by_file(rows: DataFrame) -> dict[str, int]:
    # One row per landed file: a figure, not row data.
    return {r["source_file"]: int(r["count"]) for r in rows.groupBy("source_file").count().collect()}


def _files_to_land(
    ctx: Context, record: RunRecord, kind: str, readable: Sequence[Path]
) -> list[tuple[LandingFile, AppTxn]]:
    """The files not landed before (by content), each with the app transaction that records it;
    a file landed before, or twice in this call, is counted as skipped."""
    target = KINDS[kind].target
    files: list[tuple[LandingFile, AppTxn]] = []
    for f in file_digests(readable):
        txn = AppTxn(f"medallion/ingest-file/{kind}/{f.digest}", 0, once=True)
        seen = any(b.digest == f.digest for b, _ in files)
        if seen or ctx.store.txn_version(target, txn.app_id) is not None:
            record.incr(files_skipped=1)
            continue
        files.append((f, txn))
    return files


def _commit_files(
    ctx: Context, record: RunRecord, target: TableSpec, files: Sequence[tuple[LandingFile, AppTxn]], landed: Landed
) -> tuple[int, int]:
    """The landed rows of ``files`` committed with their files' transactions; (good, quarantined)."""
    # Quarantined rows per file (one small row per file): files with none get no quarantine
    # commit. A batch the gate's pass showed to hold none needs no query for it.
    bad_by_file = {} if landed.none_bad() else _rows_by_file(landed.bad)
    n_bad = sum(bad_by_file.values())
    # Every parsed row is good or quarantined (a dropped row is one, not the other): the pass
    # that filled the cache counted them, so the good rows need no count of their own.
    n_good = landed.count(record) - n_bad
    # As many files per commit as the engine records app transactions in one. Quarantine
    # rows go first, under their own files' transactions, so a redo after a crash between
    # the two commits finds them recorded and does not quarantine them twice.
    step = ctx.store.max_txns_per_commit or len(files)
    for i in range(0, len(files), step):
        group = files[i : i + step]
        bad = [
            (b, t)
            for b, t in group
            if bad_by_file.get(str(b.path)) and ctx.store.txn_version(BRONZE_QUARANTINE, t.app_id) is None
        ]
        if bad:
            ctx.store.append(BRONZE_QUARANTINE, landed.bad.where(_of(bad)), [t for _, t in bad])
        append_once(ctx.store, target, landed.good.where(_of(group)), [t for _, t in group])
    return n_good, n_bad


def ingest_files(ctx: Context, kind: str, paths: Sequence[Path]) -> RunRecord:
    """Land JSON-lines / JSON-array files into bronze, idempotently per file content."""
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")
    target = KINDS[kind].target
    # A compressed file is refused by name; the other files of the call still land.
    refused = {p: why for p in paths if (why := compression_of(Path(p))) is not None}
    readable = [p for p in paths if p not in refused]

    def body(record: RunRecord) -> None:
        for spec in (target, BRONZE_QUARANTINE):
            ctx.store.ensure(spec)
        if refused:
            record.add(files_refused=len(refused))
        now = datetime.now(UTC)
        files = _files_to_land(ctx, record, kind, readable)
        if not files:
            record.noop("every file was landed before" if readable else "no file could be read")
            return
        # Spark reads the files and splits them into records: no row passes through the driver.
        landing = landing_rows(ctx.spark, [f for f, _ in files], now)
        landed = parse_landing(ctx, record, kind, landing)
        try:
            n_good, n_bad = _commit_files(ctx, record, target, files, landed)
        finally:
            landed.release()
        record.rows_in = n_good + n_bad
        record.rows_out = n_good
        record.add(files=len(files), quarantined=n_bad)
        ctx.say(f"landed {n_good:,} {kind} from {len(files)} file(s), {n_bad:,} quarantined")

    record = run_job(ctx, flow_names.ingest_file(kind), body)
    if refused:
        path, why = next(iter(refused.items()))
        more = f" (and {len(refused) - 1} more file(s))" if len(refused) > 1 else ""
        raise InputError(f"{path}: not landed, {why}{more}; the other files were landed ({record.status})")
    return record


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
