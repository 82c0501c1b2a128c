"""The benchmark: every stage on seeded workloads, peers on the same data, reduction and scaling.

Each stage figure is the median of ``repeats`` runs after one warm-up run (min and max kept), each
run on a fresh lake. ClickHouse is one embedded chdb for the whole benchmark (chdb holds one data
path per process) with a database per run.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.dev.bench import plain
from pipelines.dev.bench.backfills import one_window_backfill
from pipelines.dev.bench.cold import cold_chain
from pipelines.dev.bench.freshness import run_freshness
from pipelines.dev.bench.ingest import ingest_stages
from pipelines.dev.bench.measure import Bench, Figure, as_dicts, timed, warm_up_first
from pipelines.dev.bench.passes import FIXED_COST_RUNS, fixed_costs
from pipelines.dev.bench.workloads import PODS, SCALED_SIZES, SIZES, Workload, generate
from pipelines.runtime import ingest, passes
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_SAMPLES,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
)

DEDUP_WINDOWS = [1.0, 3.0, 5.0, 10.0, 15.0]
GOLD_WINDOW_SECONDS = 30
END_TO_END = "end to end (events)"
#: The stages an event goes through, whose times add up to the end-to-end figure.
EVENT_PATH = ("files -> bronze (events)", "silver events", "gold (stage 1 + 2)", "export to ClickHouse")
#: A chain stage measured with the quality gates off is named with this prefix; it is each gated
#: stage's peer, so ``0.90x of gates off`` reads: the gates cost the stage 1/0.90 - 1 = 11%.
GATES_OFF = "gates off: "
#: The chain's stages, whose plain-Spark peers read the lake the chain leaves.
CHAIN_STAGES = (
    "files -> bronze (events)",
    "silver page changes",
    "silver events",
    "gold (stage 1 + 2)",
    "export to ClickHouse",
)


# -- the pipeline chain ---------------------------------------------------------------------------
def chain(
    b: Bench,
    w: Workload,
    record: bool,
    scale_into: dict[str, float] | None = None,
    gates: bool = True,
    rss_into: dict[str, dict[str, float]] | None = None,
) -> Context:
    """Files -> bronze -> silver -> gold -> ClickHouse once, timing each stage into ``b.figures``.

    ``gates=False`` runs the same chain with the quality gates off, recorded as each stage's
    ``gates off`` peer. ``scale_into`` and ``rss_into`` get each stage's seconds and peak memory.
    """
    ctx = b.context(f"chain-{w.size.name}", quality=gates)
    sink = b.figures if record else {}
    stages: dict[str, float] = {}

    def fig(stage: str, unit: str) -> Figure:
        if not record:
            return Figure(stage, unit)
        if gates:
            return sink.setdefault(stage, Figure(stage, unit))
        sink[stage].peers["gates off"] = GATES_OFF + stage
        return sink.setdefault(GATES_OFF + stage, Figure(GATES_OFF + stage, unit))

    def run(stage: str, unit: str, units: float | Callable[[], float], fn: Callable[[], Any]) -> None:
        f = fig(stage, unit)
        with timed(f, units):
            fn()
        stages[stage] = f.seconds[-1]
        b.say(f"  {w.size.name} {stage}{'' if gates else ', gates off'}: {f.seconds[-1]:.1f} s")
        if rss_into is not None:
            rss_into[stage] = dict(f.peak_rss_mb)

    n_events = w.n_events
    files = w.chain_files()  # written on first use: not part of the timing
    run("files -> bronze (events)", "events", n_events, lambda: ingest.ingest_files(ctx, "events", files))
    ingest.ingest_files(ctx, "page_changes", w.page_change_files)
    n_changes = ctx.store.read(BRONZE_PAGE_CHANGES).count()
    run("silver page changes", "events", n_changes, lambda: passes.silver_page_changes(ctx, drain=True))
    run("silver events", "events", n_events, lambda: passes.silver_events(ctx))
    run("gold (stage 1 + 2)", "events", n_events, lambda: passes.gold_property_values(ctx))
    exported: list[int] = []
    run(
        "export to ClickHouse",
        "rows",
        lambda: exported[0],
        lambda: exported.append(passes.export_property_values(ctx, drain=True).rows_out),
    )
    if record and gates:
        e2e = sink.setdefault(END_TO_END, Figure(END_TO_END, "events"))
        e2e.units.append(n_events)
        e2e.seconds.append(round(sum(stages[s] for s in EVENT_PATH), 3))
    if scale_into is not None:
        scale_into.update(stages)
    return ctx


# -- peers ----------------------------------------------------------------------------------------
CLICKHOUSE_FANOUT = """
INSERT INTO {db}.peer_property_values
SELECT team_id, property_type, kv.1 AS property_key, kv.2 AS property_value,
       toStartOfInterval(ts, INTERVAL {window} SECOND) AS window_start, count() AS c
FROM (
    SELECT team_id, timestamp AS ts, 'event' AS property_type,
           arrayFilter(x -> x.1 NOT IN ('$set', '$set_once'), JSONExtractKeysAndValuesRaw(properties)) AS kvs
    FROM {db}.bronze_events
    UNION ALL
    SELECT team_id, timestamp, 'person',
           arrayConcat(JSONExtractKeysAndValuesRaw(properties, '$set'),
                       JSONExtractKeysAndValuesRaw(properties, '$set_once'),
                       JSONExtractKeysAndValuesRaw(ifNull(person_properties, '{{}}')))
    FROM {db}.bronze_events
)
ARRAY JOIN kvs AS kv
GROUP BY team_id, property_type, property_key, property_value, window_start
"""


def clickhouse_peer(b: Bench, ctx: Context) -> None:
    """The same fan-out and GROUP BY done by ClickHouse (chdb) over the same bronze events."""
    from pipelines.sinks import clickhouse

    fig = b.figure("peer: ClickHouse fan-out + GROUP BY", "events")
    # ClickHouse parses the properties' JSON text itself, as bronze did: the text of each landed
    # message's fields, taken out of it before the timing.
    texts = [F.get_json_object("raw", f"$.{c}").alias(c) for c in ("properties", "person_properties")]
    landed = ctx.store.read(BRONZE_EVENTS).select("team_id", "timestamp", *texts)
    events = landed.withColumn("properties", F.coalesce("properties", F.lit("{}"))).toArrow()
    db = "bench_peer"
    with clickhouse.connect(ctx.settings) as client:
        client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
        client.command(f"DROP TABLE IF EXISTS {db}.bronze_events")
        client.command(
            f"CREATE TABLE {db}.bronze_events (team_id Int64, timestamp DateTime64(6, 'UTC'), properties String, "
            "person_properties Nullable(String)) ENGINE = MergeTree ORDER BY team_id"
        )
        client.insert_arrow(f"{db}.bronze_events", events)
        for attempt in b.attempts():
            client.command(f"DROP TABLE IF EXISTS {db}.peer_property_values")
            client.command(
                f"CREATE TABLE {db}.peer_property_values (team_id Int64, property_type String, property_key String, "
                "property_value String, window_start DateTime64(3, 'UTC'), c UInt64) ENGINE = MergeTree "
                "ORDER BY (team_id, property_type, property_key, property_value, window_start)"
            )
            target = warm_up_first(fig, attempt)
            with timed(target, events.num_rows):
                client.command(CLICKHOUSE_FANOUT.format(db=db, window=GOLD_WINDOW_SECONDS))
        rows, tuples = client.query(f"SELECT count(), sum(c) FROM {db}.peer_property_values").result_rows[0]
    fig.note = f"{rows:,} rows for {tuples:,} tuples (JSON values kept raw, so counts differ slightly from ours)"
    b.figures["gold (stage 1 + 2)"].peers["ClickHouse fan-out + GROUP BY"] = fig.stage


def spark_dedup_peer(b: Bench, ctx: Context) -> None:
    """Plain Structured Streaming dedup of the same bronze page changes: dropDuplicatesWithinWatermark."""
    fig = b.figure("peer: Spark dropDuplicatesWithinWatermark", "events")
    src = Path(ctx.settings.lake_root) / "_peer" / "page_changes"
    bronze = ctx.store.read(BRONZE_PAGE_CHANGES).select("wiki_id", "page_id", "rev_id", "event_time", "raw")
    n = bronze.count()
    bronze.write.mode("overwrite").parquet(str(src))
    kept = 0
    for attempt in b.attempts():
        name = f"peer_dedup_{uuid.uuid4().hex[:6]}"
        stream = (
            b.spark.readStream.schema(bronze.schema)
            .parquet(str(src))
            .withWatermark("event_time", "5 minutes")
            .dropDuplicatesWithinWatermark(["wiki_id", "page_id"])
        )
        target = warm_up_first(fig, attempt)
        with timed(target, n):
            query = (
                stream.writeStream.format("memory")
                .queryName(name)
                .option("checkpointLocation", str(src.parent / f"ckpt-{name}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        kept = b.spark.table(name).count()
    pruned = 100 - 100 * kept / max(n, 1)
    fig.note = f"keeps the first event per page within the watermark: {kept:,} of {n:,} kept ({pruned:.1f}% pruned)"
    b.figures["silver page changes"].peers["Spark dropDuplicatesWithinWatermark"] = fig.stage


# -- metric panes ---------------------------------------------------------------------------------
PANE_SHAPES = {
    "samples -> metric windows (tumbling 1m)": {"window": "1m"},
    "samples -> metric windows (sliding 1m, 6 panes)": {"window": "1m", "slide": "10s"},
}


def metric_panes_stage(b: Bench, w: Workload) -> None:
    """Samples/s through panes into closed windows, tumbling against sliding with 6 panes a window."""
    from pipelines.sources.remote_write import SNAPPY, decode
    from pipelines.sources.remote_write_rows import samples_table

    now = datetime.now(UTC)
    table = pa.concat_tables(
        samples_table(decode(body, SNAPPY, 1 << 30), "prometheus", "bench", now) for body in w.remote_write_bodies
    )
    for stage, shape in PANE_SHAPES.items():
        fig = b.figure(stage, "samples")
        aggregation = {
            "name": "bench",
            "selector": '{__name__=~"node_metric_.*"}',
            "accumulators": ["sum", "count", "min", "max", "increase", "quantiles"],
            "grouping_labels": ["mode"],
            **shape,
        }
        for attempt in b.attempts():
            ctx = b.context("metrics", metrics={"aggregations": [aggregation]})
            ctx.store.ensure(BRONZE_SAMPLES)
            ctx.store.append(BRONZE_SAMPLES, table)
            with timed(warm_up_first(fig, attempt), table.num_rows):
                passes.silver_metric_panes(ctx, drain=True)
                passes.gold_metric_windows(ctx)
        plain.measure(b, ctx, [stage])
        fig.note = "silver panes + gold windows, 4 keys (mode), 6 accumulators incl. increase and KLL"


# -- reduction, dedup, state ----------------------------------------------------------------------
def reduction(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """Records per event single-stage (partials) vs two-stage (gold = what ClickHouse gets), by pods."""
    out = []
    for pods in PODS:
        ctx = b.context(f"pods-{pods}", quality=False)
        ingest.ingest_files(ctx, "events", w.event_files(pods))
        passes.silver_events(ctx)
        passes.gold_partials(ctx)
        passes.gold_merge(ctx)
        partial_rows = ctx.store.read(GOLD_PARTIALS).count()
        gold_rows = ctx.store.read(GOLD_PROPERTY_VALUES).count()
        n = w.n_events
        out.append(
            {
                "pods": pods,
                "events": n,
                "single_stage_records": partial_rows,
                "two_stage_records": gold_rows,
                "single_stage_per_event": round(partial_rows / n, 3),
                "two_stage_per_event": round(gold_rows / n, 3),
            }
        )
    return out


def dedup_by_window(ctx: Context) -> list[dict[str, Any]]:
    from pipelines.dev.analyze import dedup_figures

    events = ctx.store.read(BRONZE_PAGE_CHANGES)
    return [
        {
            "window_minutes": f.window_minutes,
            "mode": f.mode,
            "input": f.input_events,
            "pruned_percent": round(f.pruned_percent, 2),
        }
        for f in dedup_figures(events, DEDUP_WINDOWS)
    ]


def buffer_growth(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """State of the page-change buffer after each arriving file (windows close as time passes)."""
    ctx = b.context("buffer", quality=False)
    rows, seen = [], 0
    for path in w.page_change_files:
        ingest.ingest_files(ctx, "page_changes", [path])
        record = passes.silver_page_changes(ctx)
        seen += int(record.metrics.get("input_events", 0))
        rows.append(
            {
                "input_events": seen,
                "buffered_events": int(record.metrics.get("buffered_events", 0)),
                "open_windows": int(record.metrics.get("open_windows", 0)),
                "state_rows": int(record.metrics.get("state_rows", 0)),
            }
        )
    return rows


# -- entry point ----------------------------------------------------------------------------------
#: Scaling figures leave these out: peers, and stages that do not run at every size.
NOT_SCALED = ("peer", plain.PREFIX, GATES_OFF, "remote", "Kafka", "end", "samples", "cold")


def event_path(b: Bench, w: Workload, gates_off: bool) -> Context:
    """The event path warm and cold, with the peers it is held to: a warm-up chain, then
    ``b.repeats`` runs with the gates on (each followed, with ``gates_off``, by one with them
    off), ClickHouse's fan-out and GROUP BY, the plain-Spark peers and their end to end, and the
    cold chain beside its one-process peer. The whole bench at S and M runs it, and so does
    ``--only chain``, alone. Returns the last gated run's context."""
    off = ", then off" if gates_off else ""
    b.say(f"pipeline chain: {b.warm_ups} warm-up + {b.repeats} runs, each with the quality gates on{off}")
    if b.warm_ups:
        chain(b, w, record=False)
    for i in range(b.repeats):
        ctx = chain(b, w, record=True)
        if gates_off:
            chain(b, w, record=True, gates=False)
        b.say(f"  run {i + 1}/{b.repeats} done")
    b.say("peers: ClickHouse fan-out, plain Spark")
    clickhouse_peer(b, ctx)
    plain.measure(b, ctx, CHAIN_STAGES, files={"files -> bronze (events)": w.chain_files()})
    plain.sum_of(b, END_TO_END, EVENT_PATH)
    b.say(f"cold chain: {b.repeats} run(s) of ingest file, then run all --once --drain, each a fresh process")
    cold_chain(b, w)
    return ctx


def run_bench(
    size_name: str, out: Path, spark: SparkSession, repeats: int = 3, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """The whole bench at S and M. L measures what it is for, scale: the chain (gates on, no
    warm-up at L: an S chain warms the JVM), its memory, the per-run fixed costs on its lake, and
    the S and M chains beside it; the peers, Kafka, remote write and the rest are M's business."""
    from pipelines.dev.bench import report, sparklog

    size = SIZES[size_name]
    full = size.name != "L"
    out = out.resolve()  # a relative folder would read as host/database in the chdb:// DSN
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "work", ignore_errors=True)
    b = Bench(size, out, spark, repeats, say)
    t0 = time.perf_counter()
    say(f"bench {size.name}: generating workloads")
    workloads = {
        s.name: generate(s, out / "work" / f"data-{s.name}", remote_write=full and s.name == size.name)
        for s in SIZES.values()
        if s is size or (s.name in SCALED_SIZES and s.events <= size.events)
    }
    w = workloads[size.name]

    if full:
        ctx = event_path(b, w, gates_off=True)
        say("peer: Spark dedup")
        spark_dedup_peer(b, ctx)
        ingest_stages(b, w)
    else:
        say(f"pipeline chain: an S chain to warm up, then {repeats} run(s) at {size.name} with the quality gates on")
        chain(b, workloads["S"], record=False)
        for i in range(repeats):
            ctx = chain(b, w, record=True)
            say(f"  run {i + 1}/{repeats} done")
    if full:
        say("metric panes: tumbling vs sliding")
        metric_panes_stage(b, w)
        if size.events > SIZES["S"].events:  # minutes per rate: not at S or below
            say("freshness under load: Kafka at fixed rates beside ingest kafka and run all")
            b.extra["freshness"] = run_freshness(out, say=say)
    say("per-run fixed costs: no-op and 1-event runs")
    # A few seconds a run: at least FIXED_COST_RUNS of them beside sizes whose chain runs once (L),
    # so a figure is a median, not one run on a shared machine; XS checks that they run, once.
    one_event_runs = b.repeats if size.name == "XS" else max(b.repeats, FIXED_COST_RUNS)
    b.extra["fixed_costs"] = fixed_costs(b, ctx, w, repeats=one_event_runs)
    say("a 1-window backfill")
    b.extra["backfill"] = one_window_backfill(b, ctx, one_event_runs)
    if full:
        say("reduction by pods, dedup by window, buffer growth")
        b.extra["reduction"] = reduction(b, w)
        b.extra["dedup"] = dedup_by_window(ctx)
        b.extra["buffer"] = buffer_growth(b, w)
    say("scaling")
    scaling: dict[str, dict[str, float]] = {}
    rss: dict[str, dict[str, dict[str, float]]] = {}
    for name, sw in workloads.items():
        if name == size.name:
            scaled = [f for s, f in b.figures.items() if not s.startswith(NOT_SCALED)]
            scaling[name] = {f.stage: f.as_dict()["median_seconds"] for f in scaled}
            rss[name] = {f.stage: dict(f.peak_rss_mb) for f in scaled}
        else:
            scaling[name], rss[name] = {}, {}
            small = chain(b, sw, record=False, scale_into=scaling[name], rss_into=rss[name])
            if not full and name == "S":
                say("per-run fixed costs on the S lake, beside L's")
                b.extra["fixed_costs_small"] = fixed_costs(b, small, sw, "pass_costs_small", one_event_runs)
                b.extra["backfill_small"] = one_window_backfill(b, small, one_event_runs)
    b.extra["scaling"] = {
        "sizes": {n: SIZES[n].events for n in scaling},
        "seconds": scaling,
        "peak_rss_mb": rss,
        "event_path": list(EVENT_PATH),
    }
    spark_jobs = sparklog.figures_of(spark, {f.stage: f.windows for f in b.figures.values() if f.windows})
    result = {
        "size": size.name,
        "workload": {
            "events": size.events,
            "page_changes_distinct": size.page_changes,
            "page_changes_landed": ctx.store.read(BRONZE_PAGE_CHANGES).count(),
            "remote_write_samples": w.samples,
            "remote_write_requests": len(w.remote_write_bodies),
            "kafka_messages": size.kafka_messages if full else 0,
        },
        "repeats": repeats,
        "machine": report.machine(spark),
        # Plain-Spark peers last, so the table reads as our stages, then what they are compared with.
        "stages": sorted(
            as_dicts(b.figures), key=lambda s: (s["stage"].startswith(GATES_OFF), s["stage"].startswith(plain.PREFIX))
        ),
        **b.extra,
        "spark_jobs": spark_jobs,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    report.write(result, out)
    shutil.rmtree(out / "work", ignore_errors=True)
    return result
