"""Freshness under load, explained: where each ``run all`` pass's time went while a rate ran,
per job, from the lake's own event log (``_meta/pipeline_events``: one row per job run).

A pass begins with the runner's first flow; its wall time runs from that flow's start to its last
flow's end, so what the runner does between flows (loading tables, the gates' bookkeeping) is the
pass's time that no job's row holds (``between``). A rate is held only if a pass keeps up with
what one interval brings: a pass longer than the interval delays the next, and lag grows by it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.dev.bench.freshness_lags import epoch

#: Jobs the ``run all`` process does not run: the ingest is a process of its own.
_ELSEWHERE = ("ingest.",)


def job_runs(lake: Path) -> list[dict[str, Any]]:
    """The event log's job runs of ``run all`` (job, started_at, ended_at, rows_in), in the order
    they started. Measurement only, and small: a row per job run."""
    from deltalake import DeltaTable

    log = DeltaTable(str(lake / "_meta" / "pipeline_events"))
    rows = log.to_pyarrow_table(columns=["job", "started_at", "ended_at", "rows_in"]).to_pylist()
    return sorted((r for r in rows if not r["job"].startswith(_ELSEWHERE)), key=lambda r: r["started_at"])


def pass_costs(runs: Sequence[dict[str, Any]], since: float = 0.0) -> dict[str, Any]:
    """Job runs (as :func:`job_runs` gives them) -> the passes that started at ``since`` (epoch
    seconds) or later: how many, their wall seconds (median, max), and per job, in the order the
    runner runs them, its runs, the rows they took in, its median and longest seconds and its
    share of the passes' wall time; ``between`` is the share no job's row holds."""
    if not runs:
        return {"passes": 0, "p50_s": None, "max_s": None, "jobs": [], "between": None}
    head = runs[0]["job"]
    passes: list[list[dict[str, Any]]] = []
    for r in runs:
        if r["job"] == head:  # the first run is the head's: a pass is open from the start
            passes.append([])
        passes[-1].append(r)
    passes = [p for p in passes if epoch(p[0]["started_at"]) >= since]
    walls = [(epoch(p[-1]["ended_at"]) - epoch(p[0]["started_at"])) for p in passes]
    total = sum(walls) or 1.0
    jobs: dict[str, list[dict[str, Any]]] = {}
    for p in passes:
        for r in p:
            jobs.setdefault(r["job"], []).append(r)
    per_job: list[dict[str, Any]] = []
    in_jobs = 0.0
    for job, rs in jobs.items():
        secs = [epoch(r["ended_at"]) - epoch(r["started_at"]) for r in rs]
        in_jobs += sum(secs)
        per_job.append(
            {
                "job": job,
                "runs": len(rs),
                "rows_in": sum(int(r["rows_in"] or 0) for r in rs),
                "p50_s": round(statistics.median(secs), 2),
                "max_s": round(max(secs), 2),
                "share": round(sum(secs) / total, 3),
            }
        )
    return {
        "passes": len(passes),
        "p50_s": round(statistics.median(walls), 1) if walls else None,
        "max_s": round(max(walls), 1) if walls else None,
        "jobs": per_job,
        "between": round(1 - in_jobs / total, 3) if passes else None,
    }
