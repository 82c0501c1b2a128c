"""The benchmark's Markdown table and PNG charts."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def machine(spark: SparkSession) -> dict[str, Any]:
    mem_gb = None
    try:
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem_gb = round(mem_kb / 1024 / 1024, 1)
    except (OSError, StopIteration):
        pass
    cpu = platform.processor() or ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": mem_gb,
        "python": platform.python_version(),
        "spark": spark.version,
        "os": platform.platform(),
    }


def _n(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:,.{digits or 2}f}"


#: The event path's stages beside the plain program, with the least ratio each is held to (the
#: landing within 3x of a plain bronze write, gold within 2x, the export within 5x of a bulk insert,
#: the chain at half the plain program's rate, warm and cold).
EVENT_PATH_GOALS = (
    ("files -> bronze (events)", 1 / 3),
    ("silver events", None),
    ("gold (stage 1 + 2)", 1 / 2),
    ("export to ClickHouse", 1 / 5),
    ("end to end (events)", 1 / 2),
    ("cold chain (events)", 1 / 2),
)


def event_path_table(result: dict[str, Any]) -> list[str]:
    """The event path's stages beside their plain-program peers: each median, the ratio of the two
    rates and the least it is held to (no line when the run measured none of them)."""
    by_name = {s["stage"]: s for s in result["stages"]}
    rows = []
    for stage, goal in EVENT_PATH_GOALS:
        ours = by_name.get(stage)
        peer = next((p for p in (ours or {}).get("peers", []) if p["label"] == "plain Spark"), None)
        if ours is None or peer is None or ours["median_seconds"] is None:
            continue
        theirs = by_name.get(peer["stage"], {})
        ratio = peer.get("ratio")
        held = "" if goal is None or ratio is None else ("met" if ratio >= goal else "not met")
        rows.append(
            f"| {stage} | {_n(ours['median_seconds'], 2)} | {_n(theirs.get('median_seconds'), 2)} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | {'-' if goal is None else f'{goal:.2f}x'} {held} |"
        )
    if not rows:
        return []
    return [
        "## The event path beside the plain program",
        "",
        "Median seconds of the stage and of its plain-Spark peer in this run; the ratio is the stage's rate",
        "over the peer's (1.00x: as fast), beside the least it is held to.",
        "",
        "| stage | ours, s | plain, s | ratio | held to |",
        "|---|---:|---:|---:|---|",
        *rows,
        "",
    ]


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    w = result["workload"]
    lines = [
        f"# medallion bench, size {result['size']}" + (f", {result['only']} stages only" if result.get("only") else ""),
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gb']} GiB, Python {m['python']}, Spark {m['spark']}.",
        f"Workload: {w['events']:,} events, {w['page_changes_landed']:,} page changes landed "
        f"({w['page_changes_distinct']:,} distinct), {w['remote_write_samples']:,} remote-write samples in "
        f"{w['remote_write_requests']:,} requests, {w['kafka_messages']:,} Kafka messages. "
        f"Median of {result['repeats']} runs after a warm-up (min-max); wall time {result['wall_seconds']:,} s.",
        "",
        "| stage | median /s | min-max /s | median s | peak RSS MB (driver / JVM / other) | vs peers |",
        "|---|---:|---:|---:|---|---|",
    ]
    for s in result["stages"]:
        if s["median_per_s"] is None:
            lines.append(f"| {s['stage']} | - | - | - | - | {s['note'] or ''} |")
            continue
        rss = s["peak_rss_mb"] or {"driver": None, "jvm": None}
        other = ", ".join(f"{k} {v:,.0f}" for k, v in rss.items() if k not in ("driver", "jvm"))
        mem = " / ".join(_n(rss.get(k)) for k in ("driver", "jvm")) + (f" / {other}" if other else "")
        ratio = "; ".join(f"{p['ratio']:.2f}x of {p['label']}" for p in s["peers"] if p["ratio"])
        lines.append(
            f"| {s['stage']} | {_n(s['median_per_s'])} {s['unit']} | {_n(s['min_per_s'])}-{_n(s['max_per_s'])} | "
            f"{_n(s['median_seconds'])} | {mem} | {ratio} |"
        )
    notes = [f"- {s['stage']}: {s['note']}" for s in result["stages"] if s.get("note")]
    lines += ["", *event_path_table(result), *notes]
    if "spark_jobs" in result:
        from pipelines.dev.bench import sparklog

        if result["spark_jobs"] is None:
            lines += ["", "Spark's jobs per stage: not recorded (the session wrote no local, uncompressed event log)."]
        lines += sparklog.markdown(result["spark_jobs"] or {})
    if result.get("fixed_costs"):
        lines += [
            "",
            f"## Per-run fixed costs (session up, lake of a chain run at {result['size']}; "
            f"median of {result['fixed_costs'][0].get('runs', result['repeats'])} runs after a warm-up)",
            "",
            "| job | no-op run, s (min-max) | 1-event run, s (min-max) |",
            "|---|---:|---:|",
        ]
        for r in result["fixed_costs"]:
            n, o = r["noop"], r["one_event"]
            lines.append(
                f"| {r['stage']} | {n['median']:.2f} ({n['min']:.2f}-{n['max']:.2f}) "
                f"| {o['median']:.2f} ({o['min']:.2f}-{o['max']:.2f}) |"
            )
    for key, lake in (("pass_costs", result["size"]), ("pass_costs_small", "S")):
        if result.get(key):
            lines += ["", *pass_costs_markdown(result[key], lake)]
    if result.get("fixed_costs_small"):
        big = {r["stage"]: r for r in result["fixed_costs"]}
        lines += [
            "",
            f"## Per-run fixed costs on an S lake and on an {result['size']} lake (medians, s)",
            "",
            f"| job | no-op at S | no-op at {result['size']} | 1 event at S | 1 event at {result['size']} "
            f"| 1 event, {result['size']} / S |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for small in result["fixed_costs_small"]:
            at_size = big.get(small["stage"])
            if at_size is None:
                continue
            one, one_big = small["one_event"]["median"], at_size["one_event"]["median"]
            lines.append(
                f"| {small['stage']} | {small['noop']['median']:.2f} | {at_size['noop']['median']:.2f} "
                f"| {one:.2f} | {one_big:.2f} | {_n(one_big / one if one else None)}x |"
            )
    if result.get("backfill"):
        from pipelines.dev.bench.backfills import markdown as backfill_markdown

        lines += ["", *backfill_markdown(result)]
    if result.get("freshness"):
        from pipelines.dev.bench.freshness_report import markdown as freshness_markdown

        lines += ["", freshness_markdown(result["freshness"]).rstrip()]
    if result.get("reduction"):
        lines += ["", "## Records per event: single-stage vs two-stage", ""]
        lines += ["| pods | single-stage records/event | two-stage records/event |", "|---:|---:|---:|"]
        for r in result["reduction"]:
            lines.append(f"| {r['pods']} | {r['single_stage_per_event']:.3f} | {r['two_stage_per_event']:.3f} |")
    if result.get("dedup"):
        lines += ["", "## Page changes pruned by dedup, per window", "", "| window (min) | tumbling | staggered |"]
        lines.append("|---:|---:|---:|")
        by_window: dict[float, dict[str, float]] = {}
        for d in result["dedup"]:
            by_window.setdefault(d["window_minutes"], {})[d["mode"]] = d["pruned_percent"]
        for win, modes in sorted(by_window.items()):
            lines.append(f"| {win:g} | {modes.get('tumbling', 0):.2f}% | {modes.get('staggered', 0):.2f}% |")
    if result.get("scaling"):
        lines += scaling_tables(result["scaling"])
    if result.get("buffer"):
        lines += [
            "",
            "## Page-change buffer as input arrives",
            "",
            "| input events | buffered events | open windows | state rows |",
        ]
        lines.append("|---:|---:|---:|---:|")
        for r in result["buffer"]:
            lines.append(
                f"| {r['input_events']:,} | {r['buffered_events']:,} | {r['open_windows']:,} | {r['state_rows']:,} |"
            )
    return "\n".join(lines) + "\n"


def scaling_tables(scaling: dict[str, Any]) -> list[str]:
    """Seconds, events/s and peak memory (driver / JVM) per stage at each size."""
    sizes = scaling["sizes"]
    seconds = scaling["seconds"]
    rss = scaling.get("peak_rss_mb", {})
    stage_names = list(next(iter(seconds.values())).keys())
    head = "| stage | " + " | ".join(f"{n} ({sizes[n]:,} events)" for n in sizes) + " |"
    rule = "|---|" + "---:|" * len(sizes)
    lines = ["", "## Scaling: seconds per stage", "", head, rule]
    for st in stage_names:
        lines.append(f"| {st} | " + " | ".join(_n(seconds[n].get(st)) for n in sizes) + " |")
    lines += ["", "## Scaling: events per second along the event path (the size's events over the stage's time)"]
    lines += ["", head, rule]
    for st in scaling.get("event_path", []):
        rates = [sizes[n] / seconds[n][st] if seconds[n].get(st) else None for n in sizes]
        lines.append(f"| {st} | " + " | ".join(_n(r) for r in rates) + " |")
    if rss:
        lines += ["", "## Scaling: peak RSS MB per stage (driver / JVM)", "", head, rule]
        for st in stage_names:
            cells = []
            for n in sizes:
                mem = rss.get(n, {}).get(st) or {}
                cells.append(f"{_n(mem.get('driver'))} / {_n(mem.get('jvm'))}")
            lines.append(f"| {st} | " + " | ".join(cells) + " |")
    return lines


def ratios(ax: Any, result: dict[str, Any]) -> None:
    """Each stage's rate over each of its peers' (``0.80x of plain Spark``), 1 marked: faster to its right."""
    pairs = [
        (f"{s['stage']} vs {p['label']}", p["ratio"], p["label"] == "plain Spark")
        for s in result["stages"]
        for p in s["peers"]
        if p["ratio"]
    ]
    y = range(len(pairs))
    ax.barh(list(y), [r for _, r, _ in pairs], color=["#4c72b0" if plain else "#dd8452" for *_, plain in pairs])
    ax.set_yticks(list(y), [name for name, _, _ in pairs], fontsize=8)
    for i, (_, r, _) in enumerate(pairs):
        ax.annotate(f"{r:.2f}x", (r, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.axvline(1, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(right=max([1.5, *(r * 1.5 for _, r, _ in pairs)]))  # room for the 1x line and the labels
    ax.set_title("stage rate / peer rate (log; blue: plain Spark)")
    ax.invert_yaxis()


def charts(result: dict[str, Any], out: Path) -> list[Path]:
    from pipelines.app.plotting import pyplot

    plt = pyplot()

    paths = []
    # Stage names are long: the two per-stage charts get whole rows, the other three share one
    # (a run of the ingest stages alone has only the first two).
    chain = "reduction" in result
    fig = plt.figure(figsize=(15, 17 if chain else 11))
    grid = fig.add_gridspec(3 if chain else 2, 3, height_ratios=[1.6, 1.1, 1] if chain else [1.2, 1])
    ours = [s for s in result["stages"] if s["median_per_s"]]
    ax = fig.add_subplot(grid[0, :])
    ax.barh([s["stage"] for s in ours], [s["median_per_s"] for s in ours], color="#4c72b0")
    ax.set_xscale("log")
    ax.set_title("throughput per stage (units/s, log)")
    ax.tick_params(axis="y", labelsize=8)
    ax.invert_yaxis()
    ratios(fig.add_subplot(grid[1, :]), result)
    if chain:
        chain_charts(fig, grid, result)
    only = f", {result['only']} stages only" if result.get("only") else ""
    fig.suptitle(f"medallion bench, size {result['size']}{only}")
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # leave the suptitle its own line
    paths.append(out / "bench.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    sizes = result.get("scaling", {}).get("sizes", {})
    if len(sizes) > 1:
        fig, ax = plt.subplots(figsize=(8, 5))
        stage_names = list(next(iter(result["scaling"]["seconds"].values())).keys())
        for st in stage_names:
            ax.plot(
                [sizes[n] for n in sizes],
                [result["scaling"]["seconds"][n].get(st) for n in sizes],
                marker="o",
                label=st,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("events")
        ax.set_ylabel("seconds")
        ax.set_title("time per stage by input size")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "scaling.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def chain_charts(fig: Any, grid: Any, result: dict[str, Any]) -> None:
    """The chain's three small charts: records per event by pods, dedup by window, the buffer."""
    ax = fig.add_subplot(grid[2, 0])
    reduction = result.get("reduction", [])
    pods = [str(r["pods"]) for r in reduction]
    x = range(len(pods))
    ax.bar([i - 0.2 for i in x], [r["single_stage_per_event"] for r in reduction], 0.4, label="single-stage")
    ax.bar([i + 0.2 for i in x], [r["two_stage_per_event"] for r in reduction], 0.4, label="two-stage")
    ax.set_xticks(list(x), [f"{p} pods" for p in pods])
    ax.set_title("records written per event")
    ax.legend()
    ax = fig.add_subplot(grid[2, 1])
    for mode in ("tumbling", "staggered"):
        pts = sorted((d["window_minutes"], d["pruned_percent"]) for d in result.get("dedup", []) if d["mode"] == mode)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
    ax.set_xlabel("window (minutes)")
    ax.set_ylabel("% of page changes pruned")
    ax.set_title("dedup by window length")
    ax.legend()
    ax = fig.add_subplot(grid[2, 2])
    buf = result.get("buffer", [])
    ax.plot([r["input_events"] for r in buf], [r["buffered_events"] for r in buf], marker="o", label="buffered events")
    ax.plot([r["input_events"] for r in buf], [r["state_rows"] for r in buf], marker="o", label="state rows")
    ax.set_xlabel("page changes received")
    ax.set_title("silver page-change buffer")
    ax.legend()


def write(result: dict[str, Any], out: Path) -> list[Path]:
    """A bench run's ``result`` as ``bench.json``, ``bench.md`` and its charts in ``out``."""
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "bench.md").write_text(markdown(result))
    return [out / "bench.md", out / "bench.json", *charts(result, out)]


def pass_costs_markdown(costs: dict[str, Any], lake: str) -> list[str]:
    """A pass of run all, empty and with 1 event: per flow and in total (``pass_costs``)."""
    lines = [
        f"## A pass of run all (session up, {lake} lake): empty, and with 1 event landed",
        "",
        "| flow | empty pass, s (min-max) | 1-event pass, s (min-max) | 1 event, interpreted, s (min-max) "
        "| Spark jobs (1 event) |",
        "|---|---:|---:|---:|---:|",
    ]

    def cell(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    for row in [*costs["flows"], {"flow": "**total**", **costs["total"]}]:
        jobs = row.get("spark_jobs")
        lines.append(
            f"| {row['flow']} | {cell(row['noop'])} | {cell(row['one_event'])} "
            f"| {cell(row['one_event_interpreted'])} | {'' if jobs is None else jobs} |"
        )
    return lines
