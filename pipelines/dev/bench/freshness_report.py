"""Freshness under load, reported: the Markdown table and the chart of lag by minute, per rate
(``freshness.md`` and ``freshness.png`` beside ``freshness.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def secs(v: float | None) -> str:
    """Seconds as the report shows them: one decimal, ``-`` for none."""
    return "-" if v is None else f"{v:,.1f}"


def markdown(result: dict[str, Any]) -> str:
    goal = result["rates"][0]["goal_p99_s"] if result["rates"] else None
    top = result["highest_rate_held"]
    lines = [
        f"## Freshness under load: Kafka at a fixed rate for {result['minutes']:g} min, "
        "beside `ingest kafka` and `run all`",
        "",
        "Lag: from an event's produce time to the end of the export batch that brought it into ClickHouse. "
        f"Goal: p99 at most the window plus grace plus two run intervals ({secs(goal)} s). "
        f"Highest rate held (every event arrived, the lag did not grow): "
        f"**{'none of those run' if top is None else f'{top:,} events/s'}**.",
        "",
        "| rate /s | achieved /s | events | p50 lag s | p99 lag s | max s | lag growth s | not arrived | "
        "ClickHouse = produced | held |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["rates"]:
        lines.append(
            f"| {r['rate']:,} | {r['achieved_rate']:,} | {r['measured_events']:,} | {secs(r['p50_s'])} | "
            f"{secs(r['p99_s'])} | {secs(r['max_s'])} | {secs(r['lag_growth_s'])} | {r['missing_events']:,} | "
            f"{'yes' if r['clickhouse_matches'] else 'NO'} | {'yes' if r['held'] else 'no'} |"
        )
    for r in result["rates"]:
        lines += passes_markdown(r)
    return "\n".join(lines) + "\n"


def passes_markdown(r: dict[str, Any]) -> list[str]:
    """Where a rate's ``run all`` passes spent their time, per job (none recorded: nothing)."""
    costs = r.get("pass_costs")
    if not costs or not costs["passes"]:
        return []
    lines = [
        "",
        f"### Where a `run all` pass's time went at {r['rate']:,} events/s",
        "",
        f"{costs['passes']} passes after the producer started, each {secs(costs['p50_s'])} s (median), "
        f"{secs(costs['max_s'])} s at most, against a run interval of {secs(r.get('interval_s'))} s. "
        f"Between jobs (the runner's own work): {costs['between']:.0%} of the passes' time.",
        "",
        "| job | runs | rows in | median s | max s | share of pass time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for j in costs["jobs"]:
        cells = (j["job"], f"{j['runs']:,}", f"{j['rows_in']:,}", f"{j['p50_s']:.2f}", f"{j['max_s']:.2f}")
        lines.append("| " + " | ".join(cells) + f" | {j['share']:.0%} |")
    return lines


def chart(result: dict[str, Any], path: Path) -> None:
    from pipelines.app.plotting import pyplot

    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in result["rates"]:
        rows = r["per_minute"]
        minute = [m["minute"] for m in rows]
        # The lags of events that never arrived are not in the points: the legend says how many.
        lost = f", {r['missing_events']:,} never arrived" if r["missing_events"] else ""
        (line,) = ax.plot(minute, [m["p99_s"] for m in rows], marker="o", label=f"{r['rate']:,}/s p99{lost}")
        ax.plot(
            minute,
            [m["p50_s"] for m in rows],
            linestyle=":",
            color=line.get_color(),
            label=f"{r['rate']:,}/s p50",
        )
    if result["rates"]:
        ax.axhline(result["rates"][0]["goal_p99_s"], color="grey", linestyle="--", label="goal (p99)")
    ax.set_xlabel("minute the events were produced in")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("lag to ClickHouse, s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title("Freshness: produce time to ClickHouse, by rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
