"""Writes the report's static site: ``index.html`` (the flow graph and the tables' and flows'
figures), a page per table and per job run, PNG charts, ``report.json``, and the stylesheet
shipped in the package. Every link is relative, so the site opens from disk and can be kept as a
CI artifact; nothing is fetched from anywhere.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from pipelines.app.report import graph
from pipelines.app.report.collect import OUTCOMES, Report, Run, Table, as_json, slug

HERE = Path(__file__).parent


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = lambda ts: ts.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(ts, datetime) else "-"
    env.filters["num"] = _num
    env.filters["size"] = _size
    env.filters["age"] = graph.age
    env.filters["seconds"] = lambda s: "-" if s is None else f"{s:,.1f} s"
    return env


def _num(n: float | int | None) -> str:
    """A figure with thousands separators; a whole float (the event log's metrics) as a whole."""
    if n is None:
        return "-"
    if isinstance(n, int) or float(n).is_integer():
        return f"{int(n):,}"
    return f"{n:,.3f}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}"
        n //= 1024
    return f"{n:,} TiB"


def time_axis(times: list[datetime]) -> tuple[datetime, datetime]:
    """The time axis around the runs: 5% of their span either side, and at least a minute, so one
    run (or a few close together) shows minutes around it, not matplotlib's default of years."""
    first, last = min(times), max(times)
    pad = max((last - first) * 0.05, timedelta(minutes=1))
    return first - pad, last + pad


def _chart(table: Table, runs: list[Run], path: Path) -> bool:
    """Rows written and duration of each run of the table's writers, over time (a PNG)."""
    from pipelines.app.plotting import pyplot

    points = sorted((r for r in runs if r.started_at is not None), key=lambda r: r.started_at)  # type: ignore[arg-type,return-value]
    if not points:
        return False
    plt = pyplot()
    fig, (rows_ax, time_ax) = plt.subplots(2, 1, figsize=(8, 4.6), sharex=True)
    for job in sorted({r.job for r in points}):
        mine = [r for r in points if r.job == job]
        when = [r.started_at for r in mine]
        rows_ax.plot(when, [r.rows_out for r in mine], marker="o", markersize=3, label=job)
        time_ax.plot(when, [r.seconds or 0 for r in mine], marker="o", markersize=3, label=job)
    rows_ax.set_ylabel("rows written")
    time_ax.set_ylabel("run seconds")
    rows_ax.set_title(f"{table.key}: runs of {', '.join(table.writers)}")
    rows_ax.legend(fontsize=7, loc="upper left")
    for ax in (rows_ax, time_ax):
        ax.grid(alpha=0.3)
    time_ax.set_xlim(*time_axis([r.started_at for r in points]))  # type: ignore[misc]
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write(report: Report, out: Path, gx_index: str | None, charts: bool = True) -> Path:
    """The site under ``out``; returns its ``index.html``."""
    env = _environment()
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "static" / "report.css", out / "report.css")
    common: dict[str, Any] = {"report": report, "outcomes": OUTCOMES, "gx_index": gx_index}
    (out / "index.html").write_text(
        env.get_template("index.html.j2").render(**common, graph=graph.svg(report), root=""), encoding="utf-8"
    )
    for table in report.tables.values():
        runs = [r for r in report.runs if r.flow in table.writers]
        chart = f"charts/{slug(table.key)}.png"
        has_chart = charts and _chart(table, runs, out / chart)
        (out / table.page).write_text(
            env.get_template("table.html.j2").render(
                **common, table=table, runs=runs[:30], chart=chart if has_chart else None, root="../"
            ),
            encoding="utf-8",
        )
    for run in report.runs:
        (out / run.page).write_text(
            env.get_template("run.html.j2").render(**common, run=run, root="../"), encoding="utf-8"
        )
    (out / "report.json").write_text(as_json(report), encoding="utf-8")
    return out / "index.html"
