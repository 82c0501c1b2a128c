"""The fixed costs of a run: each event-path job alone, and whole passes of ``run all``, on an
empty increment and after 1 event landed (per flow, with the Spark jobs each ran)."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from pipelines.config.spark import interpreted
from pipelines.dev.bench.measure import Bench
from pipelines.dev.bench.workloads import Workload
from pipelines.runtime import ingest
from pipelines.runtime import passes as one_run
from pipelines.runtime.runner import Context

#: The event path's jobs, each run alone, for the per-run fixed costs (``drain``: the export
#: treats every window as closed, so a 1-event run sends the event's tuples).
FIXED_COST_STEPS: tuple[tuple[str, Callable[[Context, bool], Any]], ...] = (
    ("silver events", lambda c, _: one_run.silver_events(c)),
    ("gold stage 1", lambda c, _: one_run.gold_partials(c)),
    ("gold stage 2", lambda c, _: one_run.gold_merge(c)),
    ("export to ClickHouse", lambda c, drain: one_run.export_property_values(c, drain=drain)),
)


#: The fewest 1-event runs the fixed costs take after their warm-up, at sizes above XS.
FIXED_COST_RUNS = 3


def fixed_costs(
    b: Bench, ctx: Context, w: Workload, passes_into: str = "pass_costs", repeats: int | None = None
) -> list[dict[str, Any]]:
    """What each event-path job costs on its own, once the session is up, on the lake a chain
    run left: on an empty increment (a no-op run) and on a 1-event increment (one new event
    landed, then each job in order; the export drains, so it sends the event's tuples). Median,
    min and max of ``repeats`` runs after a warm-up (None: the bench's).

    Beside them, into ``b.extra[passes_into]``: whole passes of every flow, as ``run all --once``
    runs them (no drain), empty and after 1 event landed, and after 1 event with queries run
    interpreted, per flow and in total, with the Spark jobs each flow ran (:func:`pass_costs`)."""
    noop: dict[str, list[float]] = {name: [] for name, _ in FIXED_COST_STEPS}
    one: dict[str, list[float]] = {name: [] for name, _ in FIXED_COST_STEPS}
    statuses: dict[str, set[tuple[str, str]]] = {name: set() for name, _ in FIXED_COST_STEPS}
    folder = b.out / "work" / "one-event"
    folder.mkdir(parents=True, exist_ok=True)

    def each_step(counted: bool, run: str, drain: bool, into: dict[str, list[float]]) -> None:
        for name, step in FIXED_COST_STEPS:
            t0 = time.perf_counter()
            record = step(ctx, drain)
            if counted:
                into[name].append(time.perf_counter() - t0)
                statuses[name].add((run, record.status))

    def land_one(name: str, attempt: int) -> None:
        event = {**w.first_events[attempt % len(w.first_events)], "uuid": str(uuid.uuid4())}
        path = folder / f"{name}-{attempt}.jsonl"
        path.write_text(json.dumps(event, default=str) + "\n")
        ingest.ingest_files(ctx, "events", [path])

    passes: dict[str, list[list[PassStep]]] = {"noop": [], "one_event": [], "one_event_interpreted": []}
    runs = b.repeats if repeats is None else repeats
    for attempt in range(runs + 1):
        # A whole pass of run all (every flow, as `run all --once` runs them) with nothing new: the
        # previous attempt's last pass left every flow up to date (the warm-up's may find work).
        noop_pass = timed_pass(ctx, f"noop-{attempt}")
        each_step(attempt > 0, "noop", False, noop)
        land_one("one", attempt)
        each_step(attempt > 0, "one_event", True, one)
        land_one("pass", attempt)
        one_pass = timed_pass(ctx, f"one-{attempt}")
        # The same pass with queries run interpreted (``spark.generated_code: false``).
        land_one("interpreted", attempt)
        with interpreted(ctx.spark):
            plain_pass = timed_pass(ctx, f"interpreted-{attempt}")
        if attempt > 0:
            passes["noop"].append(noop_pass)
            passes["one_event"].append(one_pass)
            passes["one_event_interpreted"].append(plain_pass)
    b.extra[passes_into] = pass_costs(passes)

    return [
        {
            "stage": name,
            "noop": summary(noop[name]),
            "one_event": summary(one[name]),
            # what each run reported, so a reader (and the smoke test) sees the runs did what they say
            "statuses": sorted(f"{run}: {status}" for run, status in statuses[name]),
            "runs": runs,
        }
        for name, _ in FIXED_COST_STEPS
    ]


def summary(seconds: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(seconds), 3),
        "min": round(min(seconds), 3),
        "max": round(max(seconds), 3),
    }


#: The last step of a timed pass: the event-log rows of its flows, written in one commit.
EVENT_LOG_STEP = "(event log)"
#: One flow of a timed pass: its name, seconds, status and the Spark jobs it ran (None: not known).
PassStep = tuple[str, float, str, int | None]


def timed_pass(ctx: Context, tag: str) -> list[PassStep]:
    """One pass of every runnable flow (``run all --once``), each flow timed as it ends, with the
    Spark jobs it ran (counted by a job group per flow on a classic session), then the pass's
    event-log commit (:data:`EVENT_LOG_STEP`), which comes after the last flow."""
    from pipelines.flows import runnable
    from pipelines.runtime.passes import run_pass

    flows = runnable()
    names = [f.name for f in flows] + [EVENT_LOG_STEP]
    sc = ctx.spark.sparkContext if hasattr(ctx.spark, "sparkContext") else None

    def group(i: int) -> str:
        name = f"bench-pass-{tag}-{names[i]}"
        if sc is not None:
            sc.setJobGroup(name, f"bench pass: {names[i]}")
        return name

    steps: list[PassStep] = []
    current, t0 = group(0), time.perf_counter()

    def step(i: int, status: str) -> None:
        nonlocal current, t0
        seconds = time.perf_counter() - t0
        spark_jobs = len(sc.statusTracker().getJobIdsForGroup(current)) if sc is not None else None
        steps.append((names[i], seconds, status, spark_jobs))
        if i + 1 < len(names):
            current = group(i + 1)
        t0 = time.perf_counter()

    try:
        for i, record in enumerate(run_pass(ctx, flows)):
            step(i, record.status)
        step(len(flows), "failed" if ctx.events.failed else "ok")
    finally:
        if sc is not None:
            sc.setJobGroup("bench", "bench")
    return steps


def pass_costs(passes: dict[str, list[list[PassStep]]]) -> dict[str, Any]:
    """Timed passes -> per flow and in total: seconds (median, min, max) of the empty and the
    1-event passes, the 1-event pass's Spark jobs (median) and what each run reported."""
    flows = [name for name, *_ in passes["one_event"][0]]
    rows = []
    for i, name in enumerate(flows):
        row: dict[str, Any] = {"flow": name}
        for kind, runs in passes.items():
            row[kind] = summary([run[i][1] for run in runs])
            row[f"{kind}_statuses"] = sorted({run[i][2] for run in runs})
        counted = [n for run in passes["one_event"] if (n := run[i][3]) is not None]
        row["spark_jobs"] = int(statistics.median(counted)) if counted else None
        rows.append(row)
    total: dict[str, Any] = {
        kind: summary([sum(step[1] for step in run) for run in runs]) for kind, runs in passes.items()
    }
    jobs_total = [row["spark_jobs"] for row in rows]
    total["spark_jobs"] = sum(jobs_total) if None not in jobs_total else None
    return {"flows": rows, "total": total}
