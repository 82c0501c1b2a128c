"""Plain-Spark peers: what a careful Spark engineer writes for each Spark stage's output, from
Parquet to Parquet and nothing else.

A peer does the stage's work (one parse of each event, its deduplication, its fan-out and
aggregations, with the transforms of bronze / silver / gold, which parse once and run native
functions) over the same input, and writes the same rows laid out as the stage lays them out (the
table's partitions, its sort and file size), but as plain Parquet: no Delta, no app transactions,
no quality gates, no event log, no figures. The stage's rate over its peer's (``0.80x of plain
Spark``) is then what that bookkeeping costs on top of the Spark work itself. Each peer is held to
its stage by its rows: the same multiset (a hash of every row, order aside), less the columns each
run stamps with its own time.

The input is written to Parquet once per stage, outside the timed runs, from the tables the stage
read, out of a lake the stage has just run in (the files the stage landed, for the landing).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, MapType

from bronze.events import BRONZE_EVENTS_COLUMNS, parse_events
from bronze.landing import LANDING_COLUMNS, RAW, VALUE, quarantined, valid
from gold.export import EXPORT_COLUMNS, EXPORTED_SCHEMA, export_batch, last_seen
from gold.metric_windows import close_windows, finish, raw_rows
from gold.property_values import fan_out, merge_source, partials
from pipelines.config import layers
from pipelines.dev.bench.measure import Figure, timed, warm_up_first
from pipelines.flows.silver import META_ID
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
from pipelines.storage.conform import clustered, conform_df
from silver.buckets import assign_buckets
from silver.dedup import IDENTITY, LANDING_ORDER, first_copies, mark_repeats, suspects
from silver.events import to_silver_events
from silver.metric_panes import pane_run, select_samples
from silver.page_changes import dedup_page_changes

if TYPE_CHECKING:
    from pipelines.dev.bench.measure import Bench

LABEL = "plain Spark"
PREFIX = f"{LABEL}: "  # a peer figure is named after its stage: "plain Spark: silver events"

#: Writes a DataFrame as Parquet as the table writes it, under its key, and returns it read back
#: (what a next step reads).
Write = Callable[[TableSpec, DataFrame], DataFrame]
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


#: The order rows landed in, as a peer reads them: a copy of one load, which has no commit versions.
ONE_LOAD_ORDER = tuple(c for c in LANDING_ORDER if c != "_commit_version")


# -- the stages' transforms, wired as the jobs wire them ------------------------------------------
def land_events(ctx: Context, rows: DataFrame, write: Write) -> None:
    # Persisted as the job does: both the landed and the quarantined rows come from one parse.
    settings = ctx.settings
    parsed = rows.transform(parse_events(settings.kafka.max_message_bytes)).persist()
    write(BRONZE_EVENTS, valid(parsed, BRONZE_EVENTS_COLUMNS))
    write(BRONZE_QUARANTINE, quarantined(parsed, "events"))
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
    # An exact repeat (a meta.id landed before, within the horizon) is dropped first, as the stage
    # drops it, in the order the changes landed (one load: no commit versions).
    cfg, horizon = ctx.settings.page_changes, ctx.settings.silver.dedup_horizon
    if horizon:
        marked = bronze.transform(mark_repeats(None, horizon, order=ONE_LOAD_ORDER, identity=META_ID))
        bronze = first_copies(marked)
    write(SILVER_PAGE_CHANGES, bronze.transform(dedup_page_changes(cfg.mode, cfg.window)))


def silver_events(ctx: Context, bronze: DataFrame, write: Write) -> None:
    # The stage's work on a first load: each event once (a repeat of an identity the batch holds
    # within the horizon dropped; only the identities held twice go through the window that
    # finds the first copy, in the order they landed: one load, so no commit versions), then its bucket.
    mapping, horizon = layers.bucket_mapping(ctx.settings), ctx.settings.silver.dedup_horizon
    rows = bronze.transform(assign_buckets(mapping))
    if horizon:
        twice = F.broadcast(suspects(rows, None).select(*IDENTITY))
        marked = rows.join(twice, list(IDENTITY), "left_semi").transform(
            mark_repeats(None, horizon, "timestamp", ONE_LOAD_ORDER)
        )
        rows = rows.join(twice, list(IDENTITY), "left_anti").unionByName(first_copies(marked))
    write(SILVER_EVENTS, rows.transform(to_silver_events(mapping)))


def gold(ctx: Context, events: DataFrame, write: Write) -> None:
    # Two steps as in the stage: stage 2 reads what stage 1 wrote.
    tuples = events.transform(fan_out(layers.fanout_rules(ctx.settings), ctx.settings.bronze.number_notation))
    parts = write(GOLD_PARTIALS, tuples.transform(partials(ctx.settings.gold.window)))
    write(GOLD_PROPERTY_VALUES, parts.transform(merge_source()))


def export(ctx: Context, gold_rows: DataFrame, write: Write) -> None:
    # The stage drains (every window closed) against nothing exported before. What is exported is
    # written as the stage records it, and the rows to send as Parquet, then loaded into
    # ClickHouse (a database of the peer's own) as the stage sends them, in Arrow batches of the
    # insert chunk size: the same delivery, without the outbox, the send order and tokens.
    g = ctx.settings.gold
    exported = ctx.spark.createDataFrame([], EXPORTED_SCHEMA)
    batch = gold_rows.transform(export_batch(exported, g.window, None, g.min_export_count))
    sendable = batch.where("NOT _gated AND NOT _dropped")
    count = F.col("count").alias("exported_count")
    write(GOLD_EXPORTED, sendable.select(*EXPORT_COLUMNS[:-1], count, F.lit(1).alias("export_seq")))
    rows = sendable.select(*EXPORT_COLUMNS, last_seen(g.window))
    sent = write(TableSpec("peer", "clickhouse_rows", rows.schema), rows)
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
        panes = write(replace(SILVER_METRIC_PANES, name=f"{SILVER_METRIC_PANES.name}/{agg.name}"), step.panes)
        windows = raw_rows(panes) if agg.raw else close_windows(agg, panes, panes, None, through)
        write(replace(GOLD_METRIC_WINDOWS, name=f"{GOLD_METRIC_WINDOWS.name}/{agg.name}"), finish(windows))
        mine.unpersist()


@dataclass(frozen=True)
class Peer:
    source: Source
    transform: Transform
    #: The stage's output table: the peer's rows under its key must be the stage's (:func:`rows_hash`).
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

#: Columns each run stamps with its own time (when it landed, counted, exported a row, how far it
#: closed windows) or with its source's commit (a peer reads a copy of one load, with none): left
#: out of the comparison of a peer's rows with its stage's.
RUN_STAMPED = (
    "ingest_time",
    "created_at",
    "first_seen",
    "last_seen",
    "exported_at",
    "closed_through",
    "bronze_version",
)


def write_as(spark: SparkSession, output: str, spec: TableSpec, df: DataFrame) -> DataFrame:
    """``df`` as ``spec``'s rows, laid out as the stage's writer lays them out (its partitions, each
    task's rows sorted by its clustering, files of at most its rows), as plain Parquet."""
    path = f"{output}/{spec.key}"
    writer = clustered(conform_df(df, spec.schema), spec.partition_by, spec.cluster_by).write.mode("overwrite")
    if spec.partition_by:
        writer = writer.partitionBy(*spec.partition_by)
    if spec.file_rows:
        writer = writer.option("maxRecordsPerFile", spec.file_rows)
    writer.parquet(path)
    return spark.read.parquet(path)


#: The ranks a quantile sketch is compared at: two sketches of the same values merged in another
#: order differ in their bytes, not in what they answer.
_RANKS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


def _hashed(df: DataFrame, column: str) -> Column:
    """A column as two runs of the same work give it alike: a map's entries in key order, a double
    to 12 significant digits (a sum added up in another order differs in its last bits), a KLL
    sketch by its quantiles."""
    kind, c = df.schema[column].dataType, F.col(column)
    if isinstance(kind, MapType):
        return F.array_sort(F.map_entries(c))
    if isinstance(kind, DoubleType):
        return F.format_string("%.12g", c)
    if column == "quantiles":
        return F.array(*(F.kll_sketch_get_quantile_double(c, F.lit(r)) for r in _RANKS)).cast("array<string>")
    return c


def rows_hash(df: DataFrame, columns: Sequence[str]) -> tuple[int, ...]:
    """(rows, the sum of each row's 64-bit hash over ``columns``, then the sum of each column's):
    equal for two frames that hold the same rows in any order. One row of figures."""
    sums = [F.xxhash64(*(_hashed(df, c) for c in columns)), *(F.xxhash64(_hashed(df, c)) for c in columns)]
    row = df.agg(F.count(F.lit(1)), *(F.sum(h.cast("decimal(38,0)")) for h in sums)).first()
    return tuple(int(v or 0) for v in row) if row is not None else (0,) * (len(columns) + 2)


def _folder(stage: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-")


#: Stages that land files -> their peer over given files, which it reads as the stage does.
FILE_PEERS: dict[str, Callable[[Sequence[Path]], Peer]] = {
    "files -> bronze (events)": lambda paths: Peer(files_source(paths), land_event_files, BRONZE_EVENTS)
}


def measure(b: Bench, ctx: Context, stages: Iterable[str], files: dict[str, Sequence[Path]] | None = None) -> None:
    """Time the plain-Spark peer of each of ``stages``, over the input ``ctx``'s lake holds, or
    for a stage named in ``files``, over those files, read as the stage read them; then hold the
    peer's rows to the stage's."""
    for stage in stages:
        ours = b.figures.get(stage)
        if ours is None or not ours.units:
            continue  # the stage was skipped: nothing to compare with
        peer = FILE_PEERS[stage](files[stage]) if files and stage in files else PEERS[stage]
        root = b.out / "work" / "plain" / _folder(stage)
        source, output = str(root / "input"), str(root / "output")
        peer.source(ctx).write.mode("overwrite").parquet(source)
        write = partial(write_as, ctx.spark, output)

        fig = b.figure(PREFIX + stage, ours.unit)
        for attempt in range(b.repeats + 1):
            # The stage's units (events in, rows out), so the two rates compare the same work.
            with timed(warm_up_first(fig, attempt), ours.units[-1]):
                peer.transform(ctx, ctx.spark.read.parquet(source), write)
        fig.note = _same_rows(ctx, peer.target, f"{output}/{peer.target.key}")
        ours.peers[LABEL] = fig.stage


def _same_rows(ctx: Context, target: TableSpec, path: str) -> str:
    """Whether the peer's rows at ``path`` are the stage's in ``target`` (a hash of each side's
    rows), for the figure's note."""
    # One folder per aggregation for the metric windows, hence the recursive lookup.
    theirs = ctx.spark.read.option("recursiveFileLookup", "true").parquet(path)
    columns = sorted(c for c in target.schema.fieldNames() if c not in RUN_STAMPED and c in theirs.columns)
    peer, stage = rows_hash(theirs, columns), rows_hash(ctx.store.read(target), columns)
    n, m = peer[0], stage[0]
    if peer[:2] == stage[:2]:
        return f"{n:,} rows out, the stage's rows in {target.key} (the same hash of every row)"
    differ = [c for c, a, b in zip(columns, peer[2:], stage[2:], strict=True) if a != b]
    return f"{n:,} rows out, NOT the stage's {m:,} rows in {target.key} (their hashes differ in {', '.join(differ)})"


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
