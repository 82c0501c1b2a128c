"""Seeded synthetic workloads for the benchmark, at sizes 10x apart.

Events are PostHog-style (Zipf teams, keys and values; person and group properties), page changes
carry duplicates and late arrivals, and remote-write bodies hold many series as a Prometheus
server would send them (snappy, a few samples per series per request).
"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines.demo.synthetic import (
    EventsSpec,
    PageChangesSpec,
    generate_events,
    generate_page_changes,
    generate_small_events,
    write_jsonl_batches,
)
from pipelines.sources.remote_write_series import Series, encode


@dataclass(frozen=True)
class Size:
    name: str
    events: int
    page_changes: int  # distinct changes before duplication
    series: int
    samples_per_series: int
    kafka_messages: int

    @property
    def rounds(self) -> int:
        """Files are written in rounds of 200,000 events' worth (8 event files, 10 page-change
        files), so a file holds about 13 MB at every size. The landing splits a file into records
        in one task: L's 2,000,000 events as 8 files of 125 MB ran it out of a 4 GB heap."""
        return -(-self.events // 200_000)


SIZES = {
    # A tenth of S: checks that every stage of the bench runs and writes its figures (the suite's
    # smoke test). Its figures are fixed costs, not throughput, and no scaling figure uses it.
    "XS": Size("XS", events=2_000, page_changes=600, series=200, samples_per_series=20, kafka_messages=1_000),
    "S": Size("S", events=20_000, page_changes=6_000, series=2_000, samples_per_series=20, kafka_messages=10_000),
    "M": Size("M", events=200_000, page_changes=60_000, series=20_000, samples_per_series=20, kafka_messages=100_000),
    "L": Size(
        "L", events=2_000_000, page_changes=600_000, series=200_000, samples_per_series=20, kafka_messages=1_000_000
    ),
}
#: The sizes whose figures are compared for scaling (XS is for checking the bench itself).
SCALED_SIZES = ("S", "M", "L")
PODS = (1, 4, 12)
SERIES_PER_REQUEST = 500
SAMPLES_PER_REQUEST_SERIES = 4  # samples of one series in one request, as Prometheus batches them


#: Events kept in memory for the one-event runs; the rest are generated again as files are written.
FIRST_EVENTS = 8


@dataclass
class Workload:
    """A size's input. The events are not held (2,000,000 at L would be gigabytes in the bench's
    own process, which is the driver whose memory it reports): the seeded generator writes them
    out again for each file layout asked for."""

    size: Size
    root: Path
    n_events: int
    first_events: list[dict]
    page_change_files: list[Path]
    remote_write_bodies: list[bytes]
    samples: int

    def chain_files(self) -> list[Path]:
        """The events the chain lands (small ones, :func:`generate_small_events`: held to the plain
        programs, :mod:`pipelines.dev.bench.plain`), as 8 pods' files per round (``Size.rounds``)."""
        pods = 8 * self.size.rounds
        folder = self.root / f"small-events-{pods}-pods"
        existing = sorted(folder.glob("*.jsonl"))
        if len(existing) == pods:
            return existing
        events = generate_small_events(events_spec(self.size))
        return write_jsonl_batches(events, folder, "events", pods, interleave=True)

    def event_files(self, pods: int) -> list[Path]:
        """The events as ``pods`` interleaved files: each pod's flush covers the whole time span."""
        folder = self.root / f"events-{pods}-pods"
        existing = sorted(folder.glob("*.jsonl"))
        if len(existing) == pods:
            return existing
        return write_jsonl_batches(generate_events(events_spec(self.size)), folder, "events", pods, interleave=True)


#: The two message sizes the Kafka stage is measured at.
KAFKA_MESSAGE_KINDS = ("PostHog fixture events", "4 KB properties")
PADDED_PROPERTIES_BYTES = 4096


def kafka_messages(kind: str, n: int) -> list[bytes]:
    """``n`` Kafka messages of ``kind``: the real PostHog fixture events cycled (each copy its own
    uuid), or those with ``properties`` padded to about 4 KB of JSON by a ``padding`` string."""
    from pipelines.demo.data import posthog_events

    base = list(posthog_events())
    out = []
    for i in range(n):
        event = dict(base[i % len(base)])
        event["uuid"] = str(uuid.UUID(int=(0x8000 << 48) | i, version=4))
        if kind == KAFKA_MESSAGE_KINDS[1]:
            props = dict(event.get("properties") or {})
            room = PADDED_PROPERTIES_BYTES - len(json.dumps(props, separators=(",", ":"), ensure_ascii=False))
            props["padding"] = "x" * max(0, room - len(',"padding":""'))
            event["properties"] = props
        out.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode())
    return out


def events_spec(size: Size) -> EventsSpec:
    return replace(EventsSpec(), events=size.events, span_seconds=max(600, size.events * 3600 * 3 // 200_000))


def page_changes_spec(size: Size) -> PageChangesSpec:
    base = PageChangesSpec()
    scale = size.page_changes / base.changes
    return replace(
        base,
        changes=size.page_changes,
        pages=max(100, int(base.pages * scale)),
        span_seconds=max(1800, int(base.span_seconds * scale)),
    )


RW_T0_MS = 1_717_200_000_000  # 2024-06-01: the remote-write samples' first timestamp
RW_STEP_MS = 15_000
#: The remote-write samples' metric names. A query counts each on its own: Prometheus refuses
#: ``count_over_time`` over several names at once ("vector cannot contain metrics with the same
#: labelset"), as the function drops the name and the other labels repeat across names.
RW_METRICS = tuple(f"node_metric_{i}_total" for i in range(50))


def node_labels(series: int) -> list[tuple[tuple[str, str], ...]]:
    """Label sets of ``series`` node-exporter-like series, each sorted by name as senders send them."""
    return [
        tuple(
            sorted(
                (
                    ("__name__", RW_METRICS[i % len(RW_METRICS)]),
                    ("instance", f"host-{i // 200}:9100"),
                    ("job", "node"),
                    # (i // 50) % 4, not i % 4: with 50 names, i % 4 would give series i and i + 100 one label set.
                    ("mode", ("idle", "user", "system", "iowait")[(i // len(RW_METRICS)) % 4]),
                )
            )
        )
        for i in range(series)
    ]


def remote_write_bodies(size: Size, seed: int = 11) -> tuple[list[bytes], int]:
    """Snappy bodies of ``SERIES_PER_REQUEST`` series x ``SAMPLES_PER_REQUEST_SERIES`` samples: each
    of the size's series' samples, a round of 4 at a time."""
    rng = random.Random(seed)
    labels = node_labels(size.series)
    rounds = size.samples_per_series // SAMPLES_PER_REQUEST_SERIES
    bodies = [body for r in range(rounds) for body in round_bodies(labels, r, rng)]
    return bodies, rounds * size.series * SAMPLES_PER_REQUEST_SERIES


def round_bodies(labels: list[tuple[tuple[str, str], ...]], r: int, rng: random.Random) -> list[bytes]:
    """Round ``r`` of the series of ``labels``: each one's next ``SAMPLES_PER_REQUEST_SERIES``
    samples, 15 s apart, ``SERIES_PER_REQUEST`` series to a snappy body."""
    first = r * SAMPLES_PER_REQUEST_SERIES
    ts = [RW_T0_MS + (first + k) * RW_STEP_MS for k in range(SAMPLES_PER_REQUEST_SERIES)]
    return [
        encode(
            [Series(lab, ts, [rng.random() * 1e6 for _ in ts]) for lab in labels[start : start + SERIES_PER_REQUEST]]
        )
        for start in range(0, len(labels), SERIES_PER_REQUEST)
    ]


#: Series of the steady-state remote-write workload: the same series send their next samples
#: round after round, as a fleet does once its targets are known (M: 1,000,000 samples a round).
STEADY_SERIES = {"XS": 2_000, "S": 25_000, "M": 250_000, "L": 250_000}
#: Its rounds: the first creates the series (a warm-up for the stores that index them), the rest
#: are timed, sent back to back.
STEADY_ROUNDS = 6


def steady_bodies(size: Size, seed: int = 13) -> list[list[bytes]]:
    """Per round, the bodies of every series of :data:`STEADY_SERIES` with its next samples."""
    rng = random.Random(seed)
    labels = node_labels(STEADY_SERIES[size.name])
    return [round_bodies(labels, r, rng) for r in range(STEADY_ROUNDS)]


def generate(size: Size, root: Path, remote_write: bool = True) -> Workload:
    """The size's workload; ``remote_write=False`` leaves the remote-write bodies out (runs that
    measure only the event path)."""
    root.mkdir(parents=True, exist_ok=True)
    first = list(itertools.islice(generate_events(events_spec(size)), FIRST_EVENTS))
    changes = generate_page_changes(page_changes_spec(size))
    page_files = write_jsonl_batches(changes, root / "page-changes", "page-changes", 10 * size.rounds)
    bodies, samples = remote_write_bodies(size) if remote_write else ([], 0)
    return Workload(size, root, size.events, first, page_files, bodies, samples)
