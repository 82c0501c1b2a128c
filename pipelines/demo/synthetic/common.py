"""What the generators share: their specs, seeded Zipf draws, a clock, ids."""

from __future__ import annotations

import bisect
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class EventsSpec:
    """Shape of a synthetic PostHog event stream."""

    events: int = 200_000
    teams: int = 300
    team_skew: float = 1.1  # Zipf exponent of team volume
    keys: int = 400  # property key vocabulary size
    values_per_key: int = 200
    value_skew: float = 1.2
    person_share: float = 0.08  # share of events that carry $set / $set_once
    group_share: float = 0.03  # share of events that are $groupidentify
    span_seconds: int = 3 * 3600  # event-time span
    start: datetime = datetime(2024, 6, 1, tzinfo=UTC)
    seed: int = 42


@dataclass(frozen=True)
class PageChangesSpec:
    """Shape of a synthetic ``mediawiki.page_change.v1`` stream."""

    pages: int = 4_000
    wikis: tuple[str, ...] = ("enwiki", "dewiki", "commonswiki", "testwikidatawiki")
    changes: int = 60_000  # distinct page-change events before duplication
    duplicate_rate: float = 0.15  # share of events sent twice (exact same JSON)
    out_of_order_rate: float = 0.2  # share of events delivered late (after later events)
    max_delay_seconds: int = 240  # how late an out-of-order event arrives, in event time
    delete_rate: float = 0.03
    span_seconds: int = 6 * 3600
    start: datetime = datetime(2024, 6, 1, tzinfo=UTC)
    seed: int = 7


# --------------------------------------------------------------------------------------------------
# Shared helpers


class _Zipf:
    """Draws 0-based ranks with P(rank k) proportional to 1 / (k + 1) ** exponent.

    Cumulative weights are built once so a draw is one ``random()`` and one bisect, which is what
    keeps 200k events with ~8 properties each well under the time budget.
    """

    __slots__ = ("_cum", "_last", "_total")

    def __init__(self, n: int, exponent: float) -> None:
        if n < 1:
            raise ValueError("a Zipf distribution needs at least one rank")
        cum: list[float] = []
        acc = 0.0
        for k in range(1, n + 1):
            acc += k**-exponent
            cum.append(acc)
        self._cum = cum
        self._total = acc
        self._last = n - 1

    def draw(self, rng: random.Random) -> int:
        # random() * total can round up to total itself; clamp rather than index past the end.
        return min(bisect.bisect_right(self._cum, rng.random() * self._total), self._last)


class _Clock:
    """ISO-8601 UTC text for offsets from a start time.

    Formatting a datetime per record is the slowest step of generation; offsets are dense, so the
    second-resolution prefix is cached and only the milliseconds are formatted per record.
    """

    __slots__ = ("_prefix", "_start")

    def __init__(self, start: datetime) -> None:
        # A naive start is taken as UTC rather than local time, so output never depends on the host.
        self._start = start.replace(tzinfo=UTC) if start.tzinfo is None else start.astimezone(UTC)
        self._prefix: dict[int, str] = {}

    def _second(self, second: int) -> str:
        text = self._prefix.get(second)
        if text is None:
            text = (self._start + timedelta(seconds=second)).strftime("%Y-%m-%dT%H:%M:%S")
            self._prefix[second] = text
        return text

    def millis(self, offset_ms: int) -> str:
        second, ms = divmod(offset_ms, 1000)
        return f"{self._second(second)}.{ms:03d}Z"

    def seconds(self, offset_s: int) -> str:
        return f"{self._second(offset_s)}Z"


def _uuid4(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _sha1_base36(rng: random.Random) -> str:
    # MediaWiki stores SHA-1s as 31 base-36 digits; only the look matters, not a real digest.
    return "".join(rng.choices(_BASE36, k=31))


def _check_share(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be within [0, 1], got {value}")
