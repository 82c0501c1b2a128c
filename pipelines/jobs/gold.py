"""Gold jobs: silver events -> partial counts (stage 1) -> merged into gold (stage 2) -> ClickHouse."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.export import (
    EXPORT_COLUMNS,
    EXPORT_DATASET,
    EXPORTED_ON,
    EXPORTED_UPDATE,
    BatchFigures,
    batch_figures,
    changed_keys,
    export_batch,
    export_bounds,
    exported_rows,
    in_send_order,
    incremental_batch,
    newest_event,
    outbox_rows,
    progress_of,
    rechunk,
    with_last_seen,
)
from gold.property_values import (
    MERGE_UPDATE,
    WINDOW_START,
    FanoutRules,
    TeamFilter,
    counted_partials,
    fan_out,
    merge_on,
    merge_source,
    skip_counts,
    tuple_counts,
)
from pipelines import quality
from pipelines.eventlog import RunRecord
from pipelines.incremental import Batch, FlowRecord, MergeRules
from pipelines.layer_config import fanout_rules, team_filter
from pipelines.runner import Context, app_id, append_once, run_job
from pipelines.settings import Settings
from pipelines.sinks import clickhouse
from pipelines.storage import AppTxn
from pipelines.tables import EXPORT_OUTBOX, EXPORTS, GOLD_EXPORTED, GOLD_PROPERTY_VALUES


@dataclass(frozen=True)
class GoldConfig:
    """What gold's two stages are configured with, built once per run from settings."""

    rules: FanoutRules
    teams: TeamFilter
    window: timedelta


def gold_config(settings: Settings) -> GoldConfig:
    return GoldConfig(fanout_rules(settings), team_filter(settings), settings.gold.window)


def counted_teams(teams: TeamFilter, rows: DataFrame, record: FlowRecord, metric: str) -> DataFrame:
    """``rows`` of the teams gold counts (``gold.teams``); how many rows it leaves out goes to the
    event log as ``metric`` (a figure, counted only when a filter is set)."""
    if not teams.everyone:
        record.add(**{metric: teams.left_out(rows).count()})
    return teams.counted(rows)


def partials(batch: Batch, config: GoldConfig, record: FlowRecord) -> DataFrame:
    """Stage 1: new silver events -> partial tuple counts per window and source batch.

    One aggregation gives the partials and the skip figures; the fan-out rows themselves are never
    kept. The time is a literal so every read of the batch sees the same one.
    """
    events = counted_teams(config.teams, batch.rows, record, "filtered_teams.events")
    counts = record.cache(events.transform(fan_out(config.rules)).transform(tuple_counts(config.window)))
    # At most one row per skip reason (eight) plus "counted": figures, not rows.
    reasons = {r["reason"]: int(r["count"]) for r in skip_counts(counts).collect()}
    counted = reasons.pop("counted", 0)
    # No tuple (a batch all filtered out or without properties): no sum to hold the batch against.
    record.gate_params["tuples"] = counted or None
    n_events = events.count()
    record.rows(rows_in=n_events)
    record.add(input_events=n_events, tuples=counted, **{f"skipped.{k}": v for k, v in reasons.items()})
    return counts.transform(counted_partials(F.lit(datetime.now(UTC))))


def partials_figures(out: DataFrame, config: GoldConfig, record: FlowRecord) -> None:
    n_out = out.count()
    record.rows(rows_out=n_out)
    record.add(partial_rows=n_out)
    record.say(
        f"gold stage 1: {int(record.figure('input_events')):,} events -> {int(record.figure('tuples')):,} tuples "
        f"-> {n_out:,} partial rows"
    )


def merged(batch: Batch, config: GoldConfig, record: FlowRecord) -> DataFrame:
    """Stage 2: partials not merged yet -> summed per tuple and window, the source of the MERGE
    into gold (:data:`GOLD_MERGE`).

    Stage 2 applies the team filter too, so partials counted before a team was filtered out are
    not merged while it is, and never later: a team added back resumes from what it had.
    """
    parts = counted_teams(config.teams, batch.rows, record, "filtered_teams.partial_rows")
    if not batch.kept:  # kept partials are a view of stage 1's cached counts already
        parts = record.cache(parts)
    n_parts = parts.count()
    record.rows(rows_in=n_parts)
    record.add(partial_rows=n_parts)
    return record.cache(parts.transform(merge_source()))


def merged_figures(out: DataFrame, config: GoldConfig, record: FlowRecord) -> None:
    n = out.count()
    record.rows(rows_out=n)
    record.add(merged_rows=n)
    record.say(f"gold stage 2: {int(record.figure('partial_rows')):,} partial rows merged as {n:,} rows")


#: How stage 2 writes: each tuple's counts added to what gold holds, in the run's buckets only.
GOLD_MERGE = MergeRules(merge_on, MERGE_UPDATE)


def gold_partials(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    """gold.partials once, as ``medallion run gold.partials`` runs it."""
    from pipelines.flows import RunOptions, flow

    return flow("gold.partials").execute(ctx, RunOptions(buckets=buckets))


def gold_merge(ctx: Context, buckets: Sequence[int] | None = None) -> RunRecord:
    """gold.merge once, as ``medallion run gold.merge`` runs it."""
    from pipelines.flows import RunOptions, flow

    return flow("gold.merge").execute(ctx, RunOptions(buckets=buckets))


def gold_property_values(ctx: Context, buckets: Sequence[int] | None = None) -> tuple[RunRecord, RunRecord]:
    """Stage 1 then stage 2, with stage 2 merging stage 1's partials from memory."""
    from pipelines.flows import flow, run_pass

    first, second = run_pass(ctx, [flow("gold.partials"), flow("gold.merge")], buckets)
    return first, second


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
    # The outbox records each batch under ``files_app``: sent in the order of its files. Batches
    # written before that are under ``app``: sent sorted by key.
    files_app = f"{app}#files"

    def deliver(seq: int, record: RunRecord, written: tuple[DataFrame, BatchFigures, int] | None = None) -> int:
        """Send outbox batch ``seq`` (again) and record it as exported; returns rows sent.

        ``written`` is the batch's rows as this run just wrote them to the outbox (a view of its
        cached batch), their figures and the outbox version that holds them. A resend reads the
        outbox.

        The rows go to ClickHouse straight from the files the outbox commit added, in their order
        (no sort, no copy), in chunks of ``insert_chunk_rows`` whose tokens name their place in
        that order: a resend cuts the same files into the same chunks. A batch written before
        the outbox recorded ``<app>#files`` is resent as it was first sent: sorted by its key.

        What was exported is recorded in two writes, each as cheap as the batch: the tuples
        exported for the first time are appended (under ``<app>#new``, so a redo does not append
        them twice), and only the corrections are merged into what was exported before, in the
        commit that records the batch. An append never rewrites the files the exported state holds.
        """
        if written is None:
            rows = ctx.store.read(EXPORT_OUTBOX, where=f"export_seq = {seq}").persist()
            figures = batch_figures(rows)
            in_files = ctx.store.txn_version(EXPORT_OUTBOX, files_app) == seq  # else a batch from before
            outbox_version = ctx.store.commit_of(EXPORT_OUTBOX, AppTxn(files_app, seq)) if in_files else None
        else:
            rows, figures, outbox_version = written
        try:
            sent = 0
            batches = (
                ctx.store.stream(in_send_order(rows, g.window))
                if outbox_version is None
                else ctx.store.stream_added(EXPORT_OUTBOX, outbox_version, EXPORT_COLUMNS)
            )
            with clickhouse.connect(ctx.settings) as client, batches as reader:
                clickhouse.ensure_property_values(client, database, ctx.settings.clickhouse.ttl_days)
                for i, data in enumerate(rechunk(reader, chunk)):
                    if outbox_version is not None:
                        data = with_last_seen(data, g.window)
                    token = _token(seq, i, "c" if outbox_version is None else "f")
                    clickhouse.insert(client, clickhouse.PROPERTY_VALUES_TABLE, data, token, database)
                    sent += data.num_rows
            if figures.rows > figures.corrections:
                first_time = exported_rows(rows.where(~F.col("correction")))
                append_once(ctx.store, GOLD_EXPORTED, first_time, AppTxn(f"{app}#new", seq))
            if figures.corrections:
                ctx.store.merge(
                    GOLD_EXPORTED,
                    exported_rows(rows.where(F.col("correction"))),
                    on=EXPORTED_ON,
                    update=EXPORTED_UPDATE,
                    txns=[AppTxn(app, seq)],
                )
            else:  # nothing to correct: the commit records the batch alone
                ctx.store.append(GOLD_EXPORTED, GOLD_EXPORTED.arrow_schema.empty_table(), [AppTxn(app, seq)])
        finally:
            if written is None:
                rows.unpersist()
        count_sum, corrections = figures.count_sum, figures.corrections
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
        record.incr(rows_exported=sent, late_corrections=corrections, count_sum=count_sum)
        return sent

    def body(record: RunRecord) -> None:
        for spec in (GOLD_PROPERTY_VALUES, GOLD_EXPORTED, EXPORT_OUTBOX, EXPORTS):
            ctx.store.ensure(spec)
        out_seq = max(ctx.store.txn_version(EXPORT_OUTBOX, a) or 0 for a in (app, files_app))
        done_seq = ctx.store.txn_version(GOLD_EXPORTED, app) or 0
        if out_seq > done_seq:
            resent = deliver(out_seq, record)
            ctx.say(f"export: finished batch {out_seq} that a stopped run had left ({resent:,} rows)")
        version = ctx.store.version(GOLD_PROPERTY_VALUES)
        prev = None if out_seq == 0 else progress_of(ctx.store.read(EXPORT_OUTBOX, where=f"export_seq = {out_seq}"))
        if prev is not None and prev.gold_version == version and not drain:
            record.noop(f"gold has not changed since export batch {out_seq}")
            return
        cached: list[DataFrame] = []
        if prev is None:
            # The first export (or the first since the lake kept its progress): all of gold. Not
            # cached: the newest event time reads one column, the batch reads gold once.
            gold = ctx.store.read(GOLD_PROPERTY_VALUES)
            newest = newest_event(gold, None)
            exported = ctx.store.read(GOLD_EXPORTED)
        else:
            # Only what changed: the windows closed since the last batch, and the tuples of
            # windows closed before it that gold's change feed shows late counts for.
            changes = ctx.store.read_changes(GOLD_PROPERTY_VALUES, prev.gold_version + 1, version).persist()
            cached.append(changes)
            newest = newest_event(changes, prev.newest_event)
            late = changes.transform(changed_keys(g.window, prev.closed_through)).persist()
            cached.append(late)
            # The late tuples' windows, to read only their part of gold and of what was exported:
            # a list of window starts, bounded by the time the late data spans, not by its rows.
            windows = [r[0] for r in late.select(WINDOW_START).distinct().collect()]
            exported = ctx.store.read(GOLD_EXPORTED).where(F.col(WINDOW_START).isin(windows))
        if newest is None:
            for df in cached:
                df.unpersist()
            record.noop("gold is empty")
            return
        bounds = export_bounds(newest, g.window, g.grace, drain, prev)
        if prev is None:
            batch = gold.transform(
                export_batch(exported, g.window, bounds.closed_before, g.min_export_count, g.top_values_per_key)
            )
        else:
            batch = ctx.store.read(GOLD_PROPERTY_VALUES).transform(
                incremental_batch(
                    late,
                    windows,
                    exported,
                    g.window,
                    prev.closed_through,
                    bounds.closed_before,
                    g.min_export_count,
                    g.top_values_per_key,
                )
            )
        batch = batch.persist()
        cached.append(batch)
        # Two figures over the batch in one pass.
        flags = batch.agg(
            F.coalesce(F.sum(F.col("_gated").cast("long")), F.lit(0)),
            F.coalesce(F.sum(F.col("_dropped").cast("long")), F.lit(0)),
        ).first()
        gated, dropped = (int(flags[0]), int(flags[1])) if flags else (0, 0)
        seq = out_seq + 1
        sendable = batch.where("NOT _gated AND NOT _dropped").drop("_gated", "_dropped")
        to_send = quality.gate(ctx, record, EXPORT_DATASET, sendable, AppTxn(app, seq))
        # A view of the cached batch, not cached again: its figures in one pass over the cache.
        rows = to_send.transform(outbox_rows(seq, version, newest, bounds.through))
        figures = batch_figures(rows)
        record.add(gated=gated, top_values_dropped=dropped)
        if bounds.closed_before is not None:
            record.add(watermark_epoch_s=bounds.closed_before.timestamp())
        try:
            if figures.rows == 0:
                record.noop("no closed window has counts to export" + (f" ({gated:,} gated)" if gated else ""))
                return
            for df in cached:  # the batch's rows are all it needs from here on
                if df is not batch:
                    df.unpersist()
            outbox_version = ctx.store.append(EXPORT_OUTBOX, rows, [AppTxn(files_app, seq)])
            sent = deliver(seq, record, written=(rows, figures, outbox_version))
        finally:
            for df in cached:
                df.unpersist()
        record.rows_in = record.rows_out = sent
        ctx.say(
            f"export: batch {seq}: {sent:,} rows to ClickHouse {clickhouse.PROPERTY_VALUES_TABLE} "
            f"({int(record.metrics.get('late_corrections', 0)):,} corrections, {gated:,} gated)"
            + (" (drained)" if drain else "")
        )

    return run_job(ctx, "export.clickhouse", body)


def _token(seq: int, chunk: int, order: str) -> str:
    """The insert token of chunk ``chunk`` of batch ``seq``; ``order`` tells how the batch was cut:
    ``c`` sorted by key (batches written before ``f``), ``f`` in the order of the outbox's files."""
    return f"medallion:{GOLD_PROPERTY_VALUES.key}:batch{seq}:{order}{chunk}"
