"""Small product events, as a new user's first export holds them: a few flat properties each.

``generate_small_events`` yields events of about 330 bytes: 4 to 8 event properties drawn from a
small vocabulary (strings, integers and booleans), two person properties, teams Zipf-skewed, in
time order. Nothing in them needs a rule beyond the plain question (no ``$set``, no group, no
nested, null, empty or over-long value, no number written two ways), so a plain program that
explodes the two property maps and counts them gives the pipeline's gold rows: the bench's event
path is held to such a program (:mod:`pipelines.dev.bench.plain`).

Drawn from a ``random.Random`` seeded by the spec, so the same spec gives the same bytes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from pipelines.demo.synthetic.common import EventsSpec, _uuid4, _Zipf

_NAMES = ("$pageview", "$autocapture", "clicked_button", "signed_up", "purchase")
#: Each key and the values it takes (strings, integers, booleans).
_VALUES: dict[str, tuple[Any, ...]] = {
    "$browser": ("Chrome", "Firefox", "Safari", "Edge"),
    "$os": ("Mac OS X", "Windows", "Linux", "iOS", "Android"),
    "$device_type": ("Desktop", "Mobile", "Tablet"),
    "$pathname": tuple(f"/p/{i}" for i in range(40)),
    "$referring_domain": ("$direct", "google.com", "news.ycombinator.com", "t.co"),
    "plan": ("free", "pro", "team", "enterprise"),
    "button": ("buy", "signup", "close", "next", "back"),
    "utm_source": ("google", "twitter", "newsletter", "partner"),
    "locale": ("en-US", "de-DE", "fr-FR", "es-ES", "ja-JP"),
    "$screen_width": (1280, 1440, 1536, 1920, 390, 414),
    "items": tuple(range(1, 13)),
    "is_new": (True, False),
}
_PERSON: dict[str, tuple[Any, ...]] = {"domain": ("example.com", "example.org"), "tier": ("a", "b", "c")}


def generate_small_events(spec: EventsSpec) -> Iterator[dict[str, Any]]:
    """Yields ``spec.events`` small events over ``spec.span_seconds``, in time order (see the
    module's docstring); ``spec.teams`` and ``spec.team_skew`` shape the teams."""
    rng = random.Random(spec.seed)
    teams = _Zipf(spec.teams, spec.team_skew)
    keys = sorted(_VALUES)
    step_us = spec.span_seconds * 1_000_000 / max(spec.events, 1)
    for i in range(spec.events):
        event_uuid = _uuid4(rng)
        team = 1 + teams.draw(rng)
        at = spec.start + timedelta(microseconds=int(i * step_us))
        props = {k: rng.choice(_VALUES[k]) for k in rng.sample(keys, rng.randint(4, 8))}
        yield {
            "uuid": event_uuid,
            "event": rng.choice(_NAMES),
            "team_id": team,
            "distinct_id": f"u{rng.randrange(5000)}",
            "timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "properties": props,
            "person_properties": {k: rng.choice(v) for k, v in _PERSON.items()},
        }
