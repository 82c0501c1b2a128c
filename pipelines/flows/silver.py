"""Silver events: bronze events -> bucketed silver events, each event once (page changes:
:mod:`pipelines.flows.page_changes`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.config.layers import bucket_mapping
from pipelines.config.settings import Settings
from pipelines.runtime.flow_types import Batch, FlowRecord
from pipelines.runtime.tables import BRONZE_EVENTS, SILVER_EVENTS
from silver.buckets import BucketMapping, assign_buckets, in_buckets
from silver.dedup import (
    IDENTITY,
    LANDED_AT,
    REPEAT,
    first_copies,
    held_repeats,
    held_suspects,
    mark_held_repeats,
    mark_repeats,
    suspects,
)
from silver.events import to_silver_events


@dataclass(frozen=True)
class SilverConfig:
    """What silver.events is configured with: the team buckets and the dedup horizon (0: off)."""

    mapping: BucketMapping
    horizon: timedelta


def silver_config(settings: Settings) -> SilverConfig:
    return SilverConfig(bucket_mapping(settings), settings.silver.dedup_horizon)


def silver_rules(config: SilverConfig) -> dict[str, Any]:
    """The settings silver's events depend on, as its event-log rows record them (a run's and a
    backfill's, in JSON's types): what ``medallion backfill silver`` compares to say which changed."""
    m = config.mapping
    return {
        "dedup_horizon": str(config.horizon),
        "buckets.count": m.count,
        "buckets.pinned": {str(team): b for team, b in sorted(m.pinned.items())},
        "buckets.tiers": {tier: list(bs) for tier, bs in sorted(m.tiers.items())},
        "buckets.team_tiers": {str(team): tier for team, tier in sorted(m.team_tiers.items())},
    }


def events(batch: Batch, config: SilverConfig, record: FlowRecord) -> DataFrame:
    """New bronze events -> silver events with their team bucket (this run's buckets only), each
    event once: repeats of an identity silver or the batch already holds within the horizon are
    dropped and counted (:mod:`silver.dedup`).

    Not cached: the gate's checks and the figures read the event columns only, and the write
    copies the event's JSON as it landed (gold reads its properties from it).
    """
    rows = batch.rows.transform(assign_buckets(config.mapping)).transform(in_buckets(batch.options.buckets))
    if config.horizon:
        rows = rows.transform(without_repeats(batch, config.horizon, record))
    out = rows.transform(to_silver_events(config.mapping))
    buckets = batch.options.buckets or range(config.mapping.count)
    if len(buckets) > OBSERVED_BUCKETS:  # a figure per bucket is a query of its own (events_figures)
        return out
    return record.observe(BUCKET_FIGURES, out, **bucket_figures(buckets))


#: Per-bucket figures are computed by the write for runs over at most this many buckets (two
#: aggregates per bucket); a run over more counts them in a query after the write.
OBSERVED_BUCKETS = 64
BUCKET_FIGURES = "buckets"


def bucket_figures(buckets: Iterable[int]) -> dict[str, Column]:
    """The events of each bucket and the newest event time among them, as aggregates named
    ``n<bucket>`` and ``t<bucket>``."""
    figures = {}
    for b in buckets:
        mine = F.col("bucket") == F.lit(b)
        figures[f"n{b}"] = F.count_if(mine)
        figures[f"t{b}"] = F.max(F.when(mine, F.col("event_time")))
    return figures


#: Suspect identities up to this many are broadcast to the anti-join that lets every other row by.
BROADCAST_SUSPECTS = 2_000_000
#: A batch of at most this many rows is broadcast to narrow silver's identities to the batch's.
BROADCAST_BATCH = 100_000
#: A batch of at most this many rows reads silver for its own ids alone (``uuid IN (...)``), which
#: Spark hands to Parquet's Bloom filters up to ``spark.sql.parquet.pushdown.inFilterThreshold``
#: (10) values; with more, a row group's filter would seldom rule out all of them.
LOOKUP_IDS = 10
#: The observed figure of the repeats a batch dropped (:func:`without_repeats`).
REPEATS = "repeats"


def without_repeats(batch: Batch, horizon: timedelta, record: FlowRecord) -> Callable[[DataFrame], DataFrame]:
    """Bucketed bronze rows -> the same rows without repeats of an event; the repeats dropped are
    counted as the rows are read (observed as :data:`REPEATS`, ``duplicates_dropped`` in the log).

    The batch's earliest event time (silver is read from the horizon before it) comes from its
    files' statistics, with no Spark job (a query where they do not say it, and for a run over some
    buckets, whose rows are a part of those files'), and its size from
    the write's figures (:func:`events_figures`: rows written and repeats dropped). A batch of at
    most :data:`LOOKUP_IDS` rows reads silver for its own ids alone, skipping the row groups whose
    Bloom filters rule them all out, however much silver the horizon covers, and is written as it
    is when neither it nor silver holds one of its identities twice (:func:`_may_repeat`: two
    small queries, where the general path shuffles three times). Only the
    suspects (:func:`silver.dedup.suspects`: identities the batch or silver holds more than once,
    found in one aggregation of identity columns; in the driver, with no Spark job, where the
    batch's and silver's identities in the horizon are known to be small, :func:`_held_suspects`,
    which then decides the repeats there too where the rows' landing places order them,
    :func:`silver.dedup.held_repeats`: the batch is read once, its repeats dropped by where they
    landed) go through the window that finds the first copy;
    they and their rows are cached, as few as the repeats, by the first pass that reads them (no
    count of its own). Every other row passes by an anti-join with the suspects (broadcast up to
    :data:`BROADCAST_SUSPECTS`), so the gate, the write and the figures each read the batch as they
    would without deduplication.
    """

    def transform(rows: DataFrame) -> DataFrame:
        if batch.added is not None and batch.added.rows <= LOOKUP_IDS and not _may_repeat(batch, rows, horizon):
            return rows
        # A run over every bucket takes all the rows its commits added, so their statistics give
        # its earliest time (to the millisecond Delta keeps, rounded down); a run over some buckets
        # asks its own rows, so what it checks never depends on another bucket's events.
        added = None if batch.options.buckets else batch.added
        if added is not None and ("timestamp" in added.earliest or not added.rows):
            earliest = added.earliest.get("timestamp")
        else:  # one row: the batch's earliest event time (Spark gives it in local time)
            first = rows.agg(F.min("timestamp")).first()
            earliest = first[0].astimezone(UTC) if first and first[0] is not None else None
        found = _held_suspects(batch, earliest, horizon)
        if found is not None:  # found in the driver, with no Spark job
            return _dropping_held(rows, batch, *found, horizon, record)
        held = None
        if earliest is not None:
            since = earliest - horizon
            held = batch.read_since(SILVER_EVENTS, "event_time", since).transform(in_buckets(batch.options.buckets))
            if batch.added is not None and batch.added.rows <= LOOKUP_IDS:
                # Provably small: the batch's commits hold at most LOOKUP_IDS rows (they bound a
                # run over some buckets too), so at most that many ids reach the driver; a filter
                # by them skips silver's row groups by their Bloom filters (SILVER_EVENTS).
                uuids = [r[0] for r in rows.where(F.col("uuid").isNotNull()).select("uuid").distinct().collect()]
                held = held.where(F.col("uuid").isin(uuids))
        # A batch of at most BROADCAST_BATCH rows (its commits' rows bound a run over some buckets
        # too) narrows silver's identities to its own before they are grouped.
        few = batch.added is not None and batch.added.rows <= BROADCAST_BATCH
        maybe = record.cache(suspects(rows, held, few=few))
        return _dropping(rows, maybe, maybe.count(), horizon, record)  # the count materializes the cache

    return transform


def _dropping_held(
    rows: DataFrame, batch: Batch, landed: pa.Table, maybe: pa.Table, horizon: timedelta, record: FlowRecord
) -> DataFrame:
    """The batch's rows without the repeats among its suspects found in the driver (``maybe``, with
    ``landed``: where each held row landed, :func:`_held_suspects`): decided there too where the
    rows' landing places order them (the batch is read once and its repeats dropped by a broadcast
    join), by Spark's window where two rows landed at one place."""
    if not maybe.num_rows:
        return rows
    repeats = held_repeats(landed, maybe, horizon)
    if repeats is None:  # two rows landed at one place: only Spark's window orders them
        return _dropping(rows, batch.tables.to_spark(maybe), maybe.num_rows, horizon, record)
    if not repeats.num_rows:
        return rows
    marked = rows.transform(mark_held_repeats(batch.tables.to_spark(repeats)))
    return first_copies(record.observe(REPEATS, marked, n=F.count_if(F.col(REPEAT))))


def _dropping(rows: DataFrame, maybe: DataFrame, n_suspects: int, horizon: timedelta, record: FlowRecord) -> DataFrame:
    """The batch's rows without the repeats among its ``n_suspects`` suspects (``maybe``:
    :func:`silver.dedup.suspects`): the suspects' rows through the window that finds each first
    copy, every other row by an anti-join."""
    if not n_suspects:  # no identity held twice: nothing to drop
        return rows
    ids = maybe.select(*IDENTITY)
    if n_suspects <= BROADCAST_SUSPECTS:
        ids = F.broadcast(ids)
    marked = record.cache(
        rows.join(ids, list(IDENTITY), "left_semi").transform(mark_repeats(maybe, horizon, time="timestamp"))
    )
    # Counted by the pass that fills the cache (the gate's or the write's): no pass of its own.
    marked = record.observe(REPEATS, marked, n=F.count_if(F.col(REPEAT)))
    return rows.join(ids, list(IDENTITY), "left_anti").unionByName(first_copies(marked))


#: A batch of at most this many rows, beside at most this many of silver's in the horizon (by the
#: logs' counts), finds its suspects in the driver: about 150 bytes a batch row in Arrow (identity,
#: landing place, time), 60 a silver row. At 1,020,000 rows a side the driver peaked 0.6 GB higher
#: than on Spark's path, and the run took 11.6 s against Spark's 14.7 (docs/performance.md).
HELD_IDENTITIES = 1_500_000


#: What the driver reads of a batch held there: identities, where each row landed and its time.
HELD_BATCH_COLUMNS = (*IDENTITY, *LANDED_AT, "timestamp")


def _held_suspects(batch: Batch, earliest: datetime | None, horizon: timedelta) -> tuple[pa.Table, pa.Table] | None:
    """(the batch's :data:`HELD_BATCH_COLUMNS`, its suspects: :func:`silver.dedup.held_suspects`,
    at most as many as its rows), found in the driver from the batch's columns and silver's
    identities in the horizon before ``earliest``, read from their files with no Spark job. None
    where the batch or silver's part is not known to be small (at most :data:`HELD_IDENTITIES` rows
    each, by their logs), for a run over some buckets (whose rows are a part of its commits'), or
    where the engine reads through Spark only."""
    added = batch.added
    if batch.options.buckets or added is None or added.rows > HELD_IDENTITIES:
        return None
    ids = batch.tables.held_changes(BRONZE_EVENTS, batch.start, batch.end, HELD_BATCH_COLUMNS)
    held = None
    if ids is not None and earliest is not None:
        columns = (*IDENTITY, "event_time")
        held = batch.tables.held_since(SILVER_EVENTS, "event_time", earliest - horizon, columns, HELD_IDENTITIES)
        if held is None:
            return None
    return None if ids is None else (ids, held_suspects(ids, held))


def _may_repeat(batch: Batch, rows: DataFrame, horizon: timedelta) -> bool:
    """Whether a batch of at most :data:`LOOKUP_IDS` rows may hold a repeat: an identity twice in
    the batch, or one silver holds from the horizon before the batch's earliest event on. Two
    queries that neither shuffle nor aggregate: the batch's identities and times (provably small:
    its commits hold at most LOOKUP_IDS rows, which bound a run over some buckets too), then at
    most one row of silver holding one of them (read by ``uuid IN``, which skips silver's row
    groups by their Bloom filters). True sends the batch through :func:`without_repeats`' general
    path, which finds and drops the repeats themselves."""
    found = rows.select(*IDENTITY, "timestamp").collect()
    ids = {(r["team_id"], r["uuid"]) for r in found if r["team_id"] is not None and r["uuid"] is not None}
    if len(ids) < sum(1 for r in found if r["team_id"] is not None and r["uuid"] is not None):
        return True  # an identity the batch holds twice
    times = [r["timestamp"] for r in found if r["timestamp"] is not None]
    if not ids or not times:
        return False
    since = min(times).astimezone(UTC) - horizon  # Spark gives it in local time
    pairs = reduce(or_, [(F.col("team_id") == F.lit(t)) & (F.col("uuid") == F.lit(u)) for t, u in sorted(ids)])
    held = batch.read_since(SILVER_EVENTS, "event_time", since).transform(in_buckets(batch.options.buckets))
    held = held.where(F.col("uuid").isin(sorted({u for _, u in ids}))).where(pairs)
    return bool(held.select(F.lit(1)).limit(1).collect())  # at most one row


def events_figures(out: DataFrame, config: SilverConfig, record: FlowRecord) -> None:
    observed = record.observed(BUCKET_FIGURES)
    if observed:  # counted by the write
        buckets = sorted(int(k[1:]) for k in observed if k.startswith("n"))
        per_bucket = [{"bucket": b, "n": observed[f"n{b}"], "t": observed[f"t{b}"]} for b in buckets]
        per_bucket = [r for r in per_bucket if r["n"]]
    else:  # one row per bucket: the batch's figures, not its rows
        per_bucket = [
            r.asDict()
            for r in out.groupBy("bucket").agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("t")).collect()
        ]
    n_out = sum(int(r["n"]) for r in per_bucket)
    repeats = int(record.observed(REPEATS).get("n") or 0)  # none observed: no suspect, nothing dropped
    n_in = n_out + repeats  # the batch in this run's buckets: what was written and what was dropped
    if config.horizon:
        record.add(input_events=n_in, duplicates_dropped=repeats)
    record.rows(n_in, n_out)
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
    dropped = f", {repeats:,} repeat(s) dropped" if repeats else ""
    record.describe(json.dumps({"rules": silver_rules(config)}))
    record.say(f"silver/events: {n_out:,} events in {len(per_bucket)} bucket(s){dropped}")
