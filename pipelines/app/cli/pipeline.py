"""Commands that move data: ``demo``, ``run``, ``ingest`` and ``serve``."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from pipelines.app.cli.base import METRICS_HOST, METRICS_PORT, State, cli, console, err_console, serve_metrics
from pipelines.app.cli.render import print_summary
from pipelines.runtime.stopping import next_wait, stop_on


# -- demo ---------------------------------------------------------------------------------------
@cli.command()
@click.option("--events", default=200_000, show_default=True, help="Synthetic product events to generate.")
@click.option("--page-changes", default=60_000, show_default=True, help="Synthetic page changes (before duplicates).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, writable=True, path_type=Path),
    help="Where to write the pipeline report [default: <lake root>/_report, or ./medallion-report for a remote lake].",
)
@click.pass_obj
def demo(state: State, events: int, page_changes: int, as_json: bool, report_dir: Path | None) -> None:
    """Run bronze -> silver -> gold -> ClickHouse on the shipped fixtures plus a synthetic stream,
    then write the pipeline report (a site to open in a browser).

    Needs no services: Delta tables go under the lake root, ClickHouse is the embedded chdb.
    Running it again changes no table.
    """
    from pipelines.app.report import build_report
    from pipelines.demo.run import DemoSize, run_demo

    if events < 0 or page_changes < 0:
        raise click.BadParameter("sizes must not be negative")
    ctx = state.context(validates=True)
    result = run_demo(ctx, DemoSize(events=events, page_changes=page_changes))
    root = ctx.settings.lake_root
    out = report_dir or (Path("medallion-report") if "://" in root else Path(root) / "_report")
    result["report"] = build_report(ctx, out).resolve().as_uri()
    if as_json:
        console.print_json(json.dumps(result))
        return
    print_summary(result)


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

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipelines import flows

        if value in flows.names() or value in flows.RENAMED:
            return value
        self.fail(f"{value!r} is not a flow or stage; one of: {', '.join(flows.names())}", param, ctx)


@cli.command()
@click.argument("job", type=FlowName(), metavar="JOB")
@click.option("--once", is_flag=True, help="Process what is there and stop (else repeat until stopped).")
@click.option(
    "--interval",
    default=30.0,
    show_default=True,
    help="Without --once: seconds from one run's start to the next's (a longer run is followed at once).",
)
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
    Without --once it starts a run every --interval seconds (at once after a run that took
    longer) until SIGTERM or Ctrl-C, finishing the step under way.
    """
    chosen = _parse_buckets(buckets)
    if chosen is not None:  # checked before Spark starts
        count = state.settings.buckets.count
        bad = [b for b in chosen if b >= count]
        if bad:
            raise click.BadParameter(f"bucket(s) {bad} outside 0..{count - 1}", param_hint="--bucket")
    serve_metrics(metrics_port, metrics_host)
    from pipelines import flows
    from pipelines.runtime import passes

    chosen_flows = flows.resolve(job)
    ctx = state.context(validates=True)
    with contextlib.nullcontext(threading.Event()) if once else stop_on(signal.SIGTERM, signal.SIGINT) as stop:
        while True:
            started = time.monotonic()
            # closed on a stop: the flows' event-log rows are written then, not when it is collected
            with contextlib.closing(passes.run_pass(ctx, chosen_flows, chosen, drain)) as records:
                for record in records:
                    console.print(f"{record.job}: {record.status}, {record.rows_in:,} in, {record.rows_out:,} out")
                    if stop.is_set():
                        break
            if once or stop.wait(next_wait(started, interval, time.monotonic())):
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
    from pipelines.runtime.ingest import ingest_files

    ctx = state.context(validates=True)
    record = ingest_files(ctx, kind, list(paths))
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
    from pipelines.runtime.ingest_kafka import ingest_kafka
    from pipelines.runtime.quality import wait_preloaded
    from pipelines.runtime.runner import startup_heap_frozen

    if max_batch < 1 or max_wait <= 0:
        raise click.BadParameter("--max-batch must be >= 1 and --max-wait > 0")
    chosen = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    serve_metrics(metrics_port, metrics_host)
    ctx = state.context(validates=True)
    # Start-up is over (Spark, and the gates' modules loading meanwhile): what is alive
    # now lives as long as the process, so the collections after each flush need not walk it.
    wait_preloaded()
    with stop_on(signal.SIGTERM, signal.SIGINT) as stop, startup_heap_frozen():
        stats = ingest_kafka(ctx, chosen, max_batch=max_batch, max_wait=max_wait, once=once, stop=stop)
    console.print(
        f"ingest.kafka: {stats.messages:,} messages in {stats.flushes} flush(es), {stats.landed:,} landed, "
        f"{stats.quarantined:,} quarantined, {stats.seconds:.1f}s"
    )


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
    bind = host or rw.host
    count = processes or rw.processes

    def ready(bound: int) -> None:
        err_console.print(
            f"remote-write receiver listening on http://{f'[{bind}]' if ':' in bind else bind}:{bound}/api/v1/write"
            + (f" ({count} processes)" if count > 1 else ""),
            soft_wrap=True,
        )

    with stop_on(signal.SIGTERM, signal.SIGINT) as stop:
        serve_processes(settings, bind, rw.port if port is None else port, count, stop, ready)
    err_console.print("remote-write receiver stopped; every acknowledged sample is in bronze/samples")
