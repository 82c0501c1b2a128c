"""Plain-Spark peers: the plain question each stage answers, answered as a careful Spark engineer
writes it, from Parquet to Parquet (and a bulk insert into ClickHouse), and nothing else.

The event path's peers are the plain three-layer program a new user would write for the same rows
(JSON -> bronze Parquet -> silver deduplicated -> gold counted per window -> one bulk insert into
ClickHouse), never a copy of the stage's design: no VARIANT, no offsets or lineage, no gates, no
Delta, no exactly-once bookkeeping, no event log. The stage's rate over its peer's (``0.50x of plain
Spark``) is then what the pipeline's design costs beside the plain answer. Each peer is still held
to its stage by its rows: the same multiset (a hash of every row, order aside) over the columns both
have, less the columns each run stamps with its own time. The chain's events are small ones
(:func:`pipelines.demo.synthetic.generate_small_events`), which need no rule beyond the plain
question, so the plain gold's tuples are the pipeline's.

The page-change and metric peers are the stages' transforms without their bookkeeping.

The input is written to Parquet once per stage, outside the timed runs, from the tables the stage
read, out of a lake the stage has just run in (the files the stage landed, for the landing).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, MapType

from bronze.landing import LANDING_COLUMNS, RAW, VALUE
from bronze.primitives import window_start
from gold.export import EXPORT_COLUMNS
from gold.metric_windows import close_windows, finish, raw_rows
from gold.property_values import WINDOW_START
from pipelines.config import layers
from pipelines.dev.bench.measure import Figure, timed, warm_up_first
from pipelines.flows.page_changes import META_ID
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_QUARANTINE,
    BRONZE_SAMPLES,
    EXPORT_OUTBOX,
    GOLD_METRIC_WINDOWS,
    GOLD_PROPERTY_VALUES,
    SILVER_EVENTS,
    SILVER_METRIC_PANES,
    SILVER_PAGE_CHANGES,
)
from pipelines.sinks import clickhouse
from pipelines.storage import TableSpec
from pipelines.storage.conform import clustered, conform_df
from silver.buckets import assign_buckets
from silver.dedup import LANDING_ORDER, first_copies, mark_repeats
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


# -- the event path: the plain program --------------------------------------------------------
#: What the plain program reads of an event: its fields as JSON gives them ...
ENVELOPE = "uuid string, event string, team_id bigint, distinct_id string, timestamp string"
#: ... and, in silver, its properties and person properties as maps of their values' text.
PROPERTIES = "properties map<string,string>, person_properties map<string,string>"


def plain_bronze(lines: DataFrame) -> DataFrame:
    """JSON lines (``value``) -> each event's fields and its line (``raw``), for the lines that
    parse as an event."""
    parsed = lines.select(F.from_json("value", ENVELOPE).alias("e"), F.col("value").cast("string").alias("raw"))
    rows = parsed.select(
        "e.uuid", "e.event", "e.team_id", "e.distinct_id", F.to_timestamp("e.timestamp").alias("timestamp"), "raw"
    )
    return rows.where("uuid IS NOT NULL AND team_id IS NOT NULL AND timestamp IS NOT NULL")


def land_files(ctx: Context, files: DataFrame, write: Write) -> None:
    """The files the stage landed, read as text, then :func:`plain_bronze`. ``files`` is a row per
    file, found before the timing: which files to land is the stage's bookkeeping."""
    paths = [r["path"] for r in files.collect()]  # a row per file: the list of files, not their rows
    write(BRONZE_EVENTS, plain_bronze(ctx.spark.read.text(paths)))


def land_values(ctx: Context, rows: DataFrame, write: Write) -> None:
    """Messages as they came (``value``, bytes) -> :func:`plain_bronze`."""
    write(BRONZE_EVENTS, plain_bronze(rows.select(F.col(VALUE).cast("string").alias("value"))))


def silver_events(ctx: Context, bronze: DataFrame, write: Write) -> None:
    """Bronze -> each event once (by ``team_id, uuid``), its team's bucket and its properties as maps."""
    mapping = layers.bucket_mapping(ctx.settings)
    once = bronze.dropDuplicates(["team_id", "uuid"]).transform(assign_buckets(mapping))
    props = F.from_json("raw", PROPERTIES).alias("p")
    write(
        SILVER_EVENTS,
        once.select(
            "uuid", "event", "team_id", "distinct_id", F.col("timestamp").alias("event_time"), "bucket", "raw", props
        )
        .select("*", "p.*")
        .drop("p"),
    )


def gold(ctx: Context, events: DataFrame, write: Write) -> None:
    """Silver -> the events' properties and person properties, counted per value and window."""
    window = window_start(F.col("event_time"), ctx.settings.gold.window).alias(WINDOW_START)
    kinds = [("event", "properties"), ("person", "person_properties")]
    entries = functools.reduce(
        DataFrame.unionByName,
        [events.select("team_id", window, F.lit(t).alias("property_type"), F.explode(c)) for t, c in kinds],
    )
    key, value = F.col("key").alias("property_key"), F.col("value").alias("property_value")
    counted = entries.groupBy("team_id", "property_type", key, value, WINDOW_START).agg(
        F.count(F.lit(1)).alias("count")
    )
    write(GOLD_PROPERTY_VALUES, counted)


def export(ctx: Context, rows: DataFrame, write: Write) -> None:
    """Gold's rows -> ClickHouse (a database of the peer's own), one bulk insert that reads the
    Parquet files itself."""
    seconds = int(ctx.settings.gold.window.total_seconds())
    database = f"{ctx.settings.clickhouse.database}_plain"
    folder = Path(urlparse(rows.inputFiles()[0]).path).parent
    with clickhouse.connect(ctx.settings) as client:
        clickhouse.ensure_property_values(client, database)
        table = f"{database}.{clickhouse.PROPERTY_VALUES_TABLE}"
        client.command(f"TRUNCATE TABLE {table}")  # each run loads into an empty table, as the stage's does
        client.command(
            f"INSERT INTO {table} SELECT team_id, property_type, property_key, property_value, window_start, "
            f"count, window_start + toIntervalSecond({seconds}) FROM file('{folder}/*.parquet', Parquet)"
        )


def files_source(paths: Sequence[Path]) -> Source:
    """The files a stage lands, as a row per file; the peer reads their content itself."""

    def read(ctx: Context) -> DataFrame:
        return ctx.spark.createDataFrame([(str(p),) for p in paths], "path string")

    return read


def silver_with_maps(ctx: Context) -> DataFrame:
    """Silver as the plain program holds it: the stage's rows, with the properties as maps."""
    rows = ctx.store.read(SILVER_EVENTS)
    return rows.select("*", F.from_json("raw", PROPERTIES).alias("p")).select("*", "p.*").drop("p")


def gold_tuples(ctx: Context) -> DataFrame:
    """Gold as the plain program holds it: a row per tuple and window (the buckets' rows summed)."""
    return ctx.store.read(GOLD_PROPERTY_VALUES).groupBy(*EXPORT_COLUMNS[:-1]).agg(F.sum("count").alias("count"))


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
    #: Whether the rows held to the stage's are the peer's input (what a bulk insert sent), not its output.
    sends_input: bool = False
    #: Whether the peer writes its rows as the plain program does (no layout), or as the stage lays them out.
    plain: bool = True


LAND_VALUES = Peer(landing(BRONZE_EVENTS, "events"), land_values, BRONZE_EVENTS)
METRIC_WINDOWS = Peer(table(BRONZE_SAMPLES), metric_windows, GOLD_METRIC_WINDOWS, plain=False)

#: Stage -> its plain-Spark peer: where its input comes from, the transforms it runs, its output.
PEERS: dict[str, Peer] = {
    "silver page changes": Peer(table(BRONZE_PAGE_CHANGES), page_changes, SILVER_PAGE_CHANGES, plain=False),
    "silver events": Peer(table(BRONZE_EVENTS), silver_events, SILVER_EVENTS),
    "gold (stage 1 + 2)": Peer(silver_with_maps, gold, GOLD_PROPERTY_VALUES),
    "export to ClickHouse": Peer(gold_tuples, export, EXPORT_OUTBOX, sends_input=True),
    "Kafka -> bronze (Tansu), PostHog fixture events": LAND_VALUES,
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


def write_plain(spark: SparkSession, output: str, spec: TableSpec, df: DataFrame) -> DataFrame:
    """``df`` as Parquet under ``spec``'s key, as it is (the plain program's write), read back."""
    path = f"{output}/{spec.key}"
    df.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path)


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
    "files -> bronze (events)": lambda paths: Peer(files_source(paths), land_files, BRONZE_EVENTS)
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
        write = partial(write_plain if peer.plain else write_as, ctx.spark, output)

        fig = b.figure(PREFIX + stage, ours.unit)
        for attempt in b.attempts():
            # The stage's units (events in, rows out), so the two rates compare the same work.
            with timed(warm_up_first(fig, attempt), ours.units[-1]):
                peer.transform(ctx, ctx.spark.read.parquet(source), write)
        fig.note = _same_rows(ctx, peer.target, source if peer.sends_input else f"{output}/{peer.target.key}")
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
