"""Measuring: repeated timings with median / min / max, and peak memory per process.

Memory is sampled from ``/proc`` (resident set size) every 50 ms while a stage runs: this process
(the Python driver), its JVM child (Spark) and any other process named, such as the broker.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.dev.bench.workloads import Size
    from pipelines.runtime.runner import Context


@dataclass
class Figure:
    """Throughput of one stage over several runs (``per_second`` = units / seconds of each run)."""

    stage: str
    unit: str
    units: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    #: label -> stage name of a peer figure: what this stage is compared with (``0.80x of <label>``)
    peers: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    #: Each timed run's start and end, seconds since the epoch: what Spark's event log ran then
    #: was the run's (:mod:`pipelines.dev.bench.sparklog`).
    windows: list[tuple[float, float]] = field(default_factory=list)

    def record(self, seconds: float, units: float, peak_rss_mb: dict[str, float]) -> None:
        """One run: its time, its units and the peak memory of each process it watched."""
        self.seconds.append(round(seconds, 3))
        self.units.append(float(units))
        for name, mb in peak_rss_mb.items():
            self.peak_rss_mb[name] = max(self.peak_rss_mb.get(name, 0.0), mb)

    @property
    def rates(self) -> list[float]:
        return [u / s for u, s in zip(self.units, self.seconds, strict=True) if s > 0]

    def as_dict(self) -> dict:
        rates = self.rates
        return {
            "stage": self.stage,
            "unit": self.unit,
            "runs": len(rates),
            "median_per_s": statistics.median(rates) if rates else None,
            "min_per_s": min(rates) if rates else None,
            "max_per_s": max(rates) if rates else None,
            "median_seconds": statistics.median(self.seconds) if self.seconds else None,
            "units": self.units,
            "seconds": self.seconds,
            "peak_rss_mb": self.peak_rss_mb,
            "peers": [{"label": label, "stage": stage} for label, stage in self.peers.items()],
            "note": self.note,
        }


def as_dicts(figures: Mapping[str, Figure]) -> list[dict]:
    """Every figure as a dict, each of its peers with ``ratio``: the stage's median rate over the peer's.

    A ratio needs both figures, so it is computed here rather than by ``Figure.as_dict``.
    """
    out = [f.as_dict() for f in figures.values()]
    medians = {d["stage"]: d["median_per_s"] for d in out}
    for d in out:
        for p in d["peers"]:
            ours, theirs = d["median_per_s"], medians.get(p["stage"])
            p["ratio"] = ours / theirs if ours and theirs else None
    return out


def warm_up_first(fig: Figure, attempt: int) -> Figure:
    """Where run ``attempt`` is recorded: the first run of each stage is a warm-up, thrown away."""
    return fig if attempt > 0 else Figure("warm-up", fig.unit)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """The resident memory (MB) of ``pid`` and the processes it started (a command's workers)."""
    return rss_mb(pid) + sum(tree_rss_mb(child) for child in children(pid))


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def own_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) used so far by ``pid`` itself; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) used so far by ``pid`` and the processes it started."""
    return own_cpu_seconds(pid) + sum(cpu_seconds(child) for child in children(pid))


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM every process still running (each finishes the step under way), then wait for
    them all, killing one that outlives ``timeout``."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return str(pid)


def jvm_mb(pid: int) -> float:
    """The resident memory (MB) of ``pid``'s JVM (its children named ``java``: Spark's driver)."""
    return sum(rss_mb(c) for c in children(pid) if process_name(c) == "java")


class Sampler:
    """Calls :meth:`_sample` on entry, every ``interval`` seconds on a thread of its own, and on exit."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Self:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sample()


class MemorySampler(Sampler):
    """Peak RSS (MB) per process: ``driver`` (this one), ``jvm`` and named extra processes (each with
    the processes it started)."""

    def __init__(self, extra: dict[str, int] | None = None, interval: float = 0.05) -> None:
        self.pid = os.getpid()
        self.extra = extra or {}
        self.peak: dict[str, float] = {}
        super().__init__(interval, "rss-sampler")

    def _sample(self) -> None:
        seen = {"driver": rss_mb(self.pid)}
        for child in children(self.pid):
            if process_name(child) == "java":
                seen["jvm"] = seen.get("jvm", 0.0) + rss_mb(child)
        for name, pid in self.extra.items():
            seen[name] = tree_rss_mb(pid)
        for name, mb in seen.items():
            self.peak[name] = max(self.peak.get(name, 0.0), round(mb, 1))


def cpu_jiffies() -> tuple[int, int] | None:
    """All CPUs' (busy, busy + idle) clock ticks so far, from ``/proc/stat`` (None without it).
    Busy is user, nice, system, irq and softirq time; idle counts I/O wait; time the hypervisor
    stole is in neither, as no process here could have used it."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq = (int(x) for x in first[1:8])
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


class MachineLoad(Sampler):
    """How busy the machine's CPUs were over a window of wall-clock time: ``/proc/stat`` sampled
    every ``interval`` seconds, so a stage can say whether a second process had a core to use."""

    def __init__(self, interval: float = 0.25) -> None:
        self.samples: list[tuple[float, int, int]] = []
        super().__init__(interval, "cpu-sampler")

    def _sample(self) -> None:
        ticks = cpu_jiffies()
        if ticks is not None:
            self.samples.append((time.time(), *ticks))

    def busy(self, start: float, end: float) -> float | None:
        """The share of all CPUs' time that was busy between ``start`` and ``end`` (``time.time()``
        values), from the first and last samples inside; None if fewer than two fall inside."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])


def machine_busy(shares: list[float | None]) -> str:
    """``; the machine's N CPUs X% busy meanwhile (median)``, or nothing where it was not measured:
    how much of the machine a stage left for a second process to use."""
    known = [s for s in shares if s is not None]
    if not known:
        return ""
    return f"; the machine's {os.cpu_count()} CPUs {statistics.median(known):.0%} busy meanwhile (median)"


@contextmanager
def timed(figure: Figure, units: float | Callable[[], float], extra: dict[str, int] | None = None) -> Iterator[None]:
    """Time the block as one run of ``figure``; ``units`` may be computed after the block."""
    with MemorySampler(extra) as mem:
        t0, started = time.perf_counter(), time.time()
        yield
        elapsed = time.perf_counter() - t0
    figure.windows.append((started, started + elapsed))
    figure.record(elapsed, units() if callable(units) else units, mem.peak)


@dataclass
class Bench:
    """One benchmark run: its size, where results go, the session, and the figures so far."""

    size: Size
    out: Path
    spark: SparkSession
    repeats: int
    say: Callable[[str], None]
    figures: dict[str, Figure] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    _runs: int = 0

    @property
    def clickhouse_dsn(self) -> str:
        return f"chdb://{self.out / 'work' / 'clickhouse'}"

    def context(self, tag: str, quality: bool = True, **overrides: Any) -> Context:
        """A fresh lake and ClickHouse database; ``quality=False`` for runs that count rows, not time."""
        from pipelines.config.settings import load_settings
        from pipelines.runtime.runner import Context
        from pipelines.storage import open_store

        self._runs += 1
        lake = self.out / "work" / f"{tag}-{self._runs}"
        shutil.rmtree(lake, ignore_errors=True)
        settings = load_settings(
            lake_root=str(lake),
            clickhouse={"dsn": self.clickhouse_dsn, "database": f"bench_{tag}_{self._runs}".replace("-", "_")},
            quality={"enabled": quality},
            **overrides,
        )
        return Context(settings=settings, spark=self.spark, store=open_store(settings, self.spark), say=lambda _: None)

    @property
    def warm_ups(self) -> int:
        """Warm-up runs before a stage's timed runs: none at XS, whose figures are fixed costs
        that no ratio or goal reads (it checks the bench itself), else one."""
        return 0 if self.size.name == "XS" else 1

    def attempts(self) -> range:
        """A stage's runs, each numbered as ``warm_up_first`` reads it (0: the warm-up)."""
        return range(1 - self.warm_ups, self.repeats + 1)

    def figure(self, stage: str, unit: str, **kw: Any) -> Figure:
        return self.figures.setdefault(stage, Figure(stage, unit, **kw))
