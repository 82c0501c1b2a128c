"""Planning and measuring: ``buckets plan``, ``analyze dedup`` and ``bench``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from pipelines.app.cli.base import State, cli, console, say_step

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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

    from pipelines.config import layers
    from pipelines.runtime.tables import BRONZE_EVENTS, SILVER_EVENTS
    from silver.buckets import bucket_of, plan_buckets

    ctx = state.context()
    mapping = layers.bucket_mapping(ctx.settings)
    source = SILVER_EVENTS if ctx.store.version(SILVER_EVENTS) is not None else BRONZE_EVENTS
    if ctx.store.version(source) is None:
        raise click.UsageError("no events yet: land some before planning buckets")
    rows = (
        ctx.store.read(source)
        .groupBy("team_id")
        .agg(F.count(F.lit(1)).alias("n"))
        .withColumn("bucket", bucket_of(F.col("team_id"), mapping))
        .collect()  # one row per team: the planner places every team by its volume
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
    from pipelines.dev import analyze as an
    from pipelines.runtime.tables import table as table_spec

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


@cli.command()
@click.option(
    "--size",
    type=click.Choice(["XS", "S", "M", "L"]),
    default="S",
    show_default=True,
    help="Workload size (XS: a check that every stage runs, its figures fixed costs).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for the results.")
@click.option(
    "--repeats", type=click.IntRange(1, 20), help="Timed runs per stage after a warm-up [XS: 1, S: 2, M: 3, L: 1]."
)
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
    type=click.Choice(["ingest", "dedup", "chain"]),
    help="Only these stages: ingest = Kafka and remote write -> bronze with their peers "
    "(VictoriaMetrics and Prometheus among them); dedup = silver events with deduplication by event "
    "identity on and off, at every size up to --size; chain = the event path warm and cold, with "
    "its plain-Spark and ClickHouse peers and Spark's jobs per stage.",
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

    Writes bench.md, bench.json, bench.png and scaling.png. XS checks that every stage runs (CI
    runs it; its figures are fixed costs); S takes about ten minutes on 2 cores; M about
    forty-five, freshness under load included. L (2,000,000 events) measures scale only: the event
    path's chain, its memory and its fixed costs beside S and M.
    """
    from pipelines.config.spark import build_spark
    from pipelines.dev.bench import sparklog
    from pipelines.dev.bench.event_path import run_chain
    from pipelines.dev.bench.run import run_bench

    if freshness_rates is not None:
        _bench_freshness(freshness_rates, out_dir or Path("bench-results") / "freshness", minutes)
        return
    if soak_minutes is not None:
        from pipelines.dev.bench.soak import run_soak

        out = out_dir or Path("bench-results") / "soak"
        run_soak(out, soak_minutes, say=say_step)
        console.print((out / "soak.md").read_text())
        say_step(f"soak done: {out}/soak.md, soak.json, soak.png")
        return
    out = out_dir or Path("bench-results") / (size if only is None else f"{size}-{only}")
    say_step("starting Spark")
    # Each stage's jobs, from Spark's record: the full bench reads it; a Connect client has none.
    recorded = only in (None, "chain") and not state.settings.spark.remote
    if recorded and "spark.eventLog.enabled" not in state.settings.spark.conf:
        state.settings.spark.conf.update(sparklog.confs(out.resolve() / sparklog.FOLDER))
    spark = build_spark(state.settings)
    runs = repeats or {"XS": 1, "S": 2, "M": 3, "L": 1}[size]
    if only == "dedup":
        _bench_dedup(size, out, spark, repeats or 3)
        return
    if only == "ingest":
        from pipelines.dev.bench.ingest import run_ingest

        result = run_ingest(size, out, spark, runs, say=say_step)
    elif only == "chain":
        result = run_chain(size, out, spark, runs, say=say_step)
    else:
        result = run_bench(size, out, spark, runs, say=say_step)
    console.print((out / "bench.md").read_text())
    say_step(f"bench {size} done in {result['wall_seconds']:,} s: {out}/bench.md, bench.json, bench.png")


def _bench_freshness(rates_text: str, out: Path, minutes: float) -> None:
    """``medallion bench --freshness RATES``: lag under load at each rate (events/s)."""
    from pipelines.dev.bench.freshness import run_freshness

    try:
        rates = [int(r) for r in rates_text.split(",") if r.strip()]
    except ValueError:
        rates = []
    if not rates or min(rates) < 1:
        raise click.BadParameter("give positive whole events/s, e.g. 1000,5000", param_hint="--freshness")
    run_freshness(out, rates, minutes, say=say_step)
    console.print((out / "freshness.md").read_text())
    say_step(f"freshness done: {out}/freshness.md, freshness.json, freshness.png")


def _bench_dedup(size: str, out: Path, spark: SparkSession, repeats: int) -> None:
    """``medallion bench --only dedup``: silver with deduplication on and off, at every scaled size
    up to ``size`` (XS, outside them, alone)."""
    from pipelines.dev.bench.dedup import run_dedup
    from pipelines.dev.bench.workloads import SCALED_SIZES

    sizes = list(SCALED_SIZES[: SCALED_SIZES.index(size) + 1]) if size in SCALED_SIZES else [size]
    result = run_dedup(sizes, out, spark, repeats, say=say_step)
    console.print((out / "dedup.md").read_text())
    say_step(f"dedup bench done in {result['wall_seconds']:,} s: {out}/dedup.md, dedup.json, dedup.png")
