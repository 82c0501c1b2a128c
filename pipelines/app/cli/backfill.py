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


@backfill.command("gold")
@click.option("--from", "start", type=Instant(), required=True, help="The first window start to recount (UTC).")
@click.option("--to", "end", type=Instant(), required=True, help="Windows that start before this (UTC).")
@click.pass_obj
def backfill_gold(state: State, start: datetime, end: datetime) -> None:
    """Recount gold's windows that start in [--from, --to) from silver with the settings in force,
    replacing what gold holds there (a tuple the rules no longer count is removed, a changed count
    corrected), then export the corrections to ClickHouse. Windows outside the range are left as
    they are; runs after it count as always. Killed, the same command finishes it."""
    from pipelines.runtime.backfill import backfill_gold as run
    from pipelines.runtime.backfill import summary

    if end <= start:
        raise click.BadParameter("--to must be after --from", param_hint="--to")
    record = run(state.context(validates=True), start, end)
    m = record.metrics
    if record.status == "noop":
        console.print(f"{record.job}: nothing to do ({record.details})")
        return
    console.print(f"{record.job}: {int(m.get('windows', 0)):,} windows recounted: {summary(m)}")
