"""The command line's frame: the ``medallion`` group, its global options, the state every command
shares, logging, and the metrics endpoint options."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console

from pipelines.config.settings import Settings, assign, load_settings

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
        from pipelines.config.spark import build_spark
        from pipelines.runtime.runner import Context
        from pipelines.storage import open_store

        settings = self.settings
        if validates and settings.quality.enabled:
            from pipelines.runtime.quality import preload

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


def num(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.3f}"


def first_line(exc: BaseException) -> str:
    """An error's first line, at most 400 characters."""
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return first if len(first) < 400 else first[:400] + "..."
