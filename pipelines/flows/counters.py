"""Counter jobs: silver events -> partial increments -> tiered flushes into totals -> milestones, ClickHouse."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.counters import (
    FLUSH_INSERT,
    FLUSH_ON,
    FLUSH_UPDATE,
    FLUSH_WHEN,
    Registry,
    by_version,
    crossings,
    exported_changes,
    flush_source,
    increments,
)
from pipelines.config.layers import counter_registry
from pipelines.config.sections import ClickHouseSettings
from pipelines.config.settings import Settings
from pipelines.flows import flow_names
from pipelines.runtime.flow_types import Batch, ExportRun, FlowRecord, MergeRules
from pipelines.runtime.runner import app_id
from pipelines.runtime.tables import COUNTER_EXPORTS, GOLD_COUNTERS
from pipelines.sinks import clickhouse
from pipelines.storage import AppTxn

EXPORT_APP = app_id(flow_names.EXPORT_COUNTERS, GOLD_COUNTERS)
NO_REGISTRY = "no counter registry configured (counters.registry)"


@dataclass(frozen=True)
class CounterConfig:
    """What the counter flows are configured with: the registry (None: no counters), the window and
    the notation properties' numbers are written in (which a registry value matches)."""

    registry: Registry | None
    window: timedelta
    notation: str = "javascript"


def counter_config(settings: Settings) -> CounterConfig:
    return CounterConfig(counter_registry(settings), settings.counters.window, settings.bronze.number_notation)


def no_registry(config: CounterConfig) -> str | None:
    return NO_REGISTRY if config.registry is None else None


def partials(batch: Batch, config: CounterConfig, record: FlowRecord) -> DataFrame:
    """Stage 1: new silver events -> increments per counter, entity and window."""
    assert config.registry is not None  # no_registry
    return record.cache(increments(batch.rows, config.registry, config.window, batch.end, config.notation))


def partials_figures(rows: DataFrame, config: CounterConfig, record: FlowRecord) -> None:
    # One row of totals.
    totals = rows.agg(F.count(F.lit(1)).alias("rows"), F.sum("count").alias("n")).first()
    n, n_rows = (int(totals["n"] or 0), int(totals["rows"])) if totals else (0, 0)
    record.rows(n, n_rows)
    record.add(increments=n, partial_rows=n_rows)
    record.say(f"gold/counter_partials: {n:,} increments -> {n_rows:,} partial rows")


def flush(batch: Batch, config: CounterConfig, record: FlowRecord) -> DataFrame | None:
    """Stage 2: the entities whose tier is due, with their new partials added to their totals
    (the source of the MERGE into the totals, :data:`COUNTER_FLUSH`). The batch is every partial.

    A drain flushes every entity with new partials whatever its tier (the end of a backfill).
    """
    assert config.registry is not None  # no_registry
    parts = record.cache(batch.rows)
    stats = parts.agg(F.max("seq").alias("seq"), F.max("window_end").alias("clock")).first()
    if stats is None or stats["seq"] is None:
        record.noop("no counter partials yet")
        return None
    seq, clock = int(stats["seq"]), stats["clock"]
    source = record.cache(
        flush_source(parts, batch.read(GOLD_COUNTERS), config.registry, clock, seq, force=batch.options.drain)
    )
    n_source = source.count()
    if n_source == 0:
        record.noop("no entity is due for a flush")
        return None
    record.rows(n_source, n_source)
    record.add(flushed_entities=n_source, clock_epoch_s=clock.timestamp(), partial_seq=seq)
    return source


def flush_figures(rows: DataFrame, config: CounterConfig, record: FlowRecord) -> None:
    record.say(
        f"gold/counters: flushed {int(record.figure('flushed_entities')):,} entities "
        f"through batch {int(record.figure('partial_seq'))}"
    )


#: How a flush writes: only where the entity's flushed batch is still the one the flush read.
COUNTER_FLUSH = MergeRules(lambda _buckets: FLUSH_ON, FLUSH_UPDATE, FLUSH_INSERT, FLUSH_WHEN)


def milestones(batch: Batch, config: CounterConfig, record: FlowRecord) -> DataFrame:
    """Thresholds crossed by committed counter changes (the batch is gold/counters' change feed)."""
    assert config.registry is not None  # no_registry
    return record.cache(crossings(batch.rows, config.registry))


def milestones_figures(rows: DataFrame, config: CounterConfig, record: FlowRecord) -> None:
    n = rows.count()
    record.rows(0, n)
    record.add(milestones=n)
    record.say(f"gold/counter_milestones: {n:,} threshold(s) crossed")


def to_clickhouse(run: ExportRun, ch: ClickHouseSettings, record: FlowRecord) -> None:
    """gold/counters -> ClickHouse ``counters``, one counters version per insert, exactly once.

    Each version's changed rows go in one insert with the token ``gold/counters:v<version>``, then
    the version is recorded (app transaction on ``_meta/counter_exports``). A run stopped between
    the two resends the same rows with the same token, which ClickHouse drops; the table is a
    ReplacingMergeTree on (counter, entity) by version, so ``FINAL`` shows one row per entity.
    """
    tables = run.tables
    inc = tables.pending(GOLD_COUNTERS, COUNTER_EXPORTS, EXPORT_APP)
    if inc is None:
        record.noop("no new counter changes")
        return
    changes = exported_changes(tables.read_changes(GOLD_COUNTERS, inc.start, inc.end))
    sent, versions = 0, []
    with clickhouse.connect(ch) as client, tables.stream(changes) as batches:
        clickhouse.ensure_counters(client, ch.database)
        # One insert per counters version (its token); the driver holds one version's rows.
        for rows in by_version(batches):
            version = rows["version"][0].as_py()
            token = f"medallion:gold/counters:v{version}"
            clickhouse.insert(client, clickhouse.COUNTERS_TABLE, rows, token, ch.database)
            log_row = pa.Table.from_pylist(
                [{"counters_version": version, "rows": rows.num_rows, "exported_at": datetime.now(UTC)}],
                schema=COUNTER_EXPORTS.arrow_schema,
            )
            tables.append(COUNTER_EXPORTS, log_row, [AppTxn(EXPORT_APP, version)])
            sent += rows.num_rows
            versions.append(version)
    if not versions or versions[-1] < inc.end:
        # Versions without row changes (table creation, optimize) are recorded as done too.
        tables.append(COUNTER_EXPORTS, COUNTER_EXPORTS.arrow_schema.empty_table(), [inc.txn])
    record.rows(sent, sent)
    record.add(versions=len(versions), source_from=inc.start, source_to=inc.end)
    record.say(
        f"export: {sent:,} counter rows from {len(versions)} version(s) to ClickHouse {clickhouse.COUNTERS_TABLE}"
    )


def clickhouse_settings(settings: Settings) -> ClickHouseSettings:
    return settings.clickhouse
