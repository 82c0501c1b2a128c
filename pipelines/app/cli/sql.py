"""``medallion sql``: Spark SQL over the lake, every table a view, and an interactive shell."""

from __future__ import annotations

import re
from typing import Any

import click

from pipelines.app.cli.base import State, cli, console, err_console, first_line
from pipelines.app.cli.render import show_rows


# -- sql ----------------------------------------------------------------------------------------
def register_views(ctx: Any, sql: str | None) -> list[str]:
    """Register each table the SQL names (all of them when ``sql`` is None) as a temp view."""
    from pipelines.runtime.tables import ALL_TABLES

    names = []
    for spec in ALL_TABLES:
        if sql is not None and not re.search(rf"\b{re.escape(spec.view_name)}\b", sql, re.IGNORECASE):
            continue
        if ctx.store.version(spec) is None:
            continue
        ctx.store.read(spec).createOrReplaceTempView(spec.view_name)
        names.append(spec.view_name)
    return names


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
            err_console.print(f"[red]error:[/red] {first_line(exc)}")
