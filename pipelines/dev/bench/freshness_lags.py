"""Freshness under load, measured: what the producer sent, what arrived in ClickHouse and when
(the export log and outbox, read as the run goes), and the lag arithmetic over them: each event's
lag from its produce time to the export batch that brought it in, its quantiles per minute, and
whether a rate was held. See :mod:`pipelines.dev.bench.freshness` for the run itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: The property every produced event carries: what the export outbox and ClickHouse are read for.
PROBE = "bench_probe"


@dataclass
class Produced:
    """What the producer sent: (produce time, events) per tick, the measured ones apart."""

    ticks: list[tuple[float, int]] = field(default_factory=list)
    measured_until: float = float("inf")
    start: float = 0.0

    @property
    def measured(self) -> list[tuple[float, int]]:
        return [(t, n) for t, n in self.ticks if self.start <= t < self.measured_until]


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
