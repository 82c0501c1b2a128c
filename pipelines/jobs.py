"""The jobs: each wires read -> transform -> write for one step, exactly once.

Bronze lands files; silver buckets events and deduplicates page changes; gold fans events out
into partial counts (stage 1), merges them (stage 2) and exports count differences to ClickHouse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bronze.events import BRONZE_EVENTS_COLUMNS, parse_events
from bronze.landing import quarantined, valid
from bronze.page_changes import BRONZE_PAGE_CHANGES_COLUMNS, parse_page_changes
from gold.counters import (
    COUNTERS_SCHEMA,
    FLUSH_ON,
    FLUSH_UPDATE,
    FLUSH_WHEN,
    Registry,
    crossings,
    flush_source,
    increments,
    load_registry,
)
from gold.export import (
    EXPORT_COLUMNS,
    EXPORT_DATASET,
    EXPORT_KEY,
    differences,
    latest_changes,
    window_closed,
)
from gold.metric_windows import close_windows, finish, panes_after, raw_rows
from gold.property_values import (
    MERGE_ON,
    MERGE_UPDATE,
    WINDOW_START,
    FanoutRules,
    fan_out,
    merge_source,
    partials,
    skip_counts,
)
from pipelines import quality
from pipelines.errors import InputError, SettingsError
from pipelines.eventlog import RunRecord
from pipelines.runner import Context, after, app_id, append_once, pending, run_job
from pipelines.sinks import clickhouse
from pipelines.sources import kafka
from pipelines.sources.files import FileBatch, landing_table, read_records
from pipelines.storage import AppTxn, TableSpec
from pipelines.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_QUARANTINE,
    BRONZE_SAMPLES,
    COUNTER_EXPORTS,
    EXPORT_OUTBOX,
    EXPORTS,
    GOLD_COUNTER_MILESTONES,
    GOLD_COUNTER_PARTIALS,
    GOLD_COUNTERS,
    GOLD_EXPORTED,
    GOLD_METRIC_WINDOWS,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
    SILVER_EVENTS,
    SILVER_METRIC_PANES,
    SILVER_METRIC_STATE,
    SILVER_PAGE_CHANGE_STATE,
    SILVER_PAGE_CHANGES,
)
from silver.buckets import BucketMapping
from silver.events import to_silver_events
from silver.metric_panes import METRIC_PANE_COLUMNS, SAMPLE_COLUMNS, pane_run, select_samples
from silver.page_changes import (
    EVENT_COLUMNS,
    KEY,
    LAST_REV,
    LAST_TIME,
    SILVER_PAGE_CHANGES_COLUMNS,
    dedup_run,
)

KINDS = {
    "events": (BRONZE_EVENTS, parse_events, BRONZE_EVENTS_COLUMNS),
    "page_changes": (BRONZE_PAGE_CHANGES, parse_page_changes, BRONZE_PAGE_CHANGES_COLUMNS),
}


@dataclass
class Landed:
    """Landing rows parsed once: rows for the bronze table and rows for the quarantine.

    Both derive from one cached parse; :meth:`release` drops the cache once they are written.
    """

    good: DataFrame
    bad: DataFrame
    cached: DataFrame

    def release(self) -> None:
        self.cached.unpersist()


def parse_landing(ctx: Context, record: RunRecord, kind: str, landing: pa.Table) -> Landed:
    """Landing rows -> the rows for the bronze table of ``kind`` and for the quarantine, one parse.

    The parsed rows are validated with the bronze table's suite; rows a ``drop`` expectation
    removes join the quarantine rows, so both land in the same commits as the batch.
    """
    target, parser, columns = KINDS[kind]
    parsed = ctx.spark.createDataFrame(landing).transform(parser(ctx.settings.kafka.max_message_bytes)).persist()
    good, bad = valid(parsed, columns), quarantined(parsed, kind)
    if quality.enabled(ctx):
        checked = quality.run_suite(ctx, record, quality.suite_for(ctx, target.key).for_batches(), good)
        good = checked.kept
        if checked.dropped is not None:
            bad = bad.unionByName(quality.to_quarantine(checked.dropped, kind))
    return Landed(good, bad, parsed)


def bucket_mapping(ctx: Context) -> BucketMapping:
    """The mapping file named in settings, or hash-only buckets when none is set."""
    cfg = ctx.settings.buckets
    if cfg.mapping_file is None:
        return BucketMapping(cfg.count)
    path = Path(cfg.mapping_file)
    if not path.is_file():
        raise SettingsError([f"MEDALLION_BUCKETS__MAPPING_FILE: {str(path)!r} does not exist"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return BucketMapping.from_dict(data, cfg.count)
    except (yaml.YAMLError, ValueError, TypeError, AttributeError) as exc:
        raise SettingsError([f"MEDALLION_BUCKETS__MAPPING_FILE: {str(path)!r} is not a valid mapping: {exc}"]) from exc


def _in_buckets(df: DataFrame, buckets: Sequence[int] | None) -> DataFrame:
    return df if not buckets else df.where(F.col("bucket").isin(*buckets))


# -- bronze -------------------------------------------------------------------------------------
def ingest_files(ctx: Context, kind: str, paths: Sequence[Path]) -> RunRecord:
    """Land JSON-lines / JSON-array files into bronze, idempotently per file content."""
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")
    target = KINDS[kind][0]

    def body(record: RunRecord) -> None:
        for spec in (target, BRONZE_QUARANTINE):
            ctx.store.ensure(spec)
        now = datetime.now(UTC)
        files: list[tuple[FileBatch, AppTxn]] = []
        for path in paths:
            content = Path(path).read_bytes() if Path(path).is_file() else None
            if content is None:
                raise InputError(f"{path}: no such file")
            batch = read_records(path, content)
            txn = AppTxn(f"medallion/ingest-file/{kind}/{batch.digest}", 0)
            seen = any(b.digest == batch.digest for b, _ in files)
            if seen or ctx.store.txn_version(target, txn.app_id) is not None:
                record.add(files_skipped=record.metrics.get("files_skipped", 0) + 1)
                continue
            files.append((batch, txn))
        if not files:
            record.noop("every file was landed before")
            return
        landing = landing_table([b for b, _ in files], now)
        landed = parse_landing(ctx, record, kind, landing)
        try:
            for batch, txn in files:
                name = F.col("source_file") == F.lit(str(batch.path))
                append_once(ctx.store, BRONZE_QUARANTINE, landed.bad.where(name), txn)
                append_once(ctx.store, target, landed.good.where(name), txn)
            # Two counts of the cached parse: small figures, not rows.
            n_good, n_bad = landed.good.count(), landed.bad.count()
        finally:
            landed.release()
        record.rows_in = landing.num_rows
        record.rows_out = n_good
        record.add(files=len(files), quarantined=n_bad)
        ctx.say(f"landed {n_good:,} {kind} from {len(files)} file(s), {n_bad:,} quarantined")

    return run_job(ctx, f"ingest_file.{kind}", body)


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
    group = ctx.settings.kafka.group_id
    for kind in set(kinds.values()):
        ctx.store.ensure(KINDS[kind][0])
    ctx.store.ensure(BRONZE_QUARANTINE)

    def flush(by_topic: Mapping[str, list[Any]], batch_id: str) -> kafka.FlushResult:
        result = kafka.FlushResult()

        def body(record: RunRecord) -> None:
            nonlocal result
            result = kafka.FlushResult()
            now = datetime.now(UTC)
            for topic, messages in by_topic.items():
                target = KINDS[kinds[topic]][0]
                parsed = parse_landing(ctx, record, kinds[topic], kafka.landing_rows(messages, batch_id, now))
                # A flush's rows were born in this process (the consumer) and are bounded by
                # --max-batch: they go back to Arrow so each partition's offsets commit with them.
                good, bad = parsed.good.toArrow(), parsed.bad.toArrow()
                parsed.release()
                last = kafka.last_offsets(messages)
                kafka.write_partitions_once(ctx.store, BRONZE_QUARANTINE, bad, last, group)
                landed = kafka.write_partitions_once(ctx.store, target, good, last, group)
                result.messages += len(messages)
                result.landed[topic] = landed
                result.quarantined += bad.num_rows
                result.partitions += len(last)
                record.add(**{f"topic.{topic}.messages": len(messages), f"topic.{topic}.landed": landed})
            record.rows_in = result.messages
            record.rows_out = sum(result.landed.values())
            record.add(quarantined=result.quarantined, partitions=result.partitions)
            record.details = batch_id
            ctx.say(
                f"kafka: {result.messages:,} messages from {result.partitions} partition(s) -> "
                f"{record.rows_out:,} landed, {result.quarantined:,} quarantined"
            )

        run_job(ctx, "ingest.kafka", body)
        return result

    ingestor = kafka.KafkaIngestor(
        ctx.settings.kafka,
        ctx.store,
        {topic: KINDS[kind][0] for topic, kind in kinds.items()},
        flush,
        max_batch=max_batch,
        max_wait=max_wait,
        once=once,
        stop=stop,
    )
    return ingestor.run()


# -- silver -------------------------------------------------------------------------------------
def silver_events(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    """New bronze events -> silver events with their team bucket."""
    mapping = bucket_mapping(ctx)

    def body(record: RunRecord) -> None:
        ctx.store.ensure(SILVER_EVENTS)
        inc = pending(ctx.store, BRONZE_EVENTS, SILVER_EVENTS, app_id("silver.events", BRONZE_EVENTS, buckets))
        if inc is None:
            record.noop("no new bronze events")
            return
        batch = _in_buckets(inc.read(ctx.store).transform(to_silver_events(mapping)), buckets).persist()
        out = quality.gate(ctx, record, SILVER_EVENTS.key, batch, inc.txn)
        ctx.store.append(SILVER_EVENTS, out, [inc.txn])
        # One row per bucket: the batch's figures, not its rows.
        per_bucket = out.groupBy("bucket").agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).collect()
        batch.unpersist()
        n_out = sum(int(r["n"]) for r in per_bucket)
        record.rows_in = record.rows_out = n_out
        record.add(**{f"bucket.{r['bucket']}.events": int(r["n"]) for r in per_bucket})
        # Lag: how far behind now the newest event of each bucket in this batch is.
        now = datetime.now(UTC).timestamp()
        record.add(
            **{
                f"bucket.{r['bucket']}.lag_seconds": round(now - r["t"].timestamp(), 3)
                for r in per_bucket
                if r["t"] is not None
            }
        )
        record.add(source_from=inc.start, source_to=inc.end)
        ctx.say(f"silver/events: {n_out:,} events in {len(per_bucket)} bucket(s)")

    return run_job(ctx, "silver.events", body)


def silver_page_changes(ctx: Context, drain: bool = False) -> RunRecord:
    """New bronze page changes -> reordered, deduplicated page changes, window by window.

    State (open-window events, last emitted per key, progress) lives in one table that each run
    replaces in one commit, together with the run's output rows (an outbox). The outbox is then
    appended to silver/page_changes under the same run number: a crash between the two commits is
    finished by the next run, and a crash before the first leaves everything as it was.
    """
    cfg = ctx.settings.page_changes
    app = app_id("silver.page_changes", BRONZE_PAGE_CHANGES)

    def publish() -> int:
        return publish_outbox(
            ctx, SILVER_PAGE_CHANGE_STATE, SILVER_PAGE_CHANGES, app, "emit", SILVER_PAGE_CHANGES_COLUMNS
        )

    def body(record: RunRecord) -> None:
        for spec in (SILVER_PAGE_CHANGES, SILVER_PAGE_CHANGE_STATE):
            ctx.store.ensure(spec)
        recovered = publish()
        if recovered:
            record.add(recovered_outbox_rows=recovered)
            ctx.say(f"silver/page_changes: published {recovered:,} rows a stopped run had left in its outbox")
        seq = ctx.store.txn_version(SILVER_PAGE_CHANGE_STATE, app) or 0
        state = ctx.store.read(SILVER_PAGE_CHANGE_STATE).persist()
        progress = state.where("kind = 'progress'").select("bronze_version", "max_event_time").first()
        done = progress["bronze_version"] if progress else None
        max_seen = progress["max_event_time"] if progress else None
        inc = after(ctx.store, BRONZE_PAGE_CHANGES, done, app)
        buffered = state.where("kind = 'event'").select(*EVENT_COLUMNS)
        if inc is None and not (drain and buffered.limit(1).count()):
            state.unpersist()
            record.noop("no new bronze page changes" + (" and nothing buffered" if drain else ""))
            return
        end = inc.end if inc else done
        new = inc.read(ctx.store).select(*EVENT_COLUMNS) if inc else None
        n_in = 0
        if new is not None:
            seen = new.agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).first()
            n_in, batch_max = (int(seen["n"]), seen["t"]) if seen else (0, None)
            if batch_max is not None:
                max_seen = batch_max if max_seen is None else max(max_seen, batch_max)
        watermark = None if drain or max_seen is None else max_seen - cfg.allowed_lateness
        events = buffered if new is None else buffered.unionByName(new)
        last = state.where("kind = 'key'").select(
            *KEY, F.col("rev_id").alias(LAST_REV), F.col("event_time").alias(LAST_TIME)
        )
        result = dedup_run(events, last, cfg.mode, cfg.window, watermark)
        # Several actions read these; caching them keeps each step computed once.
        cached = [result.windowed.persist(), result.finalized.persist(), result.emitted.persist()]
        finalized = (
            result.finalized.groupBy()
            .agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("_stale").cast("int")).alias("stale"))
            .first()
        )
        emitted = quality.gate(ctx, record, SILVER_PAGE_CHANGES.key, result.emitted, AppTxn(app, seq + 1))
        open_events = result.buffered.persist()
        cached.append(open_events)
        new_state = _union(
            [
                open_events.withColumn("kind", F.lit("event")),
                result.last_emitted.select(
                    F.lit("key").alias("kind"),
                    *KEY,
                    F.col(LAST_REV).alias("rev_id"),
                    F.col(LAST_TIME).alias("event_time"),
                ),
                emitted.withColumn("kind", F.lit("emit")),
                ctx.spark.createDataFrame(
                    [("progress", max_seen, end)], "kind string, max_event_time timestamp, bronze_version long"
                ),
            ],
            allow_missing=True,
        )
        # The run's figures, computed on the cached steps before the state they read is replaced.
        n_emitted = emitted.count()
        buffered_events = open_events.count()
        open_windows = open_events.select("wiki_id", "page_id", "window_start").distinct().count()
        n_key_rows = result.last_emitted.count()
        ctx.store.overwrite(SILVER_PAGE_CHANGE_STATE, new_state, [AppTxn(app, seq + 1)])
        state.unpersist()
        for df in cached:
            df.unpersist()
        publish()
        n_final = int(finalized["n"] or 0) if finalized else 0
        stale = int(finalized["stale"] or 0) if finalized else 0
        record.rows_in, record.rows_out = n_in, n_emitted
        record.add(
            input_events=n_in,
            finalized_events=n_final,
            emitted=n_emitted,
            stale=stale,
            deduplicated=n_final - n_emitted - stale,
            open_windows=open_windows,
            buffered_events=buffered_events,
            state_rows=buffered_events + n_key_rows + n_emitted + 1,
        )
        if watermark is not None:
            record.add(watermark_epoch_s=watermark.timestamp())
        ctx.say(
            f"silver/page_changes: {n_in:,} new, {n_final:,} in closed windows -> {n_emitted:,} emitted, "
            f"{stale:,} stale, {buffered_events:,} buffered in {open_windows:,} open window(s)"
            + (" (drained)" if drain else "")
        )

    return run_job(ctx, "silver.page_changes", body)


# -- gold ---------------------------------------------------------------------------------------
def fanout_rules(ctx: Context) -> FanoutRules:
    g = ctx.settings.gold
    return FanoutRules(g.max_key_length, g.max_value_length, tuple(g.excluded_keys))


def gold_partials(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    """Stage 1: new silver events -> partial tuple counts per window and source batch."""

    def body(record: RunRecord) -> None:
        ctx.store.ensure(GOLD_PARTIALS)
        inc = pending(ctx.store, SILVER_EVENTS, GOLD_PARTIALS, app_id("gold.partials", SILVER_EVENTS, buckets))
        if inc is None:
            record.noop("no new silver events")
            return
        events = _in_buckets(inc.read(ctx.store), buckets).persist()
        tuples = events.transform(fan_out(fanout_rules(ctx))).persist()
        reasons = {r["reason"]: r["count"] for r in skip_counts(tuples).collect()}
        counted = reasons.pop("counted", 0)
        batch = tuples.transform(partials(ctx.settings.gold.window)).persist()
        out = quality.gate(ctx, record, GOLD_PARTIALS.key, batch, inc.txn, tuples=counted)
        n_events, n_out = events.count(), out.count()
        ctx.store.append(GOLD_PARTIALS, out, [inc.txn])
        for df in (batch, tuples, events):
            df.unpersist()
        record.rows_in, record.rows_out = n_events, n_out
        record.add(input_events=n_events, tuples=counted, partial_rows=n_out)
        record.add(**{f"skipped.{k}": v for k, v in reasons.items()})
        ctx.say(f"gold stage 1: {n_events:,} events -> {counted:,} tuples -> {n_out:,} partial rows")

    return run_job(ctx, "gold.partials", body)


def gold_merge(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    """Stage 2: partials not merged yet -> summed per tuple and window -> MERGE into gold."""

    def body(record: RunRecord) -> None:
        ctx.store.ensure(GOLD_PROPERTY_VALUES)
        inc = pending(ctx.store, GOLD_PARTIALS, GOLD_PROPERTY_VALUES, app_id("gold.merge", GOLD_PARTIALS, buckets))
        if inc is None:
            record.noop("no new partials")
            return
        parts = _in_buckets(inc.read(ctx.store), buckets).persist()
        batch = parts.transform(merge_source()).persist()
        source = quality.gate(ctx, record, GOLD_PROPERTY_VALUES.key, batch, inc.txn)
        n_parts, n_source = parts.count(), source.count()
        ctx.store.merge(GOLD_PROPERTY_VALUES, source, on=MERGE_ON, update=MERGE_UPDATE, txns=[inc.txn])
        batch.unpersist()
        parts.unpersist()
        record.rows_in, record.rows_out = n_parts, n_source
        record.add(partial_rows=n_parts, merged_rows=n_source)
        ctx.say(f"gold stage 2: {n_parts:,} partial rows merged as {n_source:,} rows")

    return run_job(ctx, "gold.merge", body)


def export_property_values(ctx: Context, drain: bool = False) -> RunRecord:
    """Closed windows of gold -> ClickHouse, exactly once, with corrections for late counts.

    Each batch is first appended to ``_meta/export_outbox`` under the next batch number (one
    commit), then sent in a fixed order and chunking, each insert carrying the token
    ``<batch>:<chunk>``, then recorded in ``gold/property_value_exports`` under the same number. A
    run that stopped anywhere in between is finished by the next one: it resends the same rows with
    the same tokens, which ClickHouse drops if they had arrived.
    """
    g = ctx.settings.gold
    database = ctx.settings.clickhouse.database
    chunk = ctx.settings.clickhouse.insert_chunk_rows
    app = app_id("export.clickhouse", GOLD_PROPERTY_VALUES)

    def deliver(seq: int, record: RunRecord) -> int:
        """Send outbox batch ``seq`` (again) and record it as exported; returns rows sent."""
        rows = ctx.store.read(EXPORT_OUTBOX, where=f"export_seq = {seq}").persist()
        sent = 0
        with (
            clickhouse.connect(ctx.settings) as client,
            ctx.store.stream(rows.select(*EXPORT_COLUMNS).orderBy(*EXPORT_COLUMNS[:-1])) as batches,
        ):
            clickhouse.ensure_property_values(client, database)
            # A fixed order and chunking, so a resend carries the same tokens for the same rows.
            for i, data in enumerate(rechunk(batches, chunk)):
                clickhouse.insert(client, clickhouse.PROPERTY_VALUES_TABLE, data, _token(seq, i), database)
                sent += data.num_rows
        ctx.store.merge(
            GOLD_EXPORTED,
            rows.select(*EXPORT_COLUMNS[:-1], F.col("total").alias("exported_count"), "export_seq"),
            on=" AND ".join(f"t.{c} = s.{c}" for c in EXPORT_COLUMNS[:-1]),
            update={"exported_count": "s.exported_count", "export_seq": "s.export_seq"},
            txns=[AppTxn(app, seq)],
        )
        # Two sums over the batch: figures, not rows.
        sums = rows.agg(F.sum("count").alias("n"), F.sum(F.col("correction").cast("long")).alias("c")).first()
        rows.unpersist()
        count_sum, corrections = (int(sums["n"] or 0), int(sums["c"] or 0)) if sums else (0, 0)
        log_row = pa.Table.from_pylist(
            [
                {
                    "sink": "clickhouse",
                    "target": clickhouse.PROPERTY_VALUES_TABLE,
                    "source": GOLD_PROPERTY_VALUES.key,
                    "from_version": seq,
                    "to_version": seq,
                    "rows": sent,
                    "count_sum": count_sum,
                    "exported_at": datetime.now(UTC),
                }
            ],
            schema=EXPORTS.arrow_schema,
        )
        append_once(ctx.store, EXPORTS, log_row, AppTxn(app, seq))
        record.add(
            rows_exported=record.metrics.get("rows_exported", 0) + sent,
            late_corrections=record.metrics.get("late_corrections", 0) + corrections,
            count_sum=record.metrics.get("count_sum", 0) + count_sum,
        )
        return sent

    def body(record: RunRecord) -> None:
        for spec in (GOLD_PROPERTY_VALUES, GOLD_EXPORTED, EXPORT_OUTBOX, EXPORTS):
            ctx.store.ensure(spec)
        out_seq = ctx.store.txn_version(EXPORT_OUTBOX, app) or 0
        done_seq = ctx.store.txn_version(GOLD_EXPORTED, app) or 0
        if out_seq > done_seq:
            resent = deliver(out_seq, record)
            ctx.say(f"export: finished batch {out_seq} that a stopped run had left ({resent:,} rows)")
        version = ctx.store.version(GOLD_PROPERTY_VALUES)
        prev = _export_progress(ctx, out_seq)
        if prev is not None and prev.gold_version == version and not drain:
            record.noop(f"gold has not changed since export batch {out_seq}")
            return
        cached: list[DataFrame] = []
        if prev is None:
            # The first export (or the first since the lake kept its progress): all of gold.
            candidates = ctx.store.read(GOLD_PROPERTY_VALUES).persist()
            cached.append(candidates)
            newest = _newest(candidates, None)
            exported = ctx.store.read(GOLD_EXPORTED)
            after = None
        else:
            # Only what changed: the windows closed since the last batch, and the tuples of
            # windows closed before it that gold's change feed shows late counts for.
            changes = ctx.store.read_changes(GOLD_PROPERTY_VALUES, prev.gold_version + 1, version).persist()
            cached.append(changes)
            newest = _newest(changes, prev.newest_event)
            late = changes.transform(latest_changes(g.window, prev.closed_through)).persist()
            cached.append(late)
            # The late tuples' windows, to read only their part of what was exported: a list of
            # window starts, bounded by the time the late data spans, not by its rows.
            windows = [r[0] for r in late.select(WINDOW_START).distinct().collect()]
            exported = ctx.store.read(GOLD_EXPORTED).where(F.col(WINDOW_START).isin(windows))
            after = prev.closed_through
        if newest is None:
            for df in cached:
                df.unpersist()
            record.noop("gold is empty")
            return
        closed_before = None if drain else newest - g.grace
        through = newest + g.window if drain else newest - g.grace
        if prev is not None:
            fresh = ctx.store.read(GOLD_PROPERTY_VALUES).where(window_closed(g.window, after, closed_before))
            candidates = fresh.select(*EXPORT_KEY, "count").unionByName(late.select(*EXPORT_KEY, "count"))
            through = max(through, prev.closed_through)
        else:
            candidates = candidates.where(window_closed(g.window, None, closed_before))
        batch = candidates.transform(differences(exported, g.min_export_count)).persist()
        cached.append(batch)
        gated = batch.where("_gated").count()
        seq = out_seq + 1
        to_send = quality.gate(ctx, record, EXPORT_DATASET, batch.where("NOT _gated").drop("_gated"), AppTxn(app, seq))
        rows = to_send.select(
            F.lit(seq).cast("long").alias("export_seq"),
            "*",
            F.lit(version).cast("long").alias("gold_version"),
            F.lit(newest).alias("newest_event"),
            F.lit(through).alias("closed_through"),
        ).persist()
        cached.append(rows)
        n_rows = rows.count()
        record.add(gated=gated)
        if closed_before is not None:
            record.add(watermark_epoch_s=closed_before.timestamp())
        if n_rows == 0:
            for df in cached:
                df.unpersist()
            record.noop("no closed window has counts to export" + (f" ({gated:,} gated)" if gated else ""))
            return
        ctx.store.append(EXPORT_OUTBOX, rows, [AppTxn(app, seq)])
        for df in cached:
            df.unpersist()
        sent = deliver(seq, record)
        record.rows_in = record.rows_out = sent
        ctx.say(
            f"export: batch {seq}: {sent:,} rows to ClickHouse {clickhouse.PROPERTY_VALUES_TABLE} "
            f"({int(record.metrics.get('late_corrections', 0)):,} corrections, {gated:,} gated)"
            + (" (drained)" if drain else "")
        )

    return run_job(ctx, "export.clickhouse", body)


@dataclass(frozen=True)
class ExportProgress:
    gold_version: int
    newest_event: datetime
    closed_through: datetime


def _export_progress(ctx: Context, seq: int) -> ExportProgress | None:
    """Where export batch ``seq`` left the export (None before the first, or for a batch written
    before the outbox kept it): one row of the batch, its progress columns."""
    if seq == 0:
        return None
    row = (
        ctx.store.read(EXPORT_OUTBOX, where=f"export_seq = {seq}")
        .select("gold_version", "newest_event", "closed_through")
        .limit(1)
        .collect()
    )
    if not row or row[0]["gold_version"] is None:
        return None
    return ExportProgress(int(row[0]["gold_version"]), row[0]["newest_event"], row[0]["closed_through"])


def _newest(rows: DataFrame, before: datetime | None) -> datetime | None:
    """The newest event time counted: ``before`` or the newest in ``rows``, whichever is later."""
    found = rows.agg(F.max("max_event_time")).first()
    newest = found[0] if found else None
    return max((t for t in (before, newest) if t is not None), default=None)


def rechunk(batches: pa.RecordBatchReader, rows: int) -> Iterator[pa.Table]:
    """Arrow batches -> tables of exactly ``rows`` rows (the last one fewer), in order."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - size, batch.num_rows)
            pending.append(batch.slice(0, take))
            batch, size = batch.slice(take), size + take
            if size == rows:
                yield pa.Table.from_batches(pending)
                pending, size = [], 0
    if size:
        yield pa.Table.from_batches(pending)


def _token(seq: int, chunk: int) -> str:
    return f"medallion:{GOLD_PROPERTY_VALUES.key}:batch{seq}:c{chunk}"


def publish_outbox(ctx: Context, state: TableSpec, out: TableSpec, app: str, kind: str, columns: list[str]) -> int:
    """Append the outbox rows (``kind``) a state commit holds, unless ``out`` already has them.

    Jobs with state replace their state table and its outbox in one commit, then publish the
    outbox under the same run number: a crash between the two is finished by the next run.
    """
    state_seq = ctx.store.txn_version(state, app)
    out_seq = ctx.store.txn_version(out, app)
    if state_seq is None or (out_seq is not None and out_seq >= state_seq):
        return 0
    rows = ctx.store.read(state, where=f"kind = '{kind}'").select(*columns).persist()
    try:
        ctx.store.append(out, rows, [AppTxn(app, state_seq)])
        return rows.count()
    finally:
        rows.unpersist()


# -- metrics ------------------------------------------------------------------------------------
def silver_metric_panes(ctx: Context, drain: bool = False) -> RunRecord:
    """New bronze samples -> final panes of every configured aggregation (see silver.metric_panes).

    State (samples of panes not final yet, each series' newest counted sample, per-aggregation
    largest sample time and dropped count, bronze progress) is one table replaced per run with the
    run's pane rows as its outbox, as silver/page_changes does.
    """
    aggs = ctx.settings.metrics.aggregations
    app = app_id("silver.metric_panes", BRONZE_SAMPLES)

    def body(record: RunRecord) -> None:
        if not aggs:
            record.noop("no metric aggregations configured (metrics.aggregations)")
            return
        for spec in (SILVER_METRIC_PANES, SILVER_METRIC_STATE, BRONZE_SAMPLES):
            ctx.store.ensure(spec)
        recovered = publish_outbox(ctx, SILVER_METRIC_STATE, SILVER_METRIC_PANES, app, "pane", METRIC_PANE_COLUMNS)
        if recovered:
            record.add(recovered_outbox_rows=recovered)
        seq = ctx.store.txn_version(SILVER_METRIC_STATE, app) or 0
        state = ctx.store.read(SILVER_METRIC_STATE, where="kind <> 'pane'").persist()
        progress = {r["aggregation"]: r for r in state.where("kind = 'progress'").collect()}
        done = progress[None]["bronze_version"] if None in progress else None
        inc = after(ctx.store, BRONZE_SAMPLES, done, app)
        buffered = state.where("kind = 'sample'").select(*SAMPLE_COLUMNS)
        if inc is None and not (drain and buffered.limit(1).count()):
            state.unpersist()
            record.noop("no new samples" + (" and nothing buffered" if drain else ""))
            return
        end = inc.end if inc else done
        columns = ["metric_name", "labels", "series_id", "timestamp", "value"]
        new = inc.read(ctx.store).select(*columns) if inc else None
        if new is not None:
            new = new.persist()
        lasts = state.where("kind = 'last'").select("aggregation", "series_id", "timestamp", "value")
        panes, keep, new_lasts, progress_rows = [], [], [], []
        kept_cached: list[DataFrame] = []  # each aggregation's samples, cached until the state is written
        n_in = 0
        for agg in aggs:
            mine = select_samples(new, agg).persist() if new is not None else buffered.limit(0)
            seen = mine.agg(F.count(F.lit(1)).alias("n"), F.max("timestamp").alias("t")).first()
            n_new = int(seen["n"]) if seen else 0
            prev = progress.get(agg.name)
            prev_seen = prev["max_seen"] if prev else None
            max_seen = max((t for t in (prev_seen, seen["t"] if seen else None) if t is not None), default=None)
            lateness = agg.allowed_lateness
            watermark = None if max_seen is None else max_seen - lateness
            step = pane_run(
                agg,
                mine,
                buffered.where(F.col("aggregation") == agg.name),
                lasts.where(F.col("aggregation") == agg.name),
                None if prev_seen is None else prev_seen - lateness,
                None if max_seen is None else (max_seen + agg.window if drain else watermark),
                seq + 1,
                close_all=drain,
            )
            n_late = step.late.count() if prev_seen is not None else 0
            dropped = (prev["dropped"] or 0 if prev else 0) + (n_late if agg.late == "drop" else 0)
            panes.append(step.panes)
            keep.append(step.buffered)
            new_lasts.append(step.lasts)
            if drain and max_seen is not None:
                # Draining made every pane final and closed every window holding one: from now on
                # a sample for them is late, so the recorded clock moves to where that holds.
                max_seen = max_seen + agg.window + lateness
            progress_rows.append(
                {"kind": "progress", "aggregation": agg.name, "max_seen": max_seen, "dropped": dropped}
            )
            n_in += n_new
            record.add(**{f"{agg.name}.samples": n_new, f"{agg.name}.late_{agg.late}": n_late})
            if watermark is not None:
                record.add(**{f"{agg.name}.watermark_epoch_s": watermark.timestamp()})
            kept_cached.append(mine)
        samples = _union(keep).withColumn("kind", F.lit("sample"))
        last_rows = _union(new_lasts).withColumn("kind", F.lit("last"))
        rest = samples.unionByName(last_rows, allowMissingColumns=True).persist()
        progress_rows.append({"kind": "progress", "aggregation": None, "bronze_version": end})
        new_state = _union(
            [
                rest,
                _union(panes).withColumn("kind", F.lit("pane")),
                ctx.spark.createDataFrame(
                    progress_rows,
                    "kind string, aggregation string, max_seen timestamp, dropped long, bronze_version long",
                ),
            ],
            allow_missing=True,
        )
        # One row per kind: figures of the cached rest, taken before the state it reads is replaced.
        counts = {r["kind"]: int(r["n"]) for r in rest.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
        ctx.store.overwrite(SILVER_METRIC_STATE, new_state, [AppTxn(app, seq + 1)])
        for df in (rest, state, *kept_cached, *([new] if new is not None else [])):
            df.unpersist()
        published = publish_outbox(ctx, SILVER_METRIC_STATE, SILVER_METRIC_PANES, app, "pane", METRIC_PANE_COLUMNS)
        record.rows_in, record.rows_out = n_in, published
        record.add(
            input_samples=n_in,
            panes=published,
            buffered_samples=counts.get("sample", 0),
            series_tracked=counts.get("last", 0),
            state_rows=sum(counts.values()) + published + len(progress_rows),
        )
        ctx.say(
            f"silver/metric_panes: {n_in:,} samples -> {published:,} final pane rows, "
            f"{counts.get('sample', 0):,} samples in open panes" + (" (drained)" if drain else "")
        )

    return run_job(ctx, "silver.metric_panes", body)


def gold_metric_windows(ctx: Context) -> RunRecord:
    """New final panes -> windows the watermark has closed, late rows for windows already closed."""
    aggs = {a.name: a for a in ctx.settings.metrics.aggregations}

    def body(record: RunRecord) -> None:
        ctx.store.ensure(GOLD_METRIC_WINDOWS)
        inc = pending(
            ctx.store, SILVER_METRIC_PANES, GOLD_METRIC_WINDOWS, app_id("gold.metric_windows", SILVER_METRIC_PANES)
        )
        if inc is None:
            record.noop("no new panes")
            return
        new = inc.read(ctx.store).persist()
        stats = {
            r["aggregation"]: r
            for r in new.groupBy("aggregation")
            .agg(F.max("watermark").alias("watermark"), F.max("run").alias("run"), F.count(F.lit(1)).alias("n"))
            .collect()
        }
        closed = {
            r["aggregation"]: r["c"]
            for r in ctx.store.read(GOLD_METRIC_WINDOWS, where="kind = 'window'")
            .groupBy("aggregation")
            .agg(F.max("closed_through").alias("c"))
            .collect()
        }
        unknown = sorted(set(stats) - set(aggs))
        if unknown:
            record.add(**{f"{name}.unconfigured_panes": stats[name]["n"] for name in unknown})
        outs = []
        for name, s in stats.items():
            agg = aggs.get(name)
            if agg is None:
                continue
            mine = new.where(F.col("aggregation") == name)
            if agg.raw:
                outs.append(raw_rows(mine))
                continue
            prev = closed.get(name)
            through = s["watermark"] if prev is None else max(prev, s["watermark"])
            panes = ctx.store.read(SILVER_METRIC_PANES, where=f"aggregation = '{name}' AND run <= {s['run']}")
            if prev is not None:
                panes = panes.where(panes_after(prev, agg))
            outs.append(close_windows(agg, mine, panes, prev, through))
        rows = finish(_union(outs)).persist() if outs else ctx.spark.createDataFrame([], GOLD_METRIC_WINDOWS.schema)
        ctx.store.append(GOLD_METRIC_WINDOWS, rows, [inc.txn])
        # One row per kind of window row: figures, not rows.
        kinds = {r["kind"]: int(r["n"]) for r in rows.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
        rows.unpersist()
        new.unpersist()
        record.rows_in = sum(int(s["n"]) for s in stats.values())
        record.rows_out = sum(kinds.values())
        record.add(pane_rows=record.rows_in, **{f"{k}_rows": v for k, v in kinds.items()})
        ctx.say(
            f"gold/metric_windows: {record.rows_in:,} pane rows -> {kinds.get('window', 0):,} closed windows, "
            f"{kinds.get('late', 0):,} late rows, {kinds.get('raw', 0):,} raw rows"
        )

    return run_job(ctx, "gold.metric_windows", body)


def _union(frames: Sequence[DataFrame], allow_missing: bool = False) -> DataFrame:
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df, allowMissingColumns=allow_missing)
    return out


# -- counters -----------------------------------------------------------------------------------
def counter_registry(ctx: Context) -> Registry | None:
    path = ctx.settings.counters.registry
    return load_registry(path) if path is not None else None


COUNTERS_COLUMNS = [f.name for f in COUNTERS_SCHEMA.fields]
NO_REGISTRY = "no counter registry configured (counters.registry)"


def gold_counter_partials(ctx: Context) -> RunRecord:
    """Stage 1: new silver events -> increments per counter, entity and window."""
    registry = counter_registry(ctx)

    def body(record: RunRecord) -> None:
        if registry is None:
            record.noop(NO_REGISTRY)
            return
        ctx.store.ensure(GOLD_COUNTER_PARTIALS)
        inc = pending(ctx.store, SILVER_EVENTS, GOLD_COUNTER_PARTIALS, app_id("gold.counter_partials", SILVER_EVENTS))
        if inc is None:
            record.noop("no new silver events")
            return
        events = inc.read(ctx.store)
        rows = increments(events, registry, ctx.settings.counters.window, inc.end).persist()
        ctx.store.append(GOLD_COUNTER_PARTIALS, rows, [inc.txn])
        totals = rows.agg(F.count(F.lit(1)).alias("rows"), F.sum("count").alias("n")).first()
        rows.unpersist()
        n, n_rows = (int(totals["n"] or 0), int(totals["rows"])) if totals else (0, 0)
        record.rows_in, record.rows_out = n, n_rows
        record.add(increments=n, partial_rows=n_rows)
        ctx.say(f"gold/counter_partials: {n:,} increments -> {n_rows:,} partial rows")

    return run_job(ctx, "gold.counter_partials", body)


def gold_counters(ctx: Context, drain: bool = False) -> RunRecord:
    """Stage 2: flush the entities whose tier is due: their new partials MERGEd into the totals.

    ``drain`` flushes every entity with new partials whatever its tier (the end of a backfill).
    """
    registry = counter_registry(ctx)

    def body(record: RunRecord) -> None:
        if registry is None:
            record.noop(NO_REGISTRY)
            return
        for spec in (GOLD_COUNTERS, GOLD_COUNTER_PARTIALS):
            ctx.store.ensure(spec)
        parts = ctx.store.read(GOLD_COUNTER_PARTIALS).persist()
        stats = parts.agg(F.max("seq").alias("seq"), F.max("window_end").alias("clock")).first()
        if stats is None or stats["seq"] is None:
            parts.unpersist()
            record.noop("no counter partials yet")
            return
        seq, clock = int(stats["seq"]), stats["clock"]
        source = flush_source(parts, ctx.store.read(GOLD_COUNTERS), registry, clock, seq, force=drain).persist()
        n_source = source.count()
        if n_source == 0:
            source.unpersist()
            parts.unpersist()
            record.noop("no entity is due for a flush")
            return
        run = (ctx.store.txn_version(GOLD_COUNTERS, "gold.counters") or 0) + 1
        ctx.store.merge(
            GOLD_COUNTERS,
            source,
            on=FLUSH_ON,
            update=FLUSH_UPDATE,
            insert={c: f"s.{c}" for c in COUNTERS_COLUMNS},
            update_when=FLUSH_WHEN,
            txns=[AppTxn("gold.counters", run)],
        )
        source.unpersist()
        parts.unpersist()
        record.rows_in = record.rows_out = n_source
        record.add(flushed_entities=n_source, clock_epoch_s=clock.timestamp(), partial_seq=seq)
        ctx.say(f"gold/counters: flushed {n_source:,} entities through batch {seq}")

    return run_job(ctx, "gold.counters", body)


def counter_milestones(ctx: Context) -> RunRecord:
    """Thresholds crossed by committed counter changes (read from the change data feed)."""
    registry = counter_registry(ctx)
    app = app_id("gold.counter_milestones", GOLD_COUNTERS)

    def body(record: RunRecord) -> None:
        if registry is None:
            record.noop(NO_REGISTRY)
            return
        for spec in (GOLD_COUNTERS, GOLD_COUNTER_MILESTONES):
            ctx.store.ensure(spec)
        inc = pending(ctx.store, GOLD_COUNTERS, GOLD_COUNTER_MILESTONES, app)
        if inc is None:
            record.noop("no new counter changes")
            return
        changes = ctx.store.read_changes(GOLD_COUNTERS, inc.start, inc.end)
        rows = crossings(changes, registry).persist()
        ctx.store.append(GOLD_COUNTER_MILESTONES, rows, [inc.txn])
        n = rows.count()
        rows.unpersist()
        record.rows_out = n
        record.add(milestones=n, counters_from=inc.start, counters_to=inc.end)
        ctx.say(f"gold/counter_milestones: {n:,} threshold(s) crossed")

    return run_job(ctx, "gold.counter_milestones", body)


def export_counters(ctx: Context) -> RunRecord:
    """gold/counters -> ClickHouse ``counters``, one counters version per insert, exactly once.

    Each version's changed rows go in one insert with the token ``gold/counters:v<version>``, then
    the version is recorded (app transaction on ``_meta/counter_exports``). A run stopped between
    the two resends the same rows with the same token, which ClickHouse drops; the table is a
    ReplacingMergeTree on (counter, entity) by version, so ``FINAL`` shows one row per entity.
    """
    app = app_id("export.counters", GOLD_COUNTERS)
    database = ctx.settings.clickhouse.database

    def body(record: RunRecord) -> None:
        for spec in (GOLD_COUNTERS, COUNTER_EXPORTS):
            ctx.store.ensure(spec)
        inc = pending(ctx.store, GOLD_COUNTERS, COUNTER_EXPORTS, app)
        if inc is None:
            record.noop("no new counter changes")
            return
        changes = (
            ctx.store.read_changes(GOLD_COUNTERS, inc.start, inc.end)
            .where(F.col("_change_type").isin("insert", "update_postimage"))
            .select(
                "counter",
                "entity",
                "total",
                F.col("_commit_version").alias("version"),
                "updated_at",
            )
            .orderBy("version", "counter", "entity")
        )
        sent = 0
        versions: list[int] = []

        def send(client: Any, rows: pa.Table) -> None:
            nonlocal sent
            version = rows["version"][0].as_py()
            clickhouse.insert(client, clickhouse.COUNTERS_TABLE, rows, f"medallion:gold/counters:v{version}", database)
            log_row = pa.Table.from_pylist(
                [{"counters_version": version, "rows": rows.num_rows, "exported_at": datetime.now(UTC)}],
                schema=COUNTER_EXPORTS.arrow_schema,
            )
            ctx.store.append(COUNTER_EXPORTS, log_row, [AppTxn(app, version)])
            sent += rows.num_rows
            versions.append(version)

        with clickhouse.connect(ctx.settings) as client, ctx.store.stream(changes) as batches:
            clickhouse.ensure_counters(client, database)
            # One insert per counters version (its token); the driver holds one version's rows.
            held: list[pa.Table] = []
            for batch in batches:
                table = pa.Table.from_batches([batch])
                for version in pc.unique(table["version"]).to_pylist():
                    part = table.filter(pc.equal(table["version"], version))
                    if held and held[0]["version"][0].as_py() != version:
                        send(client, pa.concat_tables(held))
                        held = []
                    held.append(part)
            if held:
                send(client, pa.concat_tables(held))
        if not versions or versions[-1] < inc.end:
            # Versions without row changes (table creation, optimize) are recorded as done too.
            empty = COUNTER_EXPORTS.arrow_schema.empty_table()
            ctx.store.append(COUNTER_EXPORTS, empty, [inc.txn])
        record.rows_in = record.rows_out = sent
        record.add(versions=len(versions))
        ctx.say(
            f"export: {sent:,} counter rows from {len(versions)} version(s) to ClickHouse {clickhouse.COUNTERS_TABLE}"
        )

    return run_job(ctx, "export.counters", body)
