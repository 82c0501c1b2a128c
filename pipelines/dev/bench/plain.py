"""Plain-Spark peers: each Spark stage's own transforms, from Parquet to Parquet and nothing else.

A peer runs what the stage's job runs (the same bronze / silver / gold transforms, wired as the
jobs in ``pipelines.runtime.passes`` wire them) over the same input, but reads and writes plain Parquet: no
Delta, no app transactions, no quality gates, no event log. The stage's rate over its peer's
(``0.80x of plain Spark``) is then what that bookkeeping costs on top of the Spark work itself.

The input is written to Parquet once per stage, outside the timed runs, from the tables the stage
read, out of a lake the stage has just run in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bronze.events import BRONZE_EVENTS_COLUMNS, parse_events
from bronze.landing import LANDING_COLUMNS, RAW, VALUE, quarantined, valid
from gold.export import EXPORT_COLUMNS, EXPORTED_SCHEMA, export_batch, last_seen
from gold.metric_windows import close_windows, finish, raw_rows
from gold.property_values import fan_out, merge_source, partials
from pipelines.config import layers
from pipelines.dev.bench.measure import Figure, timed, warm_up_first
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_QUARANTINE,
    BRONZE_SAMPLES,
    GOLD_EXPORTED,
    GOLD_METRIC_WINDOWS,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
    SILVER_EVENTS,
    SILVER_METRIC_PANES,
    SILVER_PAGE_CHANGES,
)
from pipelines.sinks import clickhouse
from pipelines.sources.files import LandingFile, file_digests, landing_rows
from pipelines.storage import TableSpec
from silver.events import to_silver_events
from silver.metric_panes import pane_run, select_samples
from silver.page_changes import dedup_page_changes

if TYPE_CHECKING:
    from pipelines.dev.bench.measure import Bench

LABEL = "plain Spark"
PREFIX = f"{LABEL}: "  # a peer figure is named after its stage: "plain Spark: silver events"

#: Writes a DataFrame as Parquet under a name and returns it read back (what a next step reads).
Write = Callable[[str, DataFrame], DataFrame]
#: The stage's transforms: settings from the stage's context, its input read from Parquet. The
#: output that stands for the stage's table is written under that table's key.
Transform = Callable[[Context, DataFrame, Write], None]
#: The stage's input, from the lake the stage ran in.
Source = Callable[[Context], DataFrame]


def table(spec: TableSpec) -> Source:
    return lambda ctx: ctx.store.read(spec)


def landing(spec: TableSpec, kind: str) -> Source:
    """The landing rows a bronze stage parsed, rebuilt from the lake: the landed rows (``raw`` is the
    message text, so its bytes are the message) and the quarantined ones of ``kind``."""

    def read(ctx: Context) -> DataFrame:
        landed = ctx.store.read(spec).select(F.col(RAW).cast("binary").alias(VALUE), *LANDING_COLUMNS)
        rejected = ctx.store.read(BRONZE_QUARANTINE).where(F.col("kind") == kind)
        return landed.unionByName(rejected.select(F.col(RAW).alias(VALUE), *LANDING_COLUMNS))

    return read


# -- the stages' transforms, wired as the jobs wire them ------------------------------------------
def land_events(ctx: Context, rows: DataFrame, write: Write) -> None:
    # Persisted as the job does: both the landed and the quarantined rows come from one parse.
    parsed = rows.transform(parse_events(ctx.settings.kafka.max_message_bytes)).persist()
    write(BRONZE_EVENTS.key, valid(parsed, BRONZE_EVENTS_COLUMNS))
    write(BRONZE_QUARANTINE.key, quarantined(parsed, "events"))
    parsed.unpersist()


def land_event_files(ctx: Context, files: DataFrame, write: Write) -> None:
    """The files the stage landed, read and split into records as the stage reads them, then
    landed. ``files`` is a row per file (its path and its digest), found before the
    timing: which files to land is the stage's bookkeeping, reading them is its work."""
    # A row per file (path, digest): the list of files, not their rows.
    listed = [LandingFile(Path(r["path"]), r["digest"]) for r in files.collect()]
    land_events(ctx, landing_rows(ctx.spark, listed, datetime.now(UTC)), write)


def files_source(paths: Sequence[Path]) -> Source:
    """The files a stage lands, as a row per file; the peer reads their content itself."""

    def read(ctx: Context) -> DataFrame:
        found = file_digests(list(paths))
        rows = [(str(f.path), f.digest) for f in found]
        return ctx.spark.createDataFrame(rows, "path string, digest string")

    return read


def page_changes(ctx: Context, bronze: DataFrame, write: Write) -> None:
    # The stage drains one batch into a fresh lake: no state before it and every window closes,
    # which is the one-run transform (dedup_run with empty state and no watermark).
    cfg = ctx.settings.page_changes
    write(SILVER_PAGE_CHANGES.key, bronze.transform(dedup_page_changes(cfg.mode, cfg.window)))


def silver_events(ctx: Context, bronze: DataFrame, write: Write) -> None:
    write(SILVER_EVENTS.key, bronze.transform(to_silver_events(layers.bucket_mapping(ctx.settings))))


def gold(ctx: Context, events: DataFrame, write: Write) -> None:
    # Two steps as in the stage: stage 2 reads what stage 1 wrote.
    tuples = events.transform(fan_out(layers.fanout_rules(ctx.settings)))
    parts = write(GOLD_PARTIALS.key, tuples.transform(partials(ctx.settings.gold.window)))
    write(GOLD_PROPERTY_VALUES.key, parts.transform(merge_source()))


def export(ctx: Context, gold_rows: DataFrame, write: Write) -> None:
    # The stage drains (every window closed) against nothing exported before. The rows to send
    # are written as Parquet, then loaded into ClickHouse (a database of the peer's own) as the
    # stage sends them, in Arrow batches of the insert chunk size: the same delivery, without the
    # outbox, the send order and tokens, or the exported state.
    g = ctx.settings.gold
    exported = ctx.spark.createDataFrame([], EXPORTED_SCHEMA)
    batch = gold_rows.transform(export_batch(exported, g.window, None, g.min_export_count))
    sendable = batch.where("NOT _gated AND NOT _dropped").select(*EXPORT_COLUMNS, last_seen(g.window))
    sent = write(GOLD_EXPORTED.key, sendable)
    database = f"{ctx.settings.clickhouse.database}_plain"
    with clickhouse.connect(ctx.settings) as client:
        clickhouse.ensure_property_values(client, database)
        table = f"{database}.{clickhouse.PROPERTY_VALUES_TABLE}"
        client.command(f"TRUNCATE TABLE {table}")  # each run loads into an empty table, as the stage's does
        files = [pafs.FileSystem.from_uri(uri) for uri in sent.inputFiles()]
        if files:
            dataset = pads.dataset([path for _, path in files], filesystem=files[0][0], format="parquet")
            for rows in dataset.to_batches(batch_size=ctx.settings.clickhouse.insert_chunk_rows):
                client.insert_arrow(table, pa.Table.from_batches([rows]))


def metric_windows(ctx: Context, samples: DataFrame, write: Write) -> None:
    # Silver panes drained (every pane final, watermark one window past the newest sample), then
    # gold closes every window up to that watermark from the panes silver wrote.
    columns = ["metric_name", "labels", "series_id", "timestamp", "value"]
    for agg in ctx.settings.metrics.aggregations:
        mine = select_samples(samples.select(*columns), agg).persist()
        newest = mine.agg(F.max("timestamp")).first()
        if newest is None or newest[0] is None:
            mine.unpersist()
            continue
        through = newest[0] + agg.window
        lasts = mine.select("aggregation", "series_id", "timestamp", "value").limit(0)
        step = pane_run(agg, mine, mine.limit(0), lasts, None, through, 1, close_all=True)
        panes = write(f"{SILVER_METRIC_PANES.key}/{agg.name}", step.panes)
        windows = raw_rows(panes) if agg.raw else close_windows(agg, panes, panes, None, through)
        write(f"{GOLD_METRIC_WINDOWS.key}/{agg.name}", finish(windows))
        mine.unpersist()


@dataclass(frozen=True)
class Peer:
    source: Source
    transform: Transform
    #: The stage's output table: the peer's output under its key should have as many rows, which
    #: shows that the peer did the stage's work.
    target: TableSpec


LAND_EVENTS = Peer(landing(BRONZE_EVENTS, "events"), land_events, BRONZE_EVENTS)
METRIC_WINDOWS = Peer(table(BRONZE_SAMPLES), metric_windows, GOLD_METRIC_WINDOWS)

#: Stage -> its plain-Spark peer: where its input comes from, the transforms it runs, its output.
PEERS: dict[str, Peer] = {
    "files -> bronze (events)": LAND_EVENTS,
    "silver page changes": Peer(table(BRONZE_PAGE_CHANGES), page_changes, SILVER_PAGE_CHANGES),
    "silver events": Peer(table(BRONZE_EVENTS), silver_events, SILVER_EVENTS),
    "gold (stage 1 + 2)": Peer(table(SILVER_EVENTS), gold, GOLD_PROPERTY_VALUES),
    "export to ClickHouse": Peer(table(GOLD_PROPERTY_VALUES), export, GOLD_EXPORTED),
    "Kafka -> bronze (Tansu), PostHog fixture events": LAND_EVENTS,
    "samples -> metric windows (tumbling 1m)": METRIC_WINDOWS,
    "samples -> metric windows (sliding 1m, 6 panes)": METRIC_WINDOWS,
}


def _write(spark: SparkSession, output: str, name: str, df: DataFrame) -> DataFrame:
    path = f"{output}/{name}"
    df.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path)


def _folder(stage: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-")


#: Stages that land files -> their peer over given files, which it reads as the stage does.
FILE_PEERS: dict[str, Callable[[Sequence[Path]], Peer]] = {
    "files -> bronze (events)": lambda paths: Peer(files_source(paths), land_event_files, BRONZE_EVENTS)
}


def measure(b: Bench, ctx: Context, stages: Iterable[str], files: dict[str, Sequence[Path]] | None = None) -> None:
    """Time the plain-Spark peer of each of ``stages``, over the input ``ctx``'s lake holds, or
    for a stage named in ``files``, over those files, read as the stage read them."""
    for stage in stages:
        ours = b.figures.get(stage)
        if ours is None or not ours.units:
            continue  # the stage was skipped: nothing to compare with
        peer = FILE_PEERS[stage](files[stage]) if files and stage in files else PEERS[stage]
        root = b.out / "work" / "plain" / _folder(stage)
        source, output = str(root / "input"), str(root / "output")
        peer.source(ctx).write.mode("overwrite").parquet(source)
        write = partial(_write, ctx.spark, output)

        fig = b.figure(PREFIX + stage, ours.unit)
        for attempt in range(b.repeats + 1):
            # The stage's units (events in, rows out), so the two rates compare the same work.
            with timed(warm_up_first(fig, attempt), ours.units[-1]):
                peer.transform(ctx, ctx.spark.read.parquet(source), write)
        # One folder per aggregation for the metric windows, hence the recursive lookup.
        rows = ctx.spark.read.option("recursiveFileLookup", "true").parquet(f"{output}/{peer.target.key}").count()
        theirs = ctx.store.read(peer.target).count()
        same = "as many as the stage's" if rows == theirs else f"where the stage wrote {theirs:,} to"
        fig.note = f"{rows:,} rows out, {same} {peer.target.key}"
        ours.peers[LABEL] = fig.stage


def sum_of(b: Bench, stage: str, parts: Sequence[str]) -> None:
    """The peer of a stage that is the sum of others (end to end): its peers' times summed per run."""
    peers = [b.figures.get(PREFIX + p) for p in parts]
    ours = b.figures.get(stage)
    if ours is None or not ours.units or any(p is None for p in peers):
        return
    fig = b.figures.setdefault(PREFIX + stage, Figure(PREFIX + stage, ours.unit))
    fig.seconds = [round(sum(run), 3) for run in zip(*(p.seconds for p in peers if p), strict=True)]
    fig.units = [ours.units[-1]] * len(fig.seconds)
    fig.note = "the sum of the plain-Spark peers of " + ", ".join(parts)
    ours.peers[LABEL] = fig.stage
