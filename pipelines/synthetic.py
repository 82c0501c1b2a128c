"""Seeded synthetic input for the demo and the benchmark: PostHog-style events and MediaWiki page changes.

The public fixture sets are tiny (88 events, one page's history), so they cannot show what the
pipeline is for. This module makes inputs of any size that do:

- ``generate_events`` yields product events "as ingested". Team volume is Zipf-skewed so that a few
  teams dominate (bucketing and the per-team fan-out must cope with that), property keys and values
  are Zipf-skewed so the gold counts have heavy hitters and a long tail, and a small share of values
  are nulls, nested objects, arrays, empty or over-long strings so every fan-out skip rule fires.
  Some events carry ``$set``/``$set_once`` person properties or are ``$groupidentify`` events, and a
  few carry ``properties`` as a JSON string, as the capture format allows.
- ``generate_page_changes`` yields ``mediawiki.page_change.v1`` events in *arrival* order: mostly by
  event time, but some arrive late and some twice, and busy pages get several changes within a few
  minutes, which is what the silver reordering and windowed dedup exist for.

Everything is drawn from a ``random.Random`` seeded by the spec, never from global random state, the
clock or set iteration order, so the same spec always gives the same records and the same bytes.
"""

from __future__ import annotations

import bisect
import json
import random
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "EventsSpec",
    "PageChangesSpec",
    "generate_events",
    "generate_page_changes",
    "write_jsonl_batches",
]


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


def generate_events(spec: EventsSpec) -> Iterator[dict[str, Any]]:
    """Yields ``spec.events`` PostHog-style events in (roughly) timestamp order.

    Each event has ``uuid``, ``event``, ``team_id``, ``distinct_id``, ``timestamp`` (ISO-8601, "Z")
    and ``properties`` (an object, or for ~2% of events the JSON text of one).
    """
    if spec.events < 0 or spec.teams < 1 or spec.keys < 1 or spec.values_per_key < 1:
        raise ValueError("events must be >= 0 and teams, keys and values_per_key >= 1")
    if spec.span_seconds < 1:
        raise ValueError("span_seconds must be >= 1")
    _check_share("person_share", spec.person_share)
    _check_share("group_share", spec.group_share)
    if spec.person_share + spec.group_share > 1.0:
        raise ValueError("person_share + group_share must not exceed 1")

    rng = random.Random(spec.seed)
    vocab = _EventVocabulary(spec, rng)
    # Shuffle rank -> team id so the busiest team is not always team 1.
    team_ids = list(range(1, spec.teams + 1))
    rng.shuffle(team_ids)
    team_zipf = _Zipf(spec.teams, spec.team_skew)
    users = max(100, spec.events // 10)
    user_zipf = _Zipf(users, 1.0)
    distinct_ids = [_uuid4(rng) for _ in range(users)]
    event_names = [name for name, _ in _EVENT_NAMES]
    event_cum: list[int] = []
    for _, weight in _EVENT_NAMES:
        event_cum.append((event_cum[-1] if event_cum else 0) + weight)
    clock = _Clock(spec.start)
    span_ms = spec.span_seconds * 1000
    step_ms = span_ms / max(spec.events, 1)
    group_cut = spec.group_share
    person_cut = spec.group_share + spec.person_share

    for i in range(spec.events):
        event_uuid = _uuid4(rng)
        team_id = team_ids[team_zipf.draw(rng)]
        user = user_zipf.draw(rng)
        offset = int(i * step_ms) + rng.randint(-_JITTER_MS, _JITTER_MS)
        if rng.random() < _STRAGGLER_SHARE:
            offset -= rng.randint(0, _STRAGGLER_MS)
        offset = min(max(offset, 0), span_ms - 1)

        kind = rng.random()
        if kind < group_cut:
            name = "$groupidentify"
            group_type, index = _GROUP_TYPES[rng.randrange(len(_GROUP_TYPES))]
            group = rng.randrange(_GROUPS_PER_TYPE)
            props = vocab.properties(rng.randint(1, 3), rng)
            props["$group_type"] = group_type
            props["$group_type_index"] = index
            props["$group_key"] = f"{group_type}:{team_id}:{group}"
            props["$group_set"] = {
                key: _group_value(key, group_type, group, rng) for key in rng.sample(_GROUP_SET_KEYS, rng.randint(1, 3))
            }
        else:
            name = event_names[bisect.bisect_right(event_cum, rng.randrange(event_cum[-1]))]
            props = vocab.properties(rng.randint(3, 12), rng)
            if kind < person_cut:
                # Both kinds, alone and together, so person merges see $set_once next to $set.
                which = rng.random()
                if which < 0.8:
                    props["$set"] = _person_entries(_PERSON_SET_KEYS, user, rng)
                if which >= 0.45:
                    props["$set_once"] = _person_entries(_PERSON_SET_ONCE_KEYS, user, rng)

        properties: dict[str, Any] | str = props
        if rng.random() < _STRING_PROPERTIES_SHARE:
            properties = json.dumps(props, separators=(",", ":"), ensure_ascii=False)
        yield {
            "uuid": event_uuid,
            "event": name,
            "team_id": team_id,
            "distinct_id": distinct_ids[user],
            "timestamp": clock.millis(offset),
            "properties": properties,
        }


# --------------------------------------------------------------------------------------------------
# Page changes

_PAGE_SKEW = 0.9  # Zipf exponent of page activity
_BURST_SHARE = 0.4  # share of a page's follow-up changes that come right after the previous one
_BURST_MEAN_SECONDS = 60.0
_VISIBILITY_RATE = 0.01
_MOVE_RATE = 0.01
_MINOR_EDIT_RATE = 0.3
_EDITORS = 500
_BOT_SHARE = 0.05

_KNOWN_DOMAINS = {
    "enwiki": "en.wikipedia.org",
    "dewiki": "de.wikipedia.org",
    "commonswiki": "commons.wikimedia.org",
    "wikidatawiki": "www.wikidata.org",
    "testwikidatawiki": "test.wikidata.org",
}
_TITLE_WORDS = (
    "River", "Castle", "Theorem", "Festival", "Railway", "Garden", "Museum", "Bridge", "Island",
    "Orchestra", "Valley", "Library", "Comet", "Harbour", "Treaty", "Lighthouse", "Forest", "Quartet",
)  # fmt: skip
_EDIT_SUMMARIES = (
    "copyedit",
    "fix typo",
    "Added reference",
    "Updated infobox",
    "clean up",
    "/* History */ expand section",
    "",
)


def _domain(wiki: str) -> str:
    if wiki in _KNOWN_DOMAINS:
        return _KNOWN_DOMAINS[wiki]
    stem = wiki.removesuffix("wiki")
    return f"{stem}.wikipedia.org"


def _is_wikibase(wiki: str) -> bool:
    return wiki.endswith("wikidatawiki")


@dataclass(frozen=True, slots=True)
class _Editor:
    user_text: str
    user_id: int
    groups: tuple[str, ...]
    is_bot: bool
    registration_dt: str
    edit_count: int

    def as_json(self) -> dict[str, Any]:
        return {
            "user_text": self.user_text,
            "groups": list(self.groups),
            "is_bot": self.is_bot,
            "is_system": False,
            "is_temp": False,
            "user_id": self.user_id,
            "registration_dt": self.registration_dt,
            "edit_count": self.edit_count,
        }


@dataclass(frozen=True, slots=True)
class _Revision:
    """One revision as the events that mention it see it; frozen because a duplicate must rebuild the
    very same JSON after later changes (say a visibility change) have moved the page on."""

    rev_id: int
    rev_dt: str
    is_minor_edit: bool
    rev_sha1: str
    rev_size: int
    rev_parent_id: int | None
    comment: str
    editor: _Editor
    origin_rev_id: int
    is_comment_visible: bool = True

    def as_json(self, wiki: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rev_id": self.rev_id,
            "rev_dt": self.rev_dt,
            "is_minor_edit": self.is_minor_edit,
            "rev_sha1": self.rev_sha1,
            "rev_size": self.rev_size,
        }
        if self.rev_parent_id is not None:
            out["rev_parent_id"] = self.rev_parent_id
        if self.is_comment_visible:
            out["comment"] = self.comment
        wikibase = _is_wikibase(wiki)
        out["editor"] = self.editor.as_json()
        out["is_content_visible"] = True
        out["is_editor_visible"] = True
        out["is_comment_visible"] = self.is_comment_visible
        out["content_slots"] = {
            "main": {
                "slot_role": "main",
                "content_model": "wikibase-item" if wikibase else "wikitext",
                "content_sha1": self.rev_sha1,
                "content_size": self.rev_size,
                "content_format": "application/json" if wikibase else "text/x-wiki",
                "origin_rev_id": self.origin_rev_id,
            }
        }
        return out


@dataclass(frozen=True, slots=True)
class _Change:
    """Everything needed to rebuild one page-change event's JSON, identically, as often as needed."""

    offset: int  # event time, seconds after the start
    kind: str
    wiki: str
    page_id: int
    title: str
    revision: _Revision
    performer: _Editor
    meta_id: str
    request_id: str
    prior_revision: _Revision | None = None
    prior_title: str | None = None
    comment: str | None = None
    revision_count: int | None = None


_CHANGELOG_KIND = {
    "create": "insert",
    "undelete": "insert",
    "delete": "delete",
    "edit": "update",
    "move": "update",
    "visibility_change": "update",
}


def _page_change_json(change: _Change, clock: _Clock) -> dict[str, Any]:
    dt = clock.seconds(change.offset)
    domain = _domain(change.wiki)
    page: dict[str, Any] = {
        "page_id": change.page_id,
        "page_title": change.title,
        "namespace_id": 0,
        "is_redirect": False,
    }
    if change.revision_count is not None:
        page["revision_count"] = change.revision_count
    out: dict[str, Any] = {
        "changelog_kind": _CHANGELOG_KIND[change.kind],
        "page_change_kind": change.kind,
        "dt": dt,
        "wiki_id": change.wiki,
        "page": page,
        "performer": change.performer.as_json(),
    }
    if change.comment is not None:
        out["comment"] = change.comment
    out["revision"] = change.revision.as_json(change.wiki)
    if change.kind == "visibility_change":
        out["prior_state"] = {"revision": {"is_comment_visible": True}}
    elif change.prior_revision is not None:
        prior: dict[str, Any] = {"revision": change.prior_revision.as_json(change.wiki)}
        if change.prior_title is not None:
            prior = {"page": {"page_title": change.prior_title, "namespace_id": 0}, **prior}
        out["prior_state"] = prior
    out["$schema"] = "/mediawiki/page/change/1.2.0"
    out["meta"] = {
        "stream": "mediawiki.page_change.v1",
        "uri": f"https://{domain}/wiki/{change.title}",
        "id": change.meta_id,
        "request_id": change.request_id,
        "domain": domain,
        "dt": dt,
    }
    return out


def _editors(rng: random.Random, clock: _Clock) -> list[_Editor]:
    editors: list[_Editor] = []
    for n in range(_EDITORS):
        bot = rng.random() < _BOT_SHARE
        groups = ("bot", "*", "user", "autoconfirmed") if bot else ("*", "user", "autoconfirmed")
        if not bot and rng.random() < 0.05:
            groups = ("sysop", *groups)
        # Registration years before the stream starts: negative offsets from its start.
        registered = clock.seconds(-rng.randrange(30 * 86_400, 15 * 365 * 86_400))
        editors.append(
            _Editor(
                user_text=f"SyncBot{n}" if bot else f"Editor{n}",
                user_id=rng.randrange(1, 50_000_000),
                groups=groups,
                is_bot=bot,
                registration_dt=registered,
                edit_count=rng.randrange(1, 2_000_000),
            )
        )
    return editors


def _page_counts(spec: PageChangesSpec, rng: random.Random) -> list[int]:
    """Changes per page (Zipf), each capped at one per second of the span so a page's changes can
    all have distinct event times."""
    counts = [0] * spec.pages
    zipf = _Zipf(spec.pages, _PAGE_SKEW)
    for _ in range(spec.changes):
        counts[zipf.draw(rng)] += 1
    spill = 0
    for p in range(spec.pages):
        counts[p] += spill
        spill = max(0, counts[p] - spec.span_seconds)
        counts[p] -= spill
    return counts


def _page_times(count: int, span: int, rng: random.Random) -> list[int]:
    """``count`` strictly increasing event times (whole seconds in ``[0, span)``) for one page, with
    bursts of changes a minute or so apart so that short dedup windows catch several of them."""
    times = sorted(rng.randrange(span) for _ in range(count))
    for i in range(1, count):
        if rng.random() < _BURST_SHARE:
            times[i] = times[i - 1] + 1 + int(rng.expovariate(1.0 / _BURST_MEAN_SECONDS))
    times.sort()
    for i in range(1, count):
        if times[i] <= times[i - 1]:
            times[i] = times[i - 1] + 1
    high = span - 1
    for i in range(count - 1, -1, -1):
        times[i] = min(times[i], high)
        high = times[i] - 1
    return times


@dataclass
class _PageState:
    wiki: str
    page_id: int
    base_title: str
    title: str
    count: int
    revision: _Revision | None = None
    revisions: int = 0
    moves: int = 0
    deleted: bool = False


def _distinct_changes(spec: PageChangesSpec, rng: random.Random, clock: _Clock) -> list[_Change]:
    """All distinct changes, in event-time order."""
    editors = _editors(rng, clock)
    editor_zipf = _Zipf(len(editors), 1.1)
    counts = _page_counts(spec, rng)

    next_page_id = {wiki: 1_000 + rng.randrange(100_000) for wiki in spec.wikis}
    pages: list[_PageState] = []
    for p in range(spec.pages):
        wiki = spec.wikis[rng.randrange(len(spec.wikis))]
        page_id = next_page_id[wiki]
        next_page_id[wiki] += rng.randint(1, 40)
        if _is_wikibase(wiki):
            title = f"Q{page_id + 200_000}"
        else:
            a, b = rng.sample(_TITLE_WORDS, 2)
            title = f"{a}_{b}_{page_id}"
        pages.append(_PageState(wiki=wiki, page_id=page_id, base_title=title, title=title, count=counts[p]))

    timeline: list[tuple[int, int, int]] = []  # (event time, page, sequence number within the page)
    for p, state in enumerate(pages):
        for seq, t in enumerate(_page_times(state.count, spec.span_seconds, rng)):
            timeline.append((t, p, seq))
    timeline.sort()

    # Rev ids are handed out in event-time order, so they increase per wiki and per page.
    next_rev_id = {wiki: 500_000 + rng.randrange(1_000_000) for wiki in spec.wikis}
    changes: list[_Change] = []
    for t, p, seq in timeline:
        state = pages[p]
        performer = editors[editor_zipf.draw(rng)]
        current = state.revision
        more_to_come = seq < state.count - 1
        kind = "edit"
        if current is None:
            kind = "create"
        elif state.deleted:
            kind = "undelete"
        else:
            r = rng.random()
            if r < spec.delete_rate:
                # A delete that is the page's last change would never be undone; make it an edit.
                kind = "delete" if more_to_come else "edit"
            elif r < spec.delete_rate + _VISIBILITY_RATE:
                kind = "visibility_change"
            elif r < spec.delete_rate + _VISIBILITY_RATE + _MOVE_RATE:
                kind = "move"

        prior_revision: _Revision | None = None
        prior_title: str | None = None
        comment: str | None = None
        revision_count: int | None = None
        dt = clock.seconds(t)
        if kind in ("create", "edit", "move"):
            rev_id = next_rev_id[state.wiki]
            next_rev_id[state.wiki] += 1
            if kind == "move":
                assert current is not None
                prior_title = state.title
                state.moves += 1
                state.title = f"{state.base_title}_({state.moves})"
                # A move adds a null revision: new id, same content.
                revision = _Revision(
                    rev_id=rev_id,
                    rev_dt=dt,
                    is_minor_edit=True,
                    rev_sha1=current.rev_sha1,
                    rev_size=current.rev_size,
                    rev_parent_id=current.rev_id,
                    comment=f"{performer.user_text} moved page [[{prior_title}]] to [[{state.title}]]",
                    editor=performer,
                    origin_rev_id=current.origin_rev_id,
                )
            else:
                if current is None:
                    size = rng.randint(200, 5_000)
                else:
                    size = max(50, current.rev_size + rng.randint(-300, 600))
                if _is_wikibase(state.wiki):
                    text = (
                        f"/* wbeditentity-create:2|en */ {state.title}"
                        if current is None
                        else f"/* wbsetclaim-update:2||1 */ [[Property:P{rng.randint(1, 900)}]]"
                    )
                else:
                    text = "Created page" if current is None else rng.choice(_EDIT_SUMMARIES)
                revision = _Revision(
                    rev_id=rev_id,
                    rev_dt=dt,
                    is_minor_edit=current is not None and rng.random() < _MINOR_EDIT_RATE,
                    rev_sha1=_sha1_base36(rng),
                    rev_size=size,
                    rev_parent_id=None if current is None else current.rev_id,
                    comment=text,
                    editor=performer,
                    origin_rev_id=rev_id,
                )
            prior_revision = current
            state.revisions += 1
            state.revision = revision
        else:
            assert current is not None
            revision = current
            if kind == "delete":
                state.deleted = True
                comment = "Deleting page: housekeeping"
                revision_count = state.revisions
            elif kind == "undelete":
                state.deleted = False
                comment = ""
            else:  # visibility_change: the comment of the current revision gets hidden
                revision = replace(current, is_comment_visible=False)
                state.revision = revision
        changes.append(
            _Change(
                offset=t,
                kind=kind,
                wiki=state.wiki,
                page_id=state.page_id,
                title=state.title,
                revision=revision,
                performer=performer,
                meta_id=_uuid4(rng),
                request_id=_uuid4(rng),
                prior_revision=prior_revision,
                prior_title=prior_title,
                comment=comment,
                revision_count=revision_count,
            )
        )
    return changes


def generate_page_changes(spec: PageChangesSpec) -> Iterator[dict[str, Any]]:
    """Yields ``mediawiki.page_change.v1`` events in arrival order.

    ``spec.changes`` distinct events, plus ``round(changes * duplicate_rate)`` exact repeats. Each
    page starts with a ``create``; its rev ids grow with event time. ``round(changes *
    out_of_order_rate)`` events arrive late, after events up to ``max_delay_seconds`` newer, and a
    repeat arrives after its original, also no more than ``max_delay_seconds`` after its event
    time. So no event ever arrives more than ``max_delay_seconds`` behind the newest one before it.
    """
    if spec.pages < 1 or not spec.wikis:
        raise ValueError("pages must be >= 1 and wikis must not be empty")
    if spec.changes < 0 or spec.span_seconds < 1 or spec.max_delay_seconds < 0:
        raise ValueError("changes and max_delay_seconds must be >= 0 and span_seconds >= 1")
    if spec.changes > spec.pages * spec.span_seconds:
        raise ValueError("more changes than pages * span_seconds: a page gets at most one change a second")
    _check_share("duplicate_rate", spec.duplicate_rate)
    _check_share("out_of_order_rate", spec.out_of_order_rate)
    if not 0.0 <= spec.delete_rate <= 1.0 - _VISIBILITY_RATE - _MOVE_RATE:
        raise ValueError(f"delete_rate must be within [0, {1.0 - _VISIBILITY_RATE - _MOVE_RATE}]")

    rng = random.Random(spec.seed)
    clock = _Clock(spec.start)
    changes = _distinct_changes(spec, rng, clock)
    n = len(changes)
    max_delay = float(spec.max_delay_seconds)

    late = bytearray(n)
    for i in rng.sample(range(n), round(n * spec.out_of_order_rate)):
        late[i] = 1
    repeated = bytearray(n)
    for i in rng.sample(range(n), round(n * spec.duplicate_rate)):
        repeated[i] = 1

    # Arrival key = event time + delay, never more than max_delay: whatever arrives before an event
    # has a key (hence an event time) at most max_delay past that event's time.
    arrivals: list[tuple[float, int, int]] = []  # (arrival key, change, 0 original | 1 repeat)
    for i, change in enumerate(changes):
        delay = rng.uniform(1.0, max_delay) if late[i] and max_delay >= 1.0 else 0.0
        arrivals.append((change.offset + delay, i, 0))
        if repeated[i]:
            arrivals.append((change.offset + rng.uniform(delay, max_delay), i, 1))
    arrivals.sort()

    for _, i, _ in arrivals:
        yield _page_change_json(changes[i], clock)


# --------------------------------------------------------------------------------------------------
# Files


def write_jsonl_batches(
    records: Iterable[dict[str, Any]], directory: Path, prefix: str, batches: int, interleave: bool = False
) -> list[Path]:
    """Writes ``records`` as ``batches`` JSON Lines files ``{prefix}-{i:03d}.jsonl`` under
    ``directory`` and returns their paths.

    By default each file is a contiguous slice, in order; sizes differ by at most one line
    (earlier files get the extra lines). With ``interleave`` record ``i`` goes to file
    ``i % batches``, as when several pods consume one stream at once: every file then covers the
    whole time span. A file may be empty when there are fewer records than batches.
    """
    if batches < 1:
        raise ValueError("batches must be >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    if interleave:  # record i to file i % batches: written as the records come, none kept
        files = [directory / f"{prefix}-{b:03d}.jsonl" for b in range(batches)]
        with ExitStack() as stack:
            # Bytes, not text mode, so no platform newline translation can change the output.
            outs = [stack.enter_context(path.open("wb")) for path in files]
            for i, r in enumerate(records):
                outs[i % batches].write(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        return files
    # Split sizes need the total; serialized lines are far smaller than the dicts they come from.
    lines = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in records]
    size, extra = divmod(len(lines), batches)
    paths: list[Path] = []
    start = 0
    for b in range(batches):
        end = start + size + (1 if b < extra else 0)
        chunk = lines[start:end]
        path = directory / f"{prefix}-{b:03d}.jsonl"
        # Bytes, not text mode, so no platform newline translation can change the output.
        path.write_bytes("".join(f"{line}\n" for line in chunk).encode("utf-8"))
        paths.append(path)
        start = end
    return paths
