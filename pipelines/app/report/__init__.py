"""``medallion report``: the pipeline as a static site people open in a browser.

The flow graph (from the flow registry) with each table's rows, freshness and expectations and
each flow's last run; a page per table (schema, version history, files, the latest expectation
results with failing rows, charts of its runs) and per job run (from the event log); and Great
Expectations' own Data Docs, built by GX from the same validations. The site opens from disk: its
stylesheet is in the package, its charts are PNG files beside it, and it fetches nothing.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from pipelines.runtime.runner import Context

log = logging.getLogger("medallion")


def build_report(ctx: Context, out: Path, charts: bool = True) -> Path:
    """Write the report of ``ctx``'s lake under ``out`` (replacing a report there); returns its
    ``index.html``."""
    from pipelines.app.report import collect, gx_docs, site

    out = Path(out)
    if (out / "index.html").exists() or (out / "gx").exists():
        for part in ("tables", "runs", "charts", "gx"):
            shutil.rmtree(out / part, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    ctx.say("report: reading the lake, the event log and the expectation results")
    report = collect.collect(ctx)
    ctx.say(f"report: {len(report.tables)} tables, {len(report.flows)} flows, {len(report.runs)} runs")
    gx_index = gx_docs.build(ctx, report, out)
    if charts:
        try:
            from pipelines.app.plotting import pyplot

            pyplot()
        except Exception as exc:  # charts are an extra: the pages are written without them
            log.warning("report without charts: %s", exc)
            charts = False
    return site.write(report, out, gx_index, charts)
