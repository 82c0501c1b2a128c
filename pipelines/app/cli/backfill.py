"""``medallion backfill``: a range of windows counted again from what the lake holds, under the
settings in force (``--set``, variables, the config file, as for every command)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from pipelines.app.cli.base import State, cli, console


class Instant(click.ParamType):
    """An ISO 8601 time (``2024-06-01T00:00:00Z``, ``2024-06-01``); one without a zone is UTC."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            at = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time (2024-06-01T00:00:00Z)", param, ctx)
        return at if at.tzinfo else at.replace(tzinfo=UTC)


@cli.group()
def backfill() -> None:
    """Count a range of windows again after a rule changed, and correct ClickHouse once."""


def _range(start: datetime, end: datetime) -> None:
    if end <= start:
        raise click.BadParameter("--to must be after --from", param_hint="--to")


def _print(record: Any) -> None:
    """A backfill's line: what it changed, or why it had nothing to do."""
    from pipelines.runtime import backfill, backfill_page_changes, backfill_silver

    m = record.metrics
    if record.status == "noop":
        console.print(f"{record.job}: nothing to do ({record.details})")
        return
    windows = f"{int(m.get('windows', 0)):,} windows"
    what, summary = {
        backfill.JOB: (f"{windows} recounted", backfill.summary),
        backfill_silver.JOB: (f"{windows} made again", backfill_silver.summary),
        backfill_page_changes.JOB: ("page windows made again", backfill_page_changes.summary),
    }[record.job]
    console.print(f"{record.job}: {what}: {summary(m)}")


FROM = click.option("--from", "start", type=Instant(), required=True, help="The first window start to redo (UTC).")
TO = click.option("--to", "end", type=Instant(), required=True, help="Windows that start before this (UTC).")


@backfill.command("gold")
@FROM
@TO
@click.pass_obj
def backfill_gold(state: State, start: datetime, end: datetime) -> None:
    """Recount gold's windows that start in [--from, --to) from silver with the settings in force,
    replacing what gold holds there (a tuple the rules no longer count is removed, a changed count
    corrected), then export the corrections to ClickHouse. Windows outside the range are left as
    they are; runs after it count as always. Killed, the same command finishes it."""
    from pipelines.runtime.backfill import backfill_gold as run

    _range(start, end)
    _print(run(state.context(validates=True), start, end))


@backfill.command("silver")
@FROM
@TO
@click.option(
    "--only",
    type=click.Choice(["events", "page_changes"]),
    default=None,
    help="Make one of silver's tables again (default: both).",
)
@click.pass_obj
def backfill_silver(state: State, start: datetime, end: datetime, only: str | None) -> None:
    """Make silver's rows of gold's windows that start in [--from, --to) again from bronze with
    the settings in force, replacing what silver holds there:

    \b
    - events (silver.dedup_horizon, the bucket mapping), then those windows recounted in gold and
      ClickHouse corrected, as `backfill gold` does;
    - page changes (page_changes.*, silver.dedup_horizon), with the changes that landed after
      their window had closed counted in; each page's windows between edges none of them crosses.

    Counters keep what they counted. Killed, the same command finishes it."""
    from pipelines.runtime.backfill_page_changes import backfill_page_changes
    from pipelines.runtime.backfill_silver import backfill_silver as run

    _range(start, end)
    ctx = state.context(validates=True)
    if only in (None, "events"):
        for record in run(ctx, start, end):
            _print(record)
    if only in (None, "page_changes"):
        _print(backfill_page_changes(ctx, start, end))
