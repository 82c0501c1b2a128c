"""How commands show results: rich tables of summaries, flows, runs, quality results and rows."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.table import Table

from pipelines.app.cli.base import console
from pipelines.flows import flow_names


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
    f.add_row(
        "repeats dropped by identity: events / page changes",
        f"{result['event_repeats_dropped']:,} / {result['page_change_repeats_dropped']:,}",
    )
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
    if result.get("report"):
        console.print(f"Report (open it in a browser): [bold]{result['report']}[/bold]")


def print_flows(ctx: Any | None) -> None:
    """The flow registry as a table; with ``ctx``, each flow's last run from the event log."""
    from pipelines import flows

    last: dict[str, Any] = {}
    repeats: dict[str, int] = {}
    if ctx is not None:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        from pipelines.runtime.eventlog import PIPELINE_EVENTS, totals

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
        repeats = totals(ctx.store, "duplicates_dropped")  # silver's dedup by event identity
    t = Table(title="Flows", title_justify="left")
    columns = ("last run", "status", "in", "out", "repeats dropped") if ctx else ()
    for col in ("flow", "stage", "reads", "writes", "mode", *columns):
        t.add_column(col, justify="right" if col in ("in", "out", "repeats dropped") else "left")
    for f in flows.FLOWS:
        read = [*f.sources, *(s for s in f.lookups if s not in f.sources)]
        reads = ", ".join([s.key for s in read] + ([f.external_source] if f.external_source else []))
        writes = ", ".join([s.key for s in f.targets] + ([f.external_target] if f.external_target else []))
        mode = f.mode + (", by bucket" if f.by_bucket else "")
        cells = [f.name, f.stage, reads, writes, mode]
        if ctx is not None:
            r = last.get(f.name)
            cells += (
                [r["ended_at"].strftime("%Y-%m-%d %H:%M:%S"), r["status"], f"{r['rows_in']:,}", f"{r['rows_out']:,}"]
                if r
                else ["-", "never", "", ""]
            ) + [f"{repeats[f.name]:,}" if f.name in repeats else ""]
        t.add_row(*cells)
    console.print(t)


def print_quality(ctx: Any) -> None:
    """The latest result of every expectation, per table: the quality at a glance."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pipelines.runtime.eventlog import EXPECTATION_RESULTS

    if ctx.store.version(EXPECTATION_RESULTS) is None:
        return
    latest = Window.partitionBy("dataset", "expectation").orderBy(F.col("validated_at").desc())
    rows = (
        ctx.store.read(EXPECTATION_RESULTS)
        .withColumn("_n", F.row_number().over(latest))
        .where("_n = 1")
        .orderBy("dataset", "expectation")
        .collect()  # one row per expectation of every suite: a few dozen, to print
    )
    print_results(rows, title="Latest data quality (per expectation, newest result)")


def print_backfills(ctx: Any, runs: int) -> None:
    """The latest backfills: each one's range, the rules that changed since the count before, and
    the tuples (gold's) or events (silver's) it changed, removed, added and kept."""
    import json

    from pyspark.sql import functions as F

    from pipelines.runtime.eventlog import PIPELINE_EVENTS

    rows = (
        ctx.store.read(PIPELINE_EVENTS)
        .where(F.col("job").startswith("backfill."))
        .orderBy(F.col("ended_at").desc())
        .limit(runs)
        .collect()  # at most --runs rows, to print
    )
    if not rows:
        return
    t = Table(title="Backfills", title_justify="left")
    columns = ("ended", "job", "status", "range", "rules changed, or why not", "changed", "removed", "added")
    for col in (*columns, "as they were"):
        numbers = col in ("changed", "removed", "added", "as they were")
        # The time and the range stay on one line; a long reason wraps in its own column.
        t.add_column(col, justify="right" if numbers else "left", no_wrap=col in ("ended", "range"))
    for row in rows:
        try:
            details = json.loads(row["details"] or "{}")
        except ValueError:  # a noop's reason
            details = {}
        changed = details.get("changed")
        rules = (
            ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in changed.items())
            if isinstance(changed, dict)
            else (changed or "")
        )
        if row["status"] != "ok":  # a noop's reason, a refusal, an error: shortened (the event log holds it whole)
            rules = _short(row["error"] or row["details"])
        m = dict(row["metrics"] or {})
        t.add_row(
            row["ended_at"].strftime("%Y-%m-%d %H:%M:%S"),
            row["job"],
            row["status"],
            f"[{details['from']}, {details['to']})" if "from" in details else "",
            rules or "none",
            # gold's in tuples, silver's in events or page changes (removed or added, never changed)
            *(
                f"{int(m[f'{unit}_{k}']):,}" if f"{unit}_{k}" in m else ""
                for unit in (next((u for u in ("tuples", "page_changes") if f"{u}_added" in m), "events"),)
                for k in ("changed", "removed", "added", "unchanged")
            ),
        )
    console.print(t)


def _short(text: str | None, limit: int = 160) -> str:
    """A reason or an error in a table's cell: its first ``limit`` characters."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


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


def cell(v: Any) -> str:
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


def print_buckets(ctx: Any) -> None:
    """Per bucket: events, teams, newest event and ingest, and bronze commits not yet processed."""
    from pyspark.sql import functions as F

    from pipelines.runtime.runner import app_id
    from pipelines.runtime.tables import BRONZE_EVENTS, SILVER_EVENTS

    if ctx.store.version(SILVER_EVENTS) is None:
        return
    latest = ctx.store.version(BRONZE_EVENTS) or 0
    all_done = ctx.store.txn_version(SILVER_EVENTS, app_id(flow_names.SILVER_EVENTS, BRONZE_EVENTS))
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
        .collect()  # one row per bucket, to print
    )
    t = Table(title="Buckets (silver/events)", title_justify="left")
    for col in ("bucket", "events", "teams", "newest event", "newest ingest", "bronze commits behind"):
        t.add_column(col, justify="left" if col.startswith("newest") else "right")
    for r in rows:
        own = ctx.store.txn_version(SILVER_EVENTS, app_id(flow_names.SILVER_EVENTS, BRONZE_EVENTS, [r["bucket"]]))
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


def show_rows(df: Any, limit: int, fmt: str) -> None:
    rows = df.limit(limit).collect()  # at most --limit rows, to print
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
