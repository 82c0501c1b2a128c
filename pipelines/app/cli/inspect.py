"""Commands that look at the lake: ``status``, ``flows``, ``report``, ``validate``, ``maintain``,
``counters``, ``query`` and ``settings``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.table import Table

from pipelines.app.cli.base import State, cli, console, num, say_step
from pipelines.app.cli.render import cell, print_backfills, print_buckets, print_flows, print_quality, print_results


# -- status -------------------------------------------------------------------------------------
@cli.command()
@click.option("--runs", default=15, show_default=True, help="How many recent runs to list.")
@click.pass_obj
def status(state: State, runs: int) -> None:
    """Show every table (version, rows, last write) and the latest job runs."""
    from pipelines.runtime.eventlog import PIPELINE_EVENTS
    from pipelines.runtime.tables import ALL_TABLES

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
    # At most --runs rows, to print.
    recent = ctx.store.read(PIPELINE_EVENTS).orderBy("ended_at", ascending=False).limit(runs).collect()
    r = Table(title="Latest runs", title_justify="left")
    for col in ("ended", "job", "status", "in", "out", "seconds", "metrics"):
        r.add_column(col, justify="right" if col in ("in", "out", "seconds") else "left")
    for row in recent:
        metrics = dict(row["metrics"] or {})
        secs = metrics.pop("seconds", 0.0)
        shown = ", ".join(f"{k}={num(v)}" for k, v in sorted(metrics.items())[:8])
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
    print_backfills(ctx, runs)
    print_quality(ctx)


@cli.command("flows")
def list_flows() -> None:
    """List every flow: its stage, what it reads and writes, and how."""
    print_flows(None)


REPORT_DIR = click.Path(file_okay=False, dir_okay=True, writable=True, path_type=Path)


@cli.command()
@click.option("--out", "out_dir", type=REPORT_DIR, required=True, help="Folder to write the site to.")
@click.option("--no-charts", is_flag=True, help="Leave out the PNG charts (no matplotlib needed).")
@click.pass_obj
def report(state: State, out_dir: Path, no_charts: bool) -> None:
    """Write the pipeline report: a static site to open in a browser, from disk.

    The flow graph with each table's rows, freshness and expectations and each flow's last run; a
    page per table and per job run; and Great Expectations' Data Docs of the same validations.
    """
    from pipelines.app.report import build_report

    ctx = state.context()
    index = build_report(ctx, out_dir, charts=not no_charts)
    say_step(f"report: {index.resolve().as_uri()}")


@cli.command()
@click.argument("tables", nargs=-1, metavar="[TABLE]...")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--report",
    "report_dir",
    type=REPORT_DIR,
    help="Also write the pipeline report there (as medallion report does), with these results.",
)
@click.pass_obj
def validate(state: State, tables: tuple[str, ...], as_json: bool, report_dir: Path | None) -> None:
    """Validate whole tables with their expectation suites (all of them when none is named).

    Cross-table figures are checked too (gold against partials and the silver fan-out,
    ClickHouse against what was exported). Exits 1 when a `fail` expectation does not hold;
    ``--report`` writes the report first, whatever the outcome, so CI can keep it.
    """
    from expectations.suites import SUITES

    unknown = [t for t in tables if t not in SUITES]
    if unknown:  # before Spark starts
        raise click.BadParameter(
            f"no suite for {', '.join(unknown)}; tables with suites: {', '.join(SUITES)}", param_hint="TABLE"
        )
    from pipelines import flows
    from pipelines.runtime import quality
    from pipelines.runtime.eventlog import recorded

    ctx = state.context(validates=True)
    quality.check_policies(ctx)
    with recorded(ctx.events, "validate", ctx.run_id) as record:
        checked = quality.validate_tables(ctx, record, list(tables), flows.table_checks())
        failed = [r for c in checked if c.validation for r in c.validation.failed]
        record.rows_in = len(checked)
        record.add(failed_expectations=len(failed))
        if failed:
            record.status = "failed"
            record.details = "; ".join(f"{r.dataset}:{r.expectation}" for r in failed)
    results = [r.as_row() for c in checked if c.validation for r in c.validation.results]
    if report_dir is not None:
        from pipelines.app.report import build_report

        index = build_report(ctx, report_dir)
        say_step(f"report: {index.resolve().as_uri()}")  # stderr: --json keeps stdout to itself
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

    from pipelines.app.maintenance import check_retention, maintain_tables, select_tables

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
    from pipelines.app.counter_queries import show

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
    from pipelines.app.metric_queries import dropped_late
    from pipelines.app.metric_queries import query as run_query

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
        table.add_row(*(cell(row[c]) for c in columns))
    console.print(table)
    if dropped:
        console.print(f"[dim]{dropped:,} late sample(s) dropped by this aggregation so far (late: drop)[/]")


# -- settings -----------------------------------------------------------------------------------
@cli.command("settings")
@click.pass_obj
def show_settings(state: State) -> None:
    """Print the effective settings as JSON (secrets masked)."""
    console.print_json(json.dumps(state.settings.safe_dump()))
