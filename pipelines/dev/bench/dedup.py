"""What deduplication by event identity costs: silver.events with it on and off, at each size.

Each size's workload lands in bronze in two halves. Silver takes the first half (not timed), so
the timed run of the second half checks its events against a silver that already holds some: the
steady state of a pipeline that runs every few minutes. Every run starts from a copy of that lake;
the variants alternate (off, on, off, on, ...) after one warm-up of each, and each run's wall and
CPU seconds (the driver's and the JVM's) are kept: this machine is shared, and CPU seconds vary
less than wall time when other work runs beside the bench.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.dev.bench.measure import own_cpu_seconds
from pipelines.dev.bench.workloads import SIZES, generate
from pipelines.runtime import ingest, passes
from pipelines.runtime.runner import Context
from pipelines.storage import open_store

VARIANTS = {"off": "0", "on": "24h"}


def _cpu_seconds(spark: SparkSession) -> float:
    """CPU seconds used so far by this process and by the JVM Spark runs in (local mode)."""
    own = time.process_time()
    pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
    return own if pid == os.getpid() else own + own_cpu_seconds(pid)


def _context(spark: SparkSession, lake: Path, horizon: str) -> Context:
    settings = load_settings(lake_root=str(lake), silver={"dedup_horizon": horizon}, quality={"enabled": True})
    return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)


#: One event in this many of each half is sent again in the timed half: a client's retry of an
#: event silver holds already (from the first half), or of one in the same batch.
RESENT_EVERY = 100


def _resent(first: Sequence[Path], second: Sequence[Path], out: Path) -> Path:
    """A file of events sent again: every RESENT_EVERY-th line of each half's files."""

    def every(files: Sequence[Path], offset: int) -> list[str]:
        lines = (line for f in files for line in f.read_text().splitlines() if line.strip())
        return [line for i, line in enumerate(lines) if i % RESENT_EVERY == offset]

    out.write_text("\n".join(every(first, 0) + every(second, RESENT_EVERY // 2)) + "\n")
    return out


def _template(spark: SparkSession, size: str, work: Path) -> tuple[Path, int]:
    """A lake whose silver holds the first half of the size's events and whose bronze holds the
    second half too (with 1 in RESENT_EVERY events of each half sent again), not yet in silver;
    and how many events that second half is."""
    w = generate(SIZES[size], work / f"data-{size}", remote_write=False)
    files = w.chain_files()
    half = len(files) // 2
    lake = work / f"template-{size}"
    shutil.rmtree(lake, ignore_errors=True)
    ctx = _context(spark, lake, VARIANTS["on"])
    ingest.ingest_files(ctx, "events", files[:half])
    passes.silver_events(ctx)
    resent = _resent(files[:half], files[half:], work / f"resent-{size}.jsonl")
    second = ingest.ingest_files(ctx, "events", [*files[half:], resent])
    return lake, second.rows_out


def _one_run(spark: SparkSession, template: Path, lake: Path, horizon: str) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, repeats dropped) of silver.events over the pending half."""
    shutil.rmtree(lake, ignore_errors=True)
    shutil.copytree(template, lake)
    ctx = _context(spark, lake, horizon)
    cpu0, t0 = _cpu_seconds(spark), time.perf_counter()
    record = passes.silver_events(ctx)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds(spark) - cpu0
    shutil.rmtree(lake, ignore_errors=True)
    return wall, cpu, record.metrics.get("duplicates_dropped", 0.0)


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"min": round(min(values), 2), "median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def run_dedup(
    sizes: Sequence[str], out: Path, spark: SparkSession, repeats: int = 3, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Silver events with deduplication on and off at ``sizes``; writes dedup.md, dedup.json and
    dedup.png under ``out`` and returns the figures."""
    out = out.resolve()
    work = out / "work"
    t0 = time.perf_counter()
    rows = []
    for size in sizes:
        say(f"dedup {size}: landing the workload (silver holds the first half)")
        template, events = _template(spark, size, work)
        runs: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        for i in range(repeats + 1):  # the first round warms up
            for variant, horizon in VARIANTS.items():
                timing = _one_run(spark, template, work / f"run-{size}", horizon)
                if i:
                    runs[variant].append(timing)
            say(f"  {size}: {'warm-up' if not i else f'run {i}/{repeats}'} done")
        shutil.rmtree(template, ignore_errors=True)
        wall = {v: [r[0] for r in rs] for v, rs in runs.items()}
        cpu = {v: [r[1] for r in rs] for v, rs in runs.items()}
        rows.append(
            {
                "size": size,
                "events": events,
                "wall_seconds": {v: _spread(s) for v, s in wall.items()},
                "cpu_seconds": {v: _spread(s) for v, s in cpu.items()},
                "ratio_wall": round(statistics.median(wall["on"]) / statistics.median(wall["off"]), 3),
                "ratio_cpu": round(statistics.median(cpu["on"]) / statistics.median(cpu["off"]), 3),
                "repeats_dropped": runs["on"][0][2] if runs["on"] else 0,
            }
        )
    result = {"repeats": repeats, "sizes": rows, "wall_seconds": round(time.perf_counter() - t0, 1)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "dedup.json").write_text(json.dumps(result, indent=2))
    (out / "dedup.md").write_text(markdown(result))
    chart(result, out / "dedup.png")
    shutil.rmtree(work, ignore_errors=True)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Silver events: deduplication by event identity on and off",
        "",
        f"silver.events over the second half of each size's events, silver holding the first half, with "
        f"1 in {RESENT_EVERY} events of each half sent again; {result['repeats']} runs of each variant after a "
        "warm-up, alternating. Seconds are min / median / max; CPU seconds are the driver's and the JVM's.",
        "",
        "| size | events | repeats dropped | off: wall s | on: wall s | off: CPU s | on: CPU s "
        "| on/off (wall) | on/off (CPU) |",
        "|---|---:|---:|---|---|---|---|---:|---:|",
    ]

    def s(d: dict[str, float]) -> str:
        return f"{d['min']} / {d['median']} / {d['max']}"

    for r in result["sizes"]:
        lines.append(
            f"| {r['size']} | {r['events']:,} | {int(r['repeats_dropped']):,} "
            f"| {s(r['wall_seconds']['off'])} | {s(r['wall_seconds']['on'])} "
            f"| {s(r['cpu_seconds']['off'])} | {s(r['cpu_seconds']['on'])} | {r['ratio_wall']}x | {r['ratio_cpu']}x |"
        )
    return "\n".join(lines) + "\n"


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["size"] for r in result["sizes"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(sizes, [r["ratio_cpu"] for r in result["sizes"]], marker="o", label="on / off, CPU seconds")
    ax.plot(sizes, [r["ratio_wall"] for r in result["sizes"]], marker="s", label="on / off, wall seconds")
    ax.axhline(1.3, color="grey", linestyle="--", linewidth=1, label="goal at M: 1.3x")
    ax.set_xlabel("size")
    ax.set_ylabel("cost of deduplication (x)")
    ax.set_title("silver.events: deduplication on vs off")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
