"""Gold's conservation checks: figures that tie gold to its partials and to the silver fan-out,
and ClickHouse to the export state. Declared with the flows that write those tables
(:mod:`pipelines.flows`); ``medallion validate`` hands them to the tables' suites."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import Column
from pyspark.sql import functions as F

from gold.export import exported_of
from gold.property_values import fan_out
from pipelines.config.layers import fanout_rules
from pipelines.config.settings import Settings
from pipelines.flows import flow_names
from pipelines.runtime.flow_types import Frames
from pipelines.runtime.runner import app_id
from pipelines.runtime.tables import EXPORT_OUTBOX, GOLD_PARTIALS, GOLD_PROPERTY_VALUES, SILVER_EVENTS
from pipelines.sinks import clickhouse
from pipelines.storage import TableStore


def total_of(column: str) -> Column:
    """Sum of ``column`` as a long, 0 for no rows: the figures compare sums of possibly empty tables."""
    return F.coalesce(F.sum(column), F.lit(0)).cast("long")


def gold_frames(store: TableStore, settings: Settings) -> Frames | None:
    """Gold rows plus the figures that tie them to the partials and to the silver fan-out.

    The sums are taken at the versions the merge and stage-1 jobs recorded as processed, so a
    pipeline that is merely behind still conserves. Runs split by ``--bucket`` record per-bucket
    progress; the fan-out comparison is then skipped (and said so).
    """
    if not store.exists(GOLD_PROPERTY_VALUES):
        return None
    gold = store.read(GOLD_PROPERTY_VALUES)
    total = total_of("count")
    gold_sum = gold.agg(total).first()[0]  # type: ignore[index]
    merged = store.txn_version(GOLD_PROPERTY_VALUES, app_id(flow_names.GOLD_MERGE, GOLD_PARTIALS))
    # The partials as of the version stage 2 merged through (a backfill replaces some: what was
    # ever inserted is not what gold sums).
    partial_sum = (
        store.read_at(GOLD_PARTIALS, merged).agg(total).first()[0]  # type: ignore[index]
        if merged is not None
        else None
    )
    figures: dict[str, int | None] = {"gold_count_sum": gold_sum, "partial_count_sum": partial_sum}
    fanned = store.txn_version(GOLD_PARTIALS, app_id(flow_names.GOLD_PARTIALS, SILVER_EVENTS))
    note = None
    if fanned is not None and merged is not None and merged == store.version(GOLD_PARTIALS):
        events = store.read_at(SILVER_EVENTS, fanned)  # as stage 1 had read it (a backfill replaces some)
        fanned_out = events.transform(fan_out(fanout_rules(settings), settings.bronze.number_notation))
        tuples = fanned_out.where("skip_reason IS NULL").count()
        figures["fanout_tuples"] = tuples
    else:
        note = "partials_equal_fanout skipped: gold runs per bucket or the merge is behind its partials"
    frame = gold.sparkSession.createDataFrame(
        [figures], "gold_count_sum long, partial_count_sum long, fanout_tuples long"
    )
    return gold, frame, {"with_fanout": "fanout_tuples" in figures}, note


def clickhouse_frames(store: TableStore, settings: Settings) -> Frames | None:
    """ClickHouse's rows (merged with FINAL) and the figures that tie them to what the outbox sent."""
    if not store.exists(EXPORT_OUTBOX):
        return None
    with clickhouse.connect(settings) as client:
        rows = clickhouse.read_property_values(client, settings.clickhouse.database)
    df = store.to_spark(rows)
    # The outbox holds every row sent: what ClickHouse holds, summed per tuple and window.
    exported = store.read(EXPORT_OUTBOX).transform(exported_of).where("exported_count > 0")
    note = None
    ttl = settings.clickhouse.ttl_days
    if ttl:
        # Rows past the TTL leave ClickHouse whenever it merges, so both sides are held to the
        # windows none of whose rows can have expired yet (a day of margin).
        cutoff = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=ttl - 1)
        df = df.where(F.col("window_start") >= F.lit(cutoff))
        exported = exported.where(F.col("window_start") >= F.lit(cutoff))
        note = f"windows before {cutoff:%Y-%m-%d %H:%M} UTC left out: clickhouse.ttl_days={ttl} expires them"
    ex = exported.agg(total_of("exported_count"), F.count(F.lit(1))).first()
    ch = df.agg(total_of("count"), F.count(F.lit(1))).first()
    assert ex is not None and ch is not None
    figures = df.sparkSession.createDataFrame(
        [(ch[0], ex[0], ch[1], ex[1])],
        "clickhouse_count_sum long, exported_count_sum long, clickhouse_rows long, exported_rows long",
    )
    return df, figures, {}, note
