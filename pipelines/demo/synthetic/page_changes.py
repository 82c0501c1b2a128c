"""MediaWiki page changes in arrival order (see :mod:`pipelines.demo.synthetic`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pipelines.demo.synthetic.common import PageChangesSpec, _check_share, _Clock, _sha1_base36, _uuid4, _Zipf
from pipelines.demo.synthetic.page_change_records import (
    _BURST_MEAN_SECONDS,
    _BURST_SHARE,
    _EDIT_SUMMARIES,
    _MINOR_EDIT_RATE,
    _MOVE_RATE,
    _PAGE_SKEW,
    _TITLE_WORDS,
    _VISIBILITY_RATE,
    _Change,
    _Editor,
    _editors,
    _is_wikibase,
    _page_change_json,
    _Revision,
)


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


def _pages(spec: PageChangesSpec, counts: list[int], rng: random.Random) -> list[_PageState]:
    """One page per count, on a random wiki; page ids grow per wiki with random gaps, as real ones do."""
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
    return pages


def _timeline(pages: list[_PageState], span: int, rng: random.Random) -> list[tuple[int, int, int]]:
    """Every page's changes as (event time, page, sequence number within the page), in event-time order."""
    timeline: list[tuple[int, int, int]] = []
    for p, state in enumerate(pages):
        for seq, t in enumerate(_page_times(state.count, span, rng)):
            timeline.append((t, p, seq))
    timeline.sort()
    return timeline


def _next_kind(state: _PageState, more_to_come: bool, delete_rate: float, rng: random.Random) -> str:
    """The kind of a page's next change. Only a live, existing page draws, so a page's first change
    is always a create and a deleted page's next change always an undelete."""
    if state.revision is None:
        return "create"
    if state.deleted:
        return "undelete"
    r = rng.random()
    if r < delete_rate:
        # A delete that is the page's last change would never be undone; make it an edit.
        return "delete" if more_to_come else "edit"
    if r < delete_rate + _VISIBILITY_RATE:
        return "visibility_change"
    if r < delete_rate + _VISIBILITY_RATE + _MOVE_RATE:
        return "move"
    return "edit"


@dataclass(slots=True)
class _Draws:
    """What every change builder shares: the one seeded ``rng`` (so the order of calls fixes the
    output), the clock, and the next rev id per wiki, handed out in event-time order so that rev
    ids increase per wiki and per page."""

    rng: random.Random
    clock: _Clock
    next_rev_id: dict[str, int]

    def rev_id(self, wiki: str) -> int:
        rev_id = self.next_rev_id[wiki]
        self.next_rev_id[wiki] += 1
        return rev_id

    def change(
        self,
        state: _PageState,
        t: int,
        kind: str,
        revision: _Revision,
        performer: _Editor,
        *,
        prior_revision: _Revision | None = None,
        prior_title: str | None = None,
        comment: str | None = None,
        revision_count: int | None = None,
    ) -> _Change:
        """The change as the page stands *after* it: a move's event carries the new title. Its ids
        are the last draws of every change."""
        return _Change(
            offset=t,
            kind=kind,
            wiki=state.wiki,
            page_id=state.page_id,
            title=state.title,
            revision=revision,
            performer=performer,
            meta_id=_uuid4(self.rng),
            request_id=_uuid4(self.rng),
            prior_revision=prior_revision,
            prior_title=prior_title,
            comment=comment,
            revision_count=revision_count,
        )


def _add_revision(state: _PageState, revision: _Revision) -> _Revision | None:
    """Makes ``revision`` the page's current one and returns the one it replaces."""
    prior = state.revision
    state.revisions += 1
    state.revision = revision
    return prior


def _create(state: _PageState, t: int, performer: _Editor, draws: _Draws) -> _Change:
    rng = draws.rng
    rev_id = draws.rev_id(state.wiki)
    size = rng.randint(200, 5_000)
    text = f"/* wbeditentity-create:2|en */ {state.title}" if _is_wikibase(state.wiki) else "Created page"
    revision = _Revision(
        rev_id=rev_id,
        rev_dt=draws.clock.seconds(t),
        is_minor_edit=False,  # a first revision is never minor
        rev_sha1=_sha1_base36(rng),
        rev_size=size,
        rev_parent_id=None,
        comment=text,
        editor=performer,
        origin_rev_id=rev_id,
    )
    prior = _add_revision(state, revision)
    return draws.change(state, t, "create", revision, performer, prior_revision=prior)


def _edit(state: _PageState, t: int, performer: _Editor, draws: _Draws) -> _Change:
    current = state.revision
    assert current is not None
    rng = draws.rng
    rev_id = draws.rev_id(state.wiki)
    size = max(50, current.rev_size + rng.randint(-300, 600))
    if _is_wikibase(state.wiki):
        text = f"/* wbsetclaim-update:2||1 */ [[Property:P{rng.randint(1, 900)}]]"
    else:
        text = rng.choice(_EDIT_SUMMARIES)
    revision = _Revision(
        rev_id=rev_id,
        rev_dt=draws.clock.seconds(t),
        # Drawn before the sha1: keyword arguments are evaluated in order, and the order is the output.
        is_minor_edit=rng.random() < _MINOR_EDIT_RATE,
        rev_sha1=_sha1_base36(rng),
        rev_size=size,
        rev_parent_id=current.rev_id,
        comment=text,
        editor=performer,
        origin_rev_id=rev_id,
    )
    prior = _add_revision(state, revision)
    return draws.change(state, t, "edit", revision, performer, prior_revision=prior)


def _move(state: _PageState, t: int, performer: _Editor, draws: _Draws) -> _Change:
    current = state.revision
    assert current is not None
    rev_id = draws.rev_id(state.wiki)
    prior_title = state.title
    state.moves += 1
    state.title = f"{state.base_title}_({state.moves})"
    # A move adds a null revision: new id, same content.
    revision = _Revision(
        rev_id=rev_id,
        rev_dt=draws.clock.seconds(t),
        is_minor_edit=True,
        rev_sha1=current.rev_sha1,
        rev_size=current.rev_size,
        rev_parent_id=current.rev_id,
        comment=f"{performer.user_text} moved page [[{prior_title}]] to [[{state.title}]]",
        editor=performer,
        origin_rev_id=current.origin_rev_id,
    )
    prior = _add_revision(state, revision)
    return draws.change(state, t, "move", revision, performer, prior_revision=prior, prior_title=prior_title)


def _delete(state: _PageState, t: int, performer: _Editor, draws: _Draws) -> _Change:
    assert state.revision is not None
    state.deleted = True
    return draws.change(
        state,
        t,
        "delete",
        state.revision,
        performer,
        comment="Deleting page: housekeeping",
        revision_count=state.revisions,
    )


def _undelete(state: _PageState, t: int, performer: _Editor, draws: _Draws) -> _Change:
    assert state.revision is not None
    state.deleted = False
    return draws.change(state, t, "undelete", state.revision, performer, comment="")


def _hide_comment(state: _PageState, t: int, performer: _Editor, draws: _Draws) -> _Change:
    """A ``visibility_change``: the comment of the current revision gets hidden, no new revision."""
    assert state.revision is not None
    revision = replace(state.revision, is_comment_visible=False)
    state.revision = revision
    return draws.change(state, t, "visibility_change", revision, performer)


# Each builder updates the page and returns its change; none may draw after Draws.change, which
# draws the event's ids last.
_BUILDERS: dict[str, Callable[[_PageState, int, _Editor, _Draws], _Change]] = {
    "create": _create,
    "edit": _edit,
    "move": _move,
    "delete": _delete,
    "undelete": _undelete,
    "visibility_change": _hide_comment,
}


def _distinct_changes(spec: PageChangesSpec, rng: random.Random, clock: _Clock) -> list[_Change]:
    """All distinct changes, in event-time order.

    Every draw comes from ``rng`` in a fixed order (editors, page counts, pages, times, rev ids, then
    per change: performer, kind, the kind's own draws, ids), which is what makes the output
    reproducible; reorder nothing here without expecting different data.
    """
    editors = _editors(rng, clock)
    editor_zipf = _Zipf(len(editors), 1.1)
    pages = _pages(spec, _page_counts(spec, rng), rng)
    timeline = _timeline(pages, spec.span_seconds, rng)
    draws = _Draws(rng, clock, {wiki: 500_000 + rng.randrange(1_000_000) for wiki in spec.wikis})
    changes: list[_Change] = []
    for t, p, seq in timeline:
        state = pages[p]
        performer = editors[editor_zipf.draw(rng)]
        kind = _next_kind(state, seq < state.count - 1, spec.delete_rate, rng)
        changes.append(_BUILDERS[kind](state, t, performer, draws))
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
