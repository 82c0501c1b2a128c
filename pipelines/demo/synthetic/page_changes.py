"""MediaWiki page changes in arrival order (see :mod:`pipelines.demo.synthetic`)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pipelines.demo.synthetic.common import PageChangesSpec, _check_share, _Clock, _sha1_base36, _uuid4, _Zipf

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
