"""The ``medallion`` command line."""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from pipelines.errors import MedallionError, SettingsError
from pipelines.settings import Settings, assign, load_settings

# Piped output (CI logs, files) gets wide tables instead of truncated cells.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
log = logging.getLogger("medallion")


class State:
    """What the top-level options give every command: settings overrides and verbosity."""

    def __init__(self, verbose: bool, overrides: dict[str, Any]):
        self.verbose = verbose
        self.overrides = overrides
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(**self.overrides)
        return self._settings

    def context(self, validates: bool = False) -> Any:
        """Spark, the store and settings; ``validates`` for commands whose jobs run quality gates."""
        from pipelines.runner import Context
        from pipelines.spark import build_spark
        from pipelines.storage import open_store

        settings = self.settings
        if validates and settings.quality.enabled:
            from pipelines.quality import preload

            preload()
        say_step("starting Spark")
        spark = build_spark(settings)
        if not self.verbose:
            quiet_query_context_logs()
        return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=say_step)


def quiet_query_context_logs() -> None:
    """PySpark logs every analysis error it raises as a JSON line with the JVM's stack trace
    (its query-context loggers) before the error reaches us; ours is the one line. ``--verbose``
    keeps them."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


_T0 = time.perf_counter()


def say_step(message: str) -> None:
    err_console.print(f"[dim]{time.perf_counter() - _T0:7.1f}s[/dim] {message}")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="medallion", prog_name="medallion", message="%(prog)s %(version)s")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks and the pipeline's debug log.")
@click.option("--lake-root", metavar="PATH", help="Override MEDALLION_LAKE_ROOT.")
@click.option("--engine", type=click.Choice(["delta-rs", "delta-spark"]), help="Override MEDALLION_DELTA_ENGINE.")
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any setting by its config key, e.g. --set kafka.group_id=pods (repeatable).",
)
@click.pass_context
def cli(
    ctx: click.Context, verbose: bool, lake_root: str | None, engine: str | None, assignments: tuple[str, ...]
) -> None:
    """A Delta Lake medallion pipeline on Apache Spark.

    Bronze lands Kafka events, page changes and remote-write samples exactly once; silver buckets
    teams and deduplicates page changes; gold aggregates property values in two stages and exports
    them exactly once to ClickHouse.

    Settings come from MEDALLION_* variables, a .env file or the file named by MEDALLION_CONFIG;
    `medallion settings` shows them.
    """
    apply_assignments(assignments)
    overrides: dict[str, Any] = {}
    if lake_root:
        overrides["lake_root"] = lake_root
    if engine:
        overrides["delta_engine"] = engine
    configure_logging(verbose)
    ctx.obj = State(verbose, overrides)


def configure_logging(verbose: bool) -> None:
    """Warnings only; with ``--verbose`` the pipeline's own loggers at debug level, with times.
    Libraries (py4j, kafka, urllib3, ...) stay at warnings either way, or their debug output
    would bury the pipeline's."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("medallion").setLevel(logging.DEBUG if verbose else logging.WARNING)
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def apply_assignments(assignments: Sequence[str]) -> None:
    """Each ``--set KEY=VALUE``, checked and put where settings read it (see :func:`assign`)."""
    for item in assignments:
        assign(item)


# -- demo ---------------------------------------------------------------------------------------
@cli.command()
@click.option("--events", default=200_000, show_default=True, help="Synthetic product events to generate.")
@click.option("--page-changes", default=60_000, show_default=True, help="Synthetic page changes (before duplicates).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def demo(state: State, events: int, page_changes: int, as_json: bool) -> None:
    """Run bronze -> silver -> gold -> ClickHouse on the shipped fixtures plus a synthetic stream.

    Needs no services: Delta tables go under the lake root, ClickHouse is the embedded chdb.
    Running it again changes no table.
    """
    from pipelines.demo import DemoSize, run_demo

    if events < 0 or page_changes < 0:
        raise click.BadParameter("sizes must not be negative")
    ctx = state.context(validates=True)
    result = run_demo(ctx, DemoSize(events=events, page_changes=page_changes))
    if as_json:
        console.print_json(json.dumps(result))
        return
    print_summary(result)


def print_counters(c: dict[str, Any] | None) -> None:
    if not c:
        return
    console.print(
        f"Counters: {c['increments']:,} increments -> {c['counter_writes']:,} counter writes "
        f"({c['increments_per_write']} per write), {c['milestones']:,} milestones, "
        f"{c['clickhouse_rows']:,} rows to ClickHouse"
    )
    for name, shown in c["counters"].items():
        console.print(f"{name}: top of {shown['entities']:,} entities")
        t = Table()
        for col in ("entity", "total", "milestones"):
            t.add_column(col, justify="right" if col == "total" else "left")
        for r in shown["top"]:
            t.add_row(r["entity"], f"{r['total']:,}", ", ".join(f"{m:,}" for m in r["milestones"]))
        console.print(t)
    if c.get("written_registry"):
        console.print(
            f"See more with: MEDALLION_COUNTERS__REGISTRY={c['registry']} medallion counters show pageviews_by_path"
        )


def print_metrics(m: dict[str, Any] | None) -> None:
    if not m:
        return
    console.print(
        f"Metrics: {m['samples']:,} remote-write samples -> {m['panes']:,} pane rows -> {m['windows']:,} window rows "
        f"({', '.join(m['aggregations'])})"
    )
    if m.get("cpu_rate_by_mode"):
        console.print(f"cpu_by_mode: CPU seconds per second over all hosts, 5-minute window ending {m['cpu_window']}")
        t = Table()
        t.add_column("mode")
        t.add_column("rate", justify="right")
        for mode, rate in sorted(m["cpu_rate_by_mode"].items()):
            t.add_row(mode, f"{rate:,.3f}")
        console.print(t)
    if m.get("http_latency"):
        t = Table(title="http_latency: 10-minute windows (quantiles from merged KLL sketches)")
        for c in ("window start", "requests", "p50 ms", "p99 ms", "distinct paths", "top paths"):
            t.add_column(c, justify="left" if c in ("window start", "top paths") else "right")
        for r in m["http_latency"]:
            t.add_row(
                r["window_start"][:16],
                f"{r['requests']:,}",
                f"{r['p50_ms']}",
                f"{r['p99_ms']}",
                f"{r['distinct_paths']}",
                ", ".join(r["top_paths"]),
            )
        console.print(t)
    prefix = f"MEDALLION_CONFIG={m['config']} " if m.get("config") else ""
    console.print(f"Ask more with: {prefix}medallion query --aggregation cpu_by_mode --group-by mode")


def print_summary(result: dict[str, Any]) -> None:
    t = Table(title="Tables", title_justify="left")
    t.add_column("table")
    t.add_column("rows", justify="right")
    for key, rows in result["tables"].items():
        t.add_row(key, f"{rows:,}")
    t.add_row("clickhouse: property_values", f"{result['clickhouse_rows']:,}")
    console.print(t)
    f = Table(title="Figures", title_justify="left")
    f.add_column("figure")
    f.add_column("value", justify="right")
    f.add_row("page changes in", f"{result['page_changes_in']:,}")
    f.add_row("page changes out (silver)", f"{result['page_changes_out']:,}")
    f.add_row("page changes deduplicated", f"{result['page_changes_deduplicated']:,} ({result['dedup_percent']}%)")
    f.add_row("tuples fanned out", f"{result['tuples_fanned_out']:,}")
    f.add_row("records per input event, single-stage (partials)", f"{result['records_per_event_single_stage']}")
    f.add_row("records per input event, two-stage (ClickHouse)", f"{result['records_per_event_two_stage']}")
    f.add_row("late corrections / gated", f"{result['late_corrections']:,} / {result['gated']:,}")
    f.add_row("sum(count): gold / ClickHouse", f"{result['gold_count_sum']:,} / {result['clickhouse_count_sum']:,}")
    console.print(f)
    print_metrics(result.get("metrics"))
    print_counters(result.get("counters"))
    console.print(f"Delta tables under [bold]{result['lake_root']}[/bold]; ClickHouse at {result['clickhouse']}")
    console.print('Query them with: medallion sql "SELECT * FROM gold_property_values LIMIT 10"')


# -- metrics ------------------------------------------------------------------------------------
METRICS_PORT = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on http://HOST:PORT/metrics (runs, rows, durations, lag, last success).",
)
METRICS_HOST = click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
)


def serve_metrics(port: int | None, host: str) -> None:
    if port is None:
        return
    from pipelines import observability

    try:
        bound = observability.serve(port, host)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot listen on {host}:{port}: {exc.strerror}", param_hint="--metrics-port"
        ) from None
    say_step(f"metrics on http://{host}:{bound}/metrics")


# -- run ----------------------------------------------------------------------------------------
def _parse_buckets(values: Sequence[str]) -> list[int] | None:
    out: list[int] = []
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                raise click.BadParameter(f"{part!r} is not a bucket number", param_hint="--bucket")
            out.append(int(part))
    return sorted(set(out)) or None


class FlowName(click.ParamType):
    """A stage, a flow or ``all`` (:mod:`pipelines.flows`); earlier spellings with a warning."""

    name = "flow"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        from pipelines import flows

        return "[" + "|".join(flows.names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipelines import flows

        if value in flows.names() or value in flows.RENAMED:
            return value
        self.fail(f"{value!r} is not a flow or stage; one of: {', '.join(flows.names())}", param, ctx)


@cli.command()
@click.argument("job", type=FlowName())
@click.option("--once", is_flag=True, help="Process what is there and stop (else repeat until stopped).")
@click.option("--interval", default=30.0, show_default=True, help="Seconds between runs without --once.")
@click.option("--bucket", "buckets", multiple=True, metavar="K[,K...]", help="Only these buckets (repeatable).")
@click.option("--drain", is_flag=True, help="Treat every window as closed (end of a backfill).")
@METRICS_PORT
@METRICS_HOST
@click.pass_obj
def run(
    state: State,
    job: str,
    once: bool,
    interval: float,
    buckets: tuple[str, ...],
    drain: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run a flow or a stage of flows incrementally: each reads only source commits it has not
    processed yet.

    JOB is a stage (silver, gold, export, metrics, counters), one flow of one (silver.events,
    gold.merge, ...; `medallion flows` lists them) or all.
    Without --once it repeats every --interval seconds until SIGTERM or Ctrl-C,
    finishing the step under way.
    """
    chosen = _parse_buckets(buckets)
    if chosen is not None:  # checked before Spark starts
        count = state.settings.buckets.count
        bad = [b for b in chosen if b >= count]
        if bad:
            raise click.BadParameter(f"bucket(s) {bad} outside 0..{count - 1}", param_hint="--bucket")
    serve_metrics(metrics_port, metrics_host)
    from pipelines import flows

    chosen_flows = flows.resolve(job)
    ctx = state.context(validates=True)
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while True:
        for record in flows.run_pass(ctx, chosen_flows, chosen, drain):
            console.print(f"{record.job}: {record.status}, {record.rows_in:,} in, {record.rows_out:,} out")
            if stop.is_set():
                break
        if once or stop.wait(interval):
            break


# -- ingest -------------------------------------------------------------------------------------
@cli.group()
def ingest() -> None:
    """Land input into bronze."""


@ingest.command("file")
@click.option("--kind", type=click.Choice(["events", "page_changes"]), required=True)
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_obj
def ingest_file(state: State, kind: str, paths: tuple[Path, ...]) -> None:
    """Land JSON-lines or JSON-array files; a file already landed (same content) is skipped."""
    from pipelines import jobs

    ctx = state.context(validates=True)
    record = jobs.ingest_files(ctx, kind, list(paths))
    console.print(
        f"{record.job}: {record.status}, {record.rows_in:,} records, {record.rows_out:,} landed, "
        f"{int(record.metrics.get('quarantined', 0)):,} quarantined"
    )


@ingest.command("kafka")
@click.option("--once", is_flag=True, help="Consume what is there now and stop (like availableNow).")
@click.option("--topics", metavar="T[,T...]", help="Topics to consume (default: both configured topics).")
@click.option("--max-batch", default=10_000, show_default=True, help="Messages per flush at most.")
@click.option("--max-wait", default=5.0, show_default=True, help="Seconds before a partial batch is flushed.")
@METRICS_PORT
@METRICS_HOST
@click.pass_obj
def ingest_kafka(
    state: State,
    once: bool,
    topics: str | None,
    max_batch: int,
    max_wait: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Consume Kafka as one member of the consumer group and land each batch exactly once.

    The offsets of each partition are recorded in the same Delta commit as its rows; on start
    the consumer seeks to them. Without --once it runs until SIGTERM or Ctrl-C, then finishes
    its batch. Several processes with the same group id share the partitions.
    """
    from pipelines import jobs
    from pipelines.quality import wait_preloaded
    from pipelines.runner import startup_heap_frozen

    if max_batch < 1 or max_wait <= 0:
        raise click.BadParameter("--max-batch must be >= 1 and --max-wait > 0")
    chosen = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    serve_metrics(metrics_port, metrics_host)
    ctx = state.context(validates=True)
    # Start-up is over (Spark, and the gates' Great Expectations loading meanwhile): what is alive
    # now lives as long as the process, so the collections after each flush need not walk it.
    wait_preloaded()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with startup_heap_frozen():
        stats = jobs.ingest_kafka(ctx, chosen, max_batch=max_batch, max_wait=max_wait, once=once, stop=stop)
    console.print(
        f"ingest.kafka: {stats.messages:,} messages in {stats.flushes} flush(es), {stats.landed:,} landed, "
        f"{stats.quarantined:,} quarantined, {stats.seconds:.1f}s"
    )


# -- buckets ------------------------------------------------------------------------------------
@cli.group()
def buckets() -> None:
    """Team buckets: the stable team -> bucket mapping."""


@buckets.command("plan")
@click.option("--buckets", "count", type=click.IntRange(1, 4096), help="Bucket count of the new mapping.")
@click.option("--max-moves", default=10, show_default=True, type=click.IntRange(0), help="Teams moved to balance.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Where to write the new mapping.")
@click.pass_obj
def buckets_plan(state: State, count: int | None, max_moves: int, out: Path | None) -> None:
    """Balance per-team event volume across buckets, keeping existing assignments.

    Reads volume per team from silver/events (or bronze/events), moves at most --max-moves teams
    (largest imbalance first; tier and range fixes always happen), prints the moves and the load
    per bucket before and after, and writes the new mapping (default: MEDALLION_BUCKETS__MAPPING_FILE,
    else ./buckets.yaml). Point MEDALLION_BUCKETS__MAPPING_FILE at it to apply it.
    """
    import yaml
    from pyspark.sql import functions as F

    from pipelines import jobs
    from pipelines.tables import BRONZE_EVENTS, SILVER_EVENTS
    from silver.buckets import bucket_of, plan_buckets

    ctx = state.context()
    mapping = jobs.bucket_mapping(ctx)
    source = SILVER_EVENTS if ctx.store.version(SILVER_EVENTS) is not None else BRONZE_EVENTS
    if ctx.store.version(source) is None:
        raise click.UsageError("no events yet: land some before planning buckets")
    rows = (
        ctx.store.read(source)
        .groupBy("team_id")
        .agg(F.count(F.lit(1)).alias("n"))
        .withColumn("bucket", bucket_of(F.col("team_id"), mapping))
        .collect()
    )
    volumes = {int(r["team_id"]): int(r["n"]) for r in rows}
    current = {int(r["team_id"]): int(r["bucket"]) for r in rows}
    plan = plan_buckets(mapping, current, volumes, buckets=count, max_moves=max_moves)
    m = Table(title=f"Moves ({len(plan.moves)})", title_justify="left")
    for col in ("team", "from", "to", "events", "why"):
        m.add_column(col, justify="right" if col != "why" else "left")
    for mv in plan.moves:
        m.add_row(str(mv.team), str(mv.from_bucket), str(mv.to_bucket), f"{mv.volume:,}", mv.reason)
    console.print(m)
    b = Table(title=f"Events per bucket from {source.key}", title_justify="left")
    for col in ("bucket", "before", "after", "tier"):
        b.add_column(col, justify="right" if col != "tier" else "left")
    tiers = {bk: name for name, bks in plan.mapping.tiers.items() for bk in bks}
    for bucket in sorted(set(plan.before) | set(plan.after)):
        b.add_row(
            str(bucket),
            f"{plan.before.get(bucket, 0):,}",
            f"{plan.after.get(bucket, 0):,}" if bucket in plan.after else "-",
            tiers.get(bucket, ""),
        )
    console.print(b)
    target = out or ctx.settings.buckets.mapping_file or Path("buckets.yaml")
    Path(target).write_text(yaml.safe_dump(plan.mapping.to_dict(), sort_keys=False), encoding="utf-8")
    console.print(f"wrote {target}")


# -- analyze ------------------------------------------------------------------------------------
@cli.group()
def analyze() -> None:
    """Analyses over the lake's data."""


def _parse_minutes(text: str) -> list[float]:
    try:
        values = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of minutes", param_hint="--windows") from None
    if not values or any(v <= 0 for v in values):
        raise click.BadParameter("window lengths must be positive minutes", param_hint="--windows")
    return values


@analyze.command("dedup")
@click.option("--windows", default="1,3,5,10,15", show_default=True, help="Window lengths in minutes.")
@click.option("--from-table", "table_key", default="bronze/page_changes", show_default=True, help="Table to read.")
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read page changes from JSON-lines / JSON-array files instead (repeatable).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for CSV and PNG.")
@click.pass_obj
def analyze_dedup(state: State, windows: str, table_key: str, files: tuple[Path, ...], out_dir: Path | None) -> None:
    """How much page-change dedup prunes per window length, tumbling vs staggered.

    Runs the production dedup over the same events for every window length and both modes, and
    prints input events, events pruned and % pruned side by side; writes dedup.csv and dedup.png.
    """
    from pipelines import analyze as an
    from pipelines.tables import table as table_spec

    minutes = _parse_minutes(windows)
    ctx = state.context()
    if files:
        events, rejected = an.page_changes_from_files(ctx.spark, list(files), ctx.settings.kafka.max_message_bytes)
        source = f"{len(files)} file(s)" + (f", {rejected} invalid record(s) left out" if rejected else "")
    else:
        spec = table_spec(table_key)
        if ctx.store.version(spec) is None:
            raise click.UsageError(f"table {table_key} does not exist yet under {ctx.settings.lake_root}")
        events, source = ctx.store.read(spec), table_key
    say_step(f"analysing dedup over {source} for windows {', '.join(f'{m:g}' for m in minutes)} min")
    figures = an.dedup_figures(events, minutes)
    t = Table(title=f"Page-change dedup by window length ({source})", title_justify="left")
    for col in ("window (min)", "input events", "tumbling pruned", "tumbling %", "staggered pruned", "staggered %"):
        t.add_column(col, justify="right")
    for m in minutes:
        tum = next(f for f in figures if f.window_minutes == m and f.mode == "tumbling")
        stg = next(f for f in figures if f.window_minutes == m and f.mode == "staggered")
        t.add_row(
            f"{m:g}",
            f"{tum.input_events:,}",
            f"{tum.pruned:,}",
            f"{tum.pruned_percent:.2f}",
            f"{stg.pruned:,}",
            f"{stg.pruned_percent:.2f}",
        )
    console.print(t)
    out = out_dir or Path(ctx.settings.lake_root) / "_reports" / "dedup"
    csv_path = an.write_csv(figures, out / "dedup.csv")
    png_path = an.write_chart(figures, out / "dedup.png", f"Page-change dedup: % pruned ({source})")
    console.print(f"wrote {csv_path} and {png_path}")


# -- serve --------------------------------------------------------------------------------------
@cli.group()
def serve() -> None:
    """Long-running receivers."""


@serve.command("remote-write")
@click.option("--host", default=None, help="Address to bind (default from settings: 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default from settings: 9201; 0 picks a free one).")
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=None,
    help="Receiver processes sharing the port, each with its own log (default from settings: 1).",
)
@click.pass_obj
def serve_remote_write(state: State, host: str | None, port: int | None, processes: int | None) -> None:
    """Receive Prometheus / VictoriaMetrics remote write into bronze/samples until SIGTERM.

    POST /api/v1/write (snappy, or zstd after VictoriaMetrics' probe), GET /metrics, GET /healthz.
    A 204 means the samples are durable; they reach Delta within about a flush interval. One
    process uses about one core; --processes N spreads connections over N of them.
    """
    from pipelines.sources.remote_write_processes import serve_processes

    settings = state.settings
    rw = settings.remote_write
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    bind = host or rw.host
    count = processes or rw.processes

    def ready(bound: int) -> None:
        err_console.print(
            f"remote-write receiver listening on http://{f'[{bind}]' if ':' in bind else bind}:{bound}/api/v1/write"
            + (f" ({count} processes)" if count > 1 else ""),
            soft_wrap=True,
        )

    serve_processes(settings, bind, rw.port if port is None else port, count, stop, ready)
    err_console.print("remote-write receiver stopped; every acknowledged sample is in bronze/samples")


# -- status -------------------------------------------------------------------------------------
@cli.command()
@click.option("--runs", default=15, show_default=True, help="How many recent runs to list.")
@click.pass_obj
def status(state: State, runs: int) -> None:
    """Show every table (version, rows, last write) and the latest job runs."""
    from pipelines.eventlog import PIPELINE_EVENTS
    from pipelines.tables import ALL_TABLES

    ctx = state.context()
    t = Table(title=f"Tables under {ctx.settings.lake_root} ({ctx.store.engine})", title_justify="left")
    for col in ("table", "version", "rows", "files", "last write", "operation"):
        t.add_column(col, justify="right" if col in ("version", "rows", "files") else "left")
    for spec in ALL_TABLES:
        s = ctx.store.stats(spec)
        t.add_row(
            spec.key,
            "-" if s.version is None else str(s.version),
            f"{s.rows:,}",
            str(s.files),
            s.last_write.strftime("%Y-%m-%d %H:%M:%S") if s.last_write else "-",
            s.last_operation or "-",
        )
    console.print(t)
    print_buckets(ctx)
    if ctx.store.version(PIPELINE_EVENTS) is None:
        print_flows(None)
        console.print("No runs yet.")
        return
    print_flows(ctx)
    recent = ctx.store.read(PIPELINE_EVENTS).orderBy("ended_at", ascending=False).limit(runs).collect()
    r = Table(title="Latest runs", title_justify="left")
    for col in ("ended", "job", "status", "in", "out", "seconds", "metrics"):
        r.add_column(col, justify="right" if col in ("in", "out", "seconds") else "left")
    for row in recent:
        metrics = dict(row["metrics"] or {})
        secs = metrics.pop("seconds", 0.0)
        shown = ", ".join(f"{k}={_num(v)}" for k, v in sorted(metrics.items())[:8])
        r.add_row(
            row["ended_at"].strftime("%Y-%m-%d %H:%M:%S"),
            row["job"],
            row["status"] + (f": {row['error']}" if row["error"] else ""),
            f"{row['rows_in']:,}",
            f"{row['rows_out']:,}",
            f"{secs:.1f}",
            shown,
        )
    console.print(r)
    print_quality(ctx)


@cli.command("flows")
def list_flows() -> None:
    """List every flow: its stage, what it reads and writes, and how."""
    print_flows(None)


def print_flows(ctx: Any | None) -> None:
    """The flow registry as a table; with ``ctx``, each flow's last run from the event log."""
    from pipelines import flows

    last: dict[str, Any] = {}
    if ctx is not None:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        from pipelines.eventlog import PIPELINE_EVENTS

        newest = Window.partitionBy("base").orderBy(F.col("ended_at").desc())
        # One row per flow (a few dozen at most): small enough to collect.
        rows = (
            ctx.store.read(PIPELINE_EVENTS)
            .withColumn("base", F.split("job", "#").getItem(0))
            .withColumn("_n", F.row_number().over(newest))
            .where("_n = 1")
            .collect()
        )
        last = {r["base"]: r for r in rows}
    t = Table(title="Flows", title_justify="left")
    for col in ("flow", "stage", "reads", "writes", "mode", *(("last run", "status", "in", "out") if ctx else ())):
        t.add_column(col, justify="right" if col in ("in", "out") else "left")
    for f in flows.FLOWS:
        reads = ", ".join([s.key for s in f.sources] + ([f.external_source] if f.external_source else []))
        writes = ", ".join([s.key for s in f.targets] + ([f.external_target] if f.external_target else []))
        mode = f.mode + (", by bucket" if f.by_bucket else "")
        cells = [f.name, f.stage, reads, writes, mode]
        if ctx is not None:
            r = last.get(f.name)
            cells += (
                [r["ended_at"].strftime("%Y-%m-%d %H:%M:%S"), r["status"], f"{r['rows_in']:,}", f"{r['rows_out']:,}"]
                if r
                else ["-", "never", "", ""]
            )
        t.add_row(*cells)
    console.print(t)


def print_quality(ctx: Any) -> None:
    """The latest result of every expectation, per table: the quality at a glance."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pipelines.eventlog import EXPECTATION_RESULTS

    if ctx.store.version(EXPECTATION_RESULTS) is None:
        return
    latest = Window.partitionBy("dataset", "expectation").orderBy(F.col("validated_at").desc())
    rows = (
        ctx.store.read(EXPECTATION_RESULTS)
        .withColumn("_n", F.row_number().over(latest))
        .where("_n = 1")
        .orderBy("dataset", "expectation")
        .collect()
    )
    print_results(rows, title="Latest data quality (per expectation, newest result)")


OUTCOME_STYLE = {"passed": "green", "warned": "yellow", "dropped": "yellow", "failed": "bold red"}


def print_results(rows: Sequence[Any], title: str) -> None:
    t = Table(title=title, title_justify="left")
    for col in ("table", "expectation", "policy", "checked", "failed", "outcome", "when", "observed"):
        t.add_column(col, justify="right" if col in ("checked", "failed") else "left")
    for row in rows:
        r = row if isinstance(row, dict) else row.asDict()
        when = r.get("validated_at")
        t.add_row(
            r["dataset"],
            r["expectation"],
            r["policy"],
            "-" if r["rows_checked"] is None else f"{r['rows_checked']:,}",
            "-" if r["rows_failed"] is None else f"{r['rows_failed']:,}",
            f"[{OUTCOME_STYLE.get(r['outcome'], '')}]{r['outcome']}[/]",
            when.strftime("%Y-%m-%d %H:%M:%S") if when else "now",
            r.get("observed") or "",
        )
    console.print(t)


@cli.command()
@click.argument("tables", nargs=-1, metavar="[TABLE]...")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_obj
def validate(state: State, tables: tuple[str, ...], as_json: bool) -> None:
    """Validate whole tables with their expectation suites (all of them when none is named).

    Cross-table figures are checked too (gold against partials and the silver fan-out,
    ClickHouse against what was exported). Exits 1 when a `fail` expectation does not hold.
    """
    from expectations.suites import SUITES

    unknown = [t for t in tables if t not in SUITES]
    if unknown:  # before Spark starts
        raise click.BadParameter(
            f"no suite for {', '.join(unknown)}; tables with suites: {', '.join(SUITES)}", param_hint="TABLE"
        )
    from pipelines import quality
    from pipelines.eventlog import recorded

    ctx = state.context(validates=True)
    quality.check_policies(ctx)
    with recorded(ctx.store, "validate", ctx.run_id) as record:
        checked = quality.validate_tables(ctx, record, list(tables))
        failed = [r for c in checked if c.validation for r in c.validation.failed]
        record.rows_in = len(checked)
        record.add(failed_expectations=len(failed))
        if failed:
            record.status = "failed"
            record.details = "; ".join(f"{r.dataset}:{r.expectation}" for r in failed)
    results = [r.as_row() for c in checked if c.validation for r in c.validation.results]
    if as_json:
        click.echo(json.dumps({"results": results, "notes": {c.table: c.note for c in checked if c.note}}, indent=2))
    else:
        print_results(results, title=f"Validation of {len(checked)} table(s)")
        for c in checked:
            if c.note:
                console.print(f"[dim]{c.table}: {c.note}[/]")
    if failed:
        raise click.exceptions.Exit(1)


@cli.command()
@click.option(
    "--table", "tables", multiple=True, metavar="LAYER/NAME", help="Only this table (repeatable; default: all)."
)
@click.option(
    "--vacuum-hours", default=168, show_default=True, help="VACUUM deletes unreferenced files older than this."
)
@click.option("--force-short-retention", is_flag=True, help="Allow --vacuum-hours under 168 (7 days).")
@click.pass_obj
def maintain(state: State, tables: tuple[str, ...], vacuum_hours: int, force_short_retention: bool) -> None:
    """OPTIMIZE every table (compact small files, state tables included), then VACUUM it.

    Tables not created yet are skipped. A table that fails (say a conflict with a pipeline write)
    is reported and the others go on; the command then exits 1.
    """
    from rich.markup import escape

    from pipelines.maintenance import check_retention, maintain_tables, select_tables

    check_retention(vacuum_hours, force_short_retention)  # before Spark starts
    specs = select_tables(tables)
    ctx = state.context()
    done = maintain_tables(ctx.store, specs, vacuum_hours, force_short_retention, say=ctx.say)
    t = Table(title=f"Maintenance under {ctx.settings.lake_root} (VACUUM {vacuum_hours} h)", title_justify="left")
    for col in ("table", "status", "files before", "files after", "vacuumed", "seconds"):
        t.add_column(col, justify="left" if col in ("table", "status") else "right")
    for m in done:
        ran = m.status != "missing"
        t.add_row(
            m.table,
            {"done": "done", "missing": "[dim]not created yet[/]"}.get(m.status, f"[bold red]{escape(m.status)}[/]"),
            str(m.files_before) if ran else "-",
            str(m.files_after) if ran else "-",
            "-" if m.vacuumed is None else str(m.vacuumed),
            f"{m.seconds:.1f}" if ran else "-",
        )
    console.print(t)
    if any(m.status.startswith("failed") for m in done):
        raise click.exceptions.Exit(1)


@cli.group()
def counters() -> None:
    """Counters from the registry named by counters.registry."""


@counters.command("show")
@click.argument("name")
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, 100_000), help="Entities to show.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def counters_show(state: State, name: str, top: int, as_json: bool) -> None:
    """The top entities of counter NAME by total, with their milestones and tier."""
    from pipelines.counters import show

    ctx = state.context()
    result = show(ctx, name, top)
    if as_json:
        click.echo(json.dumps(result, default=str))
        return
    t = Table(title=f"{name}: {result['entities']:,} entities, {result['total']:,} in all", title_justify="left")
    for c in ("entity", "total", "pending", "flushes", "flushed at", "milestones"):
        t.add_column(c, justify="left" if c in ("entity", "milestones") else "right")
    for r in result["top"]:
        t.add_row(
            r["entity"],
            f"{r['total']:,}",
            f"{r['pending']:,}",
            f"{r['flushes']:,}",
            str(r["flushed_at"])[:19],
            ", ".join(f"{m:,}" for m in r["milestones"]),
        )
    console.print(t)
    console.print(f"[dim]pending: increments waiting for the entity's tier interval ({result['tiers']})[/]")


def _when(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        if value.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(value), UTC)
        raise click.BadParameter(
            f"{value!r}: use ISO-8601 (2026-01-01T00:05:00Z) or epoch seconds", param_hint=name
        ) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@cli.command()
@click.option("--aggregation", "-a", required=True, help="Name of an aggregation in metrics.aggregations.")
@click.option("--group-by", "group_by", help="Comma-separated key labels to group by; '' merges every key.")
@click.option("--from", "start", help="Windows starting at or after (ISO-8601 or epoch seconds).")
@click.option("--to", "end", help="Windows ending at or before.")
@click.option("--quantile", "quantiles", multiple=True, type=float, help="Quantile(s) to read [0.5 0.9 0.99].")
@click.option("--top", default=5, show_default=True, type=click.IntRange(1, 1000), help="Top values to show.")
@click.option("--closed-only", is_flag=True, help="Leave out windows the watermark has not closed yet.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_obj
def query(
    state: State,
    aggregation: str,
    group_by: str | None,
    start: str | None,
    end: str | None,
    quantiles: tuple[float, ...],
    top: int,
    closed_only: bool,
    as_json: bool,
) -> None:
    """Answer from precomputed metric windows: merged panes, partials and late rows, never raw samples."""
    from pipelines.metrics import dropped_late
    from pipelines.metrics import query as run_query

    agg = state.settings.metrics.get(aggregation)
    by = None if group_by is None else [g.strip() for g in group_by.split(",") if g.strip()]
    ctx = state.context()
    rows = run_query(
        ctx,
        aggregation,
        by,
        _when(start, "--from"),
        _when(end, "--to"),
        quantiles or (0.5, 0.9, 0.99),
        top,
        include_open=not closed_only,
    )
    dropped = dropped_late(ctx, aggregation)
    if as_json:
        click.echo(json.dumps({"aggregation": aggregation, "rows": rows, "late_dropped": dropped}, default=str))
        return
    table = Table(title=f"{aggregation}: {agg.selector}, window {agg.window}, slide {agg.slide}")
    columns = list(rows[0]) if rows else ["window_start", "window_end"]
    for c in columns:
        table.add_column(c, justify="right" if c not in ("key", "kinds", "top") else "left")
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    console.print(table)
    if dropped:
        console.print(f"[dim]{dropped:,} late sample(s) dropped by this aggregation so far (late: drop)[/]")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, float):
        return f"{v:,.6g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list) and v and isinstance(v[0], tuple):
        return ", ".join(f"{item}: {n:,}" for item, n in v)  # top values
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


@cli.command()
@click.option("--size", type=click.Choice(["S", "M", "L"]), default="S", show_default=True, help="Workload size.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for the results.")
@click.option("--repeats", type=click.IntRange(1, 20), help="Timed runs per stage after a warm-up [S: 2, M: 3, L: 1].")
@click.option(
    "--soak",
    "soak_minutes",
    type=click.FloatRange(1, 24 * 60),
    metavar="MINUTES",
    help="Instead: one Kafka ingest process at full speed for MINUTES, its memory sampled (soak.md, soak.png).",
)
@click.option(
    "--freshness",
    "freshness_rates",
    metavar="RATE[,RATE...]",
    help="Instead: events/s to Kafka beside ingest kafka and run all, each for --minutes; "
    "lag to ClickHouse (freshness.md, freshness.png).",
)
@click.option(
    "--minutes", type=click.FloatRange(1, 60), default=5.0, show_default=True, help="Minutes per --freshness rate."
)
@click.option(
    "--only",
    type=click.Choice(["ingest"]),
    help="Only these stages: ingest = Kafka and remote write -> bronze with their peers "
    "(VictoriaMetrics and Prometheus among them).",
)
@click.pass_obj
def bench(
    state: State,
    size: str,
    out_dir: Path | None,
    repeats: int | None,
    soak_minutes: float | None,
    freshness_rates: str | None,
    minutes: float,
    only: str | None,
) -> None:
    """Benchmark every stage on seeded synthetic data, with peers, reduction and scaling figures.

    Writes bench.md, bench.json, bench.png and scaling.png. S takes about five minutes on 2 cores
    (and runs in CI); M about forty-five, freshness under load included. L (2,000,000 events)
    measures scale only: the event path's chain, its memory and its fixed costs beside S and M.
    """
    from pipelines.bench.run import run_bench
    from pipelines.spark import build_spark

    if freshness_rates is not None:
        from pipelines.bench.freshness import run_freshness

        try:
            rates = [int(r) for r in freshness_rates.split(",") if r.strip()]
        except ValueError:
            rates = []
        if not rates or min(rates) < 1:
            raise click.BadParameter("give positive whole events/s, e.g. 1000,5000", param_hint="--freshness")
        out = out_dir or Path("bench-results") / "freshness"
        run_freshness(out, rates, minutes, say=say_step)
        console.print((out / "freshness.md").read_text())
        say_step(f"freshness done: {out}/freshness.md, freshness.json, freshness.png")
        return
    if soak_minutes is not None:
        from pipelines.bench.soak import run_soak

        out = out_dir or Path("bench-results") / "soak"
        run_soak(out, soak_minutes, say=say_step)
        console.print((out / "soak.md").read_text())
        say_step(f"soak done: {out}/soak.md, soak.json, soak.png")
        return
    out = out_dir or Path("bench-results") / (size if only is None else f"{size}-{only}")
    say_step("starting Spark")
    spark = build_spark(state.settings)
    runs = repeats or {"S": 2, "M": 3, "L": 1}[size]
    if only == "ingest":
        from pipelines.bench.run import run_ingest

        result = run_ingest(size, out, spark, runs, say=say_step)
    else:
        result = run_bench(size, out, spark, runs, say=say_step)
    console.print((out / "bench.md").read_text())
    say_step(f"bench {size} done in {result['wall_seconds']:,} s: {out}/bench.md, bench.json, bench.png")


def print_buckets(ctx: Any) -> None:
    """Per bucket: events, teams, newest event and ingest, and bronze commits not yet processed."""
    from pyspark.sql import functions as F

    from pipelines.runner import app_id
    from pipelines.tables import BRONZE_EVENTS, SILVER_EVENTS

    if ctx.store.version(SILVER_EVENTS) is None:
        return
    latest = ctx.store.version(BRONZE_EVENTS) or 0
    all_done = ctx.store.txn_version(SILVER_EVENTS, app_id("silver.events", BRONZE_EVENTS))
    rows = (
        ctx.store.read(SILVER_EVENTS)
        .groupBy("bucket")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.countDistinct("team_id").alias("teams"),
            F.max("event_time").alias("newest_event"),
            F.max("ingest_time").alias("newest_ingest"),
        )
        .orderBy("bucket")
        .collect()
    )
    t = Table(title="Buckets (silver/events)", title_justify="left")
    for col in ("bucket", "events", "teams", "newest event", "newest ingest", "bronze commits behind"):
        t.add_column(col, justify="left" if col.startswith("newest") else "right")
    for r in rows:
        own = ctx.store.txn_version(SILVER_EVENTS, app_id("silver.events", BRONZE_EVENTS, [r["bucket"]]))
        done = max(v for v in (all_done, own, -1) if v is not None)
        t.add_row(
            str(r["bucket"]),
            f"{r['events']:,}",
            f"{r['teams']:,}",
            str(r["newest_event"])[:19],
            str(r["newest_ingest"])[:19],
            str(max(0, latest - done)),
        )
    console.print(t)


# -- sql ----------------------------------------------------------------------------------------
def register_views(ctx: Any, sql: str | None) -> list[str]:
    """Register each table the SQL names (all of them when ``sql`` is None) as a temp view."""
    from pipelines.tables import ALL_TABLES

    names = []
    for spec in ALL_TABLES:
        if sql is not None and not re.search(rf"\b{re.escape(spec.view_name)}\b", sql, re.IGNORECASE):
            continue
        if ctx.store.version(spec) is None:
            continue
        ctx.store.read(spec).createOrReplaceTempView(spec.view_name)
        names.append(spec.view_name)
    return names


def show_rows(df: Any, limit: int, fmt: str) -> None:
    rows = df.limit(limit).collect()
    cols = df.columns
    if fmt == "json":
        for row in rows:
            console.print(json.dumps(row.asDict(recursive=True), default=str), soft_wrap=True)
        return
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout)
        writer.writerow(cols)
        writer.writerows([[row[c] for c in cols] for row in rows])
        return
    t = Table()
    for c in cols:
        t.add_column(c)
    for row in rows:
        t.add_row(*["NULL" if row[c] is None else str(row[c]) for c in cols])
    console.print(t)
    console.print(f"[dim]{len(rows)} row(s){' (limit reached)' if len(rows) == limit else ''}[/dim]")


@cli.command()
@click.argument("query", required=False)
@click.option("--limit", default=100, show_default=True, help="Rows to show at most.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.pass_obj
def sql(state: State, query: str | None, limit: int, fmt: str) -> None:
    """Run Spark SQL over the lake; every table is a view (bronze_events, gold_property_values, ...).

    Without QUERY, opens an interactive shell: end statements with ';', `.tables` lists the
    views, `.quit` leaves.
    """
    ctx = state.context()
    if query is not None:
        register_views(ctx, query)
        show_rows(ctx.spark.sql(query), limit, fmt)
        return
    views = register_views(ctx, None)
    console.print(f"views: {', '.join(views) or '(no tables yet)'}")
    buffer = ""
    while True:
        try:
            line = input("medallion> " if not buffer else "       ... ")
        except EOFError:
            break
        stripped = line.strip()
        if not buffer and stripped in (".quit", ".exit", "quit", "exit"):
            break
        if not buffer and stripped == ".tables":
            console.print(", ".join(register_views(ctx, None)))
            continue
        buffer += line + "\n"
        if not stripped.endswith(";"):
            continue
        statement, buffer = buffer.strip().rstrip(";"), ""
        try:
            show_rows(ctx.spark.sql(statement), limit, fmt)
        except Exception as exc:  # keep the shell alive on a bad statement
            err_console.print(f"[red]error:[/red] {_first_line(exc)}")


# -- settings -----------------------------------------------------------------------------------
@cli.command("settings")
@click.pass_obj
def show_settings(state: State) -> None:
    """Print the effective settings as JSON (secrets masked)."""
    console.print_json(json.dumps(state.settings.safe_dump()))


def _num(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.3f}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return first if len(first) < 400 else first[:400] + "..."


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: one clear line per error and a non-zero exit; ``--verbose`` for the traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args or "--verbose" in args
    try:
        code = cli.main(args=args, prog_name="medallion", standalone_mode=False)
        if isinstance(code, int) and code:  # a command ended with click.exceptions.Exit(code)
            sys.exit(code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.UsageError as exc:  # one line, and where to read more
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        err_console.print(f"error: {exc.format_message()}{hint}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        err_console.print(f"error: {exc.format_message()}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except SettingsError as exc:
        for problem in exc.problems:
            err_console.print(f"error: {problem}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except MedallionError as exc:
        if verbose:
            traceback.print_exc()
        err_console.print(f"error: {exc}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        err_console.print(
            f"error: {type(exc).__name__}: {_first_line(exc)} (run with --verbose for the traceback)",
            soft_wrap=True,
            markup=False,
        )
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
