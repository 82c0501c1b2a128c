"""PostHog-style product events, as ingested (see :mod:`pipelines.demo.synthetic`)."""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

from pipelines.demo.synthetic.common import EventsSpec, _check_share, _Clock, _uuid4, _Zipf

# --------------------------------------------------------------------------------------------------
# Events

# (name, weight). $groupidentify is left out: group_share decides those separately.
_EVENT_NAMES: tuple[tuple[str, int], ...] = (
    ("$pageview", 34),
    ("$autocapture", 25),
    ("$pageleave", 12),
    ("$feature_flag_called", 8),
    ("$web_vitals", 3),
    ("query completed", 3),
    ("$rageclick", 1),
    ("signed_up", 2),
    ("purchase", 2),
    ("$identify", 2),
    ("invite_sent", 1),
    ("subscription_started", 1),
)
_EVENT_NAME_LIST = tuple(name for name, _ in _EVENT_NAMES)
# Cumulative weights, so a weighted pick is one randrange and one bisect.
_EVENT_CUM_WEIGHTS = tuple(accumulate(weight for _, weight in _EVENT_NAMES))

_BROWSERS = ["Chrome", "Safari", "Firefox", "Edge", "Samsung Internet", "Chrome iOS", "Opera", "Firefox iOS"]
_PLANS = ["free", "pro", "team", "enterprise"]
_REFERRERS = [
    "$direct",
    "https://www.google.com/",
    "https://news.ycombinator.com/",
    "https://www.bing.com/",
    "https://t.co/",
    "https://www.linkedin.com/",
    "https://duckduckgo.com/",
]
_UTM_SOURCES = ["google", "newsletter", "twitter", "linkedin", "hn", "producthunt", "partner"]

# Realistic keys first, so Zipf puts them at the top ranks, as in real PostHog traffic. A list of
# values fixes the vocabulary; None means "generate values_per_key values of this kind".
_KNOWN_KEYS: tuple[tuple[str, str, list[Any] | None], ...] = (
    ("$browser", "str", _BROWSERS),
    ("$os", "str", ["Windows", "Mac OS X", "iOS", "Android", "Linux", "Chrome OS"]),
    ("$current_url", "url", None),
    ("$device_type", "str", ["Desktop", "Mobile", "Tablet"]),
    ("$lib", "str", ["web", "posthog-python", "posthog-node", "posthog-ios", "posthog-android"]),
    ("$host", "host", None),
    ("$pathname", "path", None),
    ("$browser_version", "int", list(range(100, 140))),
    ("$screen_width", "int", [360, 375, 390, 414, 768, 1024, 1280, 1366, 1440, 1536, 1920, 2560]),
    ("$referrer", "str", _REFERRERS),
    ("$lib_version", "str", [f"1.{minor}.{patch}" for minor in range(120, 135) for patch in range(3)]),
    ("$geoip_country_code", "str", ["US", "DE", "GB", "FR", "IN", "BR", "JP", "CA", "NL", "ES", "PL"]),
    # Non-ASCII values make sure byte lengths and text lengths are not confused downstream.
    ("$geoip_city_name", "str", ["New York", "München", "São Paulo", "Zürich", "東京", "London", "Kraków"]),
    ("$is_identified", "bool", [True, False]),
    ("plan", "str", _PLANS),
    ("utm_source", "str", _UTM_SOURCES),
    ("utm_medium", "str", ["cpc", "email", "social", "referral", "organic"]),
    ("price", "float", None),
    ("quantity", "int", list(range(1, 21))),
    ("$session_id", "id", None),
)
_GENERIC_KINDS = ("str", "int", "float", "bool")
_GENERIC_KIND_WEIGHTS = (70, 15, 10, 5)

# Share of property entries replaced by a value the fan-out must skip (null, nested, empty, too long).
_ODD_VALUE_SHARE = 0.01
_STRING_PROPERTIES_SHARE = 0.02  # events whose properties arrive as a JSON string
_STRAGGLER_SHARE = 0.01  # events whose timestamp lags by up to a minute
_JITTER_MS = 1_500
_STRAGGLER_MS = 60_000

_PERSON_SET_KEYS = ("email", "name", "plan", "company", "role")
_PERSON_SET_ONCE_KEYS = ("initial_referrer", "initial_utm_source", "initial_browser", "signup_date")
_COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries", "Wayne Enterprises"]
_ROLES = ["engineer", "designer", "pm", "founder", "analyst", "marketing"]

_GROUP_TYPES = (("project", 0), ("organization", 1), ("instance", 2))
_GROUP_SET_KEYS = ("name", "industry", "seats", "plan", "created_at")
_INDUSTRIES = ["saas", "fintech", "ecommerce", "healthcare", "education", "media", "gaming"]
_GROUPS_PER_TYPE = 25


def _key_values(name: str, kind: str, n: int, rng: random.Random) -> list[Any]:
    if kind == "str":
        return [f"{name.lstrip('$')}_{j}" for j in range(n)]
    if kind == "int":
        return [rng.randrange(0, 100_000) for _ in range(n)]
    if kind == "float":
        return [round(rng.uniform(0.5, 1_000.0), 2) for _ in range(n)]
    if kind == "bool":
        return [True, False]
    if kind == "url":
        return [f"https://app.example.com/{_path(j)}" for j in range(n)]
    if kind == "host":
        return [f"app{j}.example.com" if j else "app.example.com" for j in range(max(1, n // 10))]
    if kind == "path":
        return [f"/{_path(j)}" for j in range(n)]
    if kind == "id":
        return [_uuid4(rng) for _ in range(n)]
    raise ValueError(f"unknown value kind {kind!r}")


def _path(j: int) -> str:
    sections = ("dashboard", "insights", "settings", "project", "billing", "docs", "events", "persons")
    return f"{sections[j % len(sections)]}/{j}" if j >= len(sections) else sections[j]


class _EventVocabulary:
    """Property keys, per-key value lists and their Zipf samplers, built once per spec."""

    def __init__(self, spec: EventsSpec, rng: random.Random) -> None:
        names: list[str] = []
        values: list[list[Any]] = []
        for name, kind, fixed in _KNOWN_KEYS[: spec.keys]:
            names.append(name)
            values.append(fixed if fixed is not None else _key_values(name, kind, spec.values_per_key, rng))
        for i in range(len(names), spec.keys):
            kind = rng.choices(_GENERIC_KINDS, weights=_GENERIC_KIND_WEIGHTS)[0]
            name = f"prop_{i}"
            names.append(name)
            values.append(_key_values(name, kind, spec.values_per_key, rng))
        self.names = names
        self.values = values
        self.key_zipf = _Zipf(len(names), 1.0)
        # Many keys share a vocabulary length; share their samplers too.
        by_length: dict[int, _Zipf] = {}
        for v in values:
            if len(v) not in by_length:
                by_length[len(v)] = _Zipf(len(v), spec.value_skew)
        self.value_zipfs = [by_length[len(v)] for v in values]

    def properties(self, n: int, rng: random.Random) -> dict[str, Any]:
        n = min(n, len(self.names))
        props: dict[str, Any] = {}
        attempts = 0
        while len(props) < n and attempts < 8 * n:
            attempts += 1
            k = self.key_zipf.draw(rng)
            name = self.names[k]
            if name not in props:
                props[name] = self.value(k, rng)
        # A tiny or very skewed vocabulary can stall the draws; top up from the most common keys.
        k = 0
        while len(props) < n:
            if self.names[k] not in props:
                props[self.names[k]] = self.value(k, rng)
            k += 1
        return props

    def value(self, k: int, rng: random.Random) -> Any:
        if rng.random() < _ODD_VALUE_SHARE:
            return _odd_value(rng)
        return self.values[k][self.value_zipfs[k].draw(rng)]


def _odd_value(rng: random.Random) -> Any:
    pick = rng.randrange(5)
    if pick == 0:
        return None
    if pick == 1:
        return {"id": rng.randrange(1_000), "tags": ["a", "b"]}
    if pick == 2:
        return [rng.randrange(10) for _ in range(rng.randint(0, 3))]
    if pick == 3:
        return ""
    return "x" * rng.randint(256, 600)  # longer than the fan-out's 255-character value limit


def _person_value(key: str, user: int, rng: random.Random) -> Any:
    if key == "email":
        return f"user{user}@example.com"
    if key == "name":
        return f"User {user}"
    if key == "plan":
        return rng.choice(_PLANS)
    if key == "company":
        return rng.choice(_COMPANIES)
    if key == "role":
        return rng.choice(_ROLES)
    if key == "initial_referrer":
        return rng.choice(_REFERRERS)
    if key == "initial_utm_source":
        return rng.choice(_UTM_SOURCES)
    if key == "initial_browser":
        return rng.choice(_BROWSERS)
    return f"2024-0{rng.randint(1, 5)}-{rng.randint(10, 28)}"  # signup_date


def _person_entries(keys: Sequence[str], user: int, rng: random.Random) -> dict[str, Any]:
    return {key: _person_value(key, user, rng) for key in rng.sample(keys, rng.randint(1, 3))}


def _group_value(key: str, group_type: str, group: int, rng: random.Random) -> Any:
    if key == "name":
        return f"{group_type.title()} {group}"
    if key == "industry":
        return rng.choice(_INDUSTRIES)
    if key == "seats":
        return rng.randint(1, 500)
    if key == "plan":
        return rng.choice(_PLANS)
    return f"2023-{rng.randint(10, 12)}-{rng.randint(10, 28)}"  # created_at


def _check_spec(spec: EventsSpec) -> None:
    if spec.events < 0 or spec.teams < 1 or spec.keys < 1 or spec.values_per_key < 1:
        raise ValueError("events must be >= 0 and teams, keys and values_per_key >= 1")
    if spec.span_seconds < 1:
        raise ValueError("span_seconds must be >= 1")
    _check_share("person_share", spec.person_share)
    _check_share("group_share", spec.group_share)
    if spec.person_share + spec.group_share > 1.0:
        raise ValueError("person_share + group_share must not exceed 1")


class _Population:
    """Teams and users with their Zipf samplers, built once per spec."""

    __slots__ = ("distinct_ids", "team_ids", "team_zipf", "user_zipf")

    def __init__(self, spec: EventsSpec, rng: random.Random) -> None:
        # Shuffle rank -> team id so the busiest team is not always team 1.
        self.team_ids = list(range(1, spec.teams + 1))
        rng.shuffle(self.team_ids)
        self.team_zipf = _Zipf(spec.teams, spec.team_skew)
        users = max(100, spec.events // 10)
        self.user_zipf = _Zipf(users, 1.0)
        self.distinct_ids = [_uuid4(rng) for _ in range(users)]

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """A team id and a user rank (an index into ``distinct_ids``), team first."""
        team_id = self.team_ids[self.team_zipf.draw(rng)]
        return team_id, self.user_zipf.draw(rng)


def _event_offset(even_ms: int, span_ms: int, rng: random.Random) -> int:
    """An event's time in ms after the start: its evenly spaced slot ``even_ms``, jittered, and for a
    few stragglers up to a minute earlier, so timestamps are only roughly in order; clamped to the span."""
    offset = even_ms + rng.randint(-_JITTER_MS, _JITTER_MS)
    if rng.random() < _STRAGGLER_SHARE:
        offset -= rng.randint(0, _STRAGGLER_MS)
    return min(max(offset, 0), span_ms - 1)


def _group_identify_properties(vocab: _EventVocabulary, team_id: int, rng: random.Random) -> dict[str, Any]:
    """Properties of a ``$groupidentify`` event: a few ordinary ones plus the group and what it sets."""
    group_type, index = _GROUP_TYPES[rng.randrange(len(_GROUP_TYPES))]
    group = rng.randrange(_GROUPS_PER_TYPE)
    props = vocab.properties(rng.randint(1, 3), rng)
    props["$group_type"] = group_type
    props["$group_type_index"] = index
    props["$group_key"] = f"{group_type}:{team_id}:{group}"
    props["$group_set"] = {
        key: _group_value(key, group_type, group, rng) for key in rng.sample(_GROUP_SET_KEYS, rng.randint(1, 3))
    }
    return props


def _add_person_properties(props: dict[str, Any], user: int, rng: random.Random) -> None:
    # Both kinds, alone and together, so person merges see $set_once next to $set.
    which = rng.random()
    if which < 0.8:
        props["$set"] = _person_entries(_PERSON_SET_KEYS, user, rng)
    if which >= 0.45:
        props["$set_once"] = _person_entries(_PERSON_SET_ONCE_KEYS, user, rng)


def _name_and_properties(
    vocab: _EventVocabulary, team_id: int, user: int, group_cut: float, person_cut: float, rng: random.Random
) -> tuple[str, dict[str, Any]]:
    """One draw below ``group_cut`` makes a ``$groupidentify``; otherwise a weighted product event,
    which below ``person_cut`` also carries person properties."""
    kind = rng.random()
    if kind < group_cut:
        return "$groupidentify", _group_identify_properties(vocab, team_id, rng)
    name = _EVENT_NAME_LIST[bisect.bisect_right(_EVENT_CUM_WEIGHTS, rng.randrange(_EVENT_CUM_WEIGHTS[-1]))]
    props = vocab.properties(rng.randint(3, 12), rng)
    if kind < person_cut:
        _add_person_properties(props, user, rng)
    return name, props


def generate_events(spec: EventsSpec) -> Iterator[dict[str, Any]]:
    """Yields ``spec.events`` PostHog-style events in (roughly) timestamp order.

    Each event has ``uuid``, ``event``, ``team_id``, ``distinct_id``, ``timestamp`` (ISO-8601, "Z")
    and ``properties`` (an object, or for ~2% of events the JSON text of one).
    """
    _check_spec(spec)
    # One rng, drawn from in a fixed order (vocabulary, population, then per event: uuid, team,
    # user, time, name and properties, string form): that order is what makes the output reproducible.
    rng = random.Random(spec.seed)
    vocab = _EventVocabulary(spec, rng)
    population = _Population(spec, rng)
    clock = _Clock(spec.start)
    span_ms = spec.span_seconds * 1000
    step_ms = span_ms / max(spec.events, 1)
    group_cut = spec.group_share
    person_cut = spec.group_share + spec.person_share

    for i in range(spec.events):
        event_uuid = _uuid4(rng)
        team_id, user = population.draw(rng)
        offset = _event_offset(int(i * step_ms), span_ms, rng)
        name, props = _name_and_properties(vocab, team_id, user, group_cut, person_cut, rng)
        properties: dict[str, Any] | str = props
        if rng.random() < _STRING_PROPERTIES_SHARE:
            properties = json.dumps(props, separators=(",", ":"), ensure_ascii=False)
        yield {
            "uuid": event_uuid,
            "event": name,
            "team_id": team_id,
            "distinct_id": population.distinct_ids[user],
            "timestamp": clock.millis(offset),
            "properties": properties,
        }
