"""A synthetic MediaWiki page change: its editors, revisions and the ``mediawiki.page_change.v1``
JSON it is written as (see :mod:`pipelines.demo.synthetic.page_changes`, which generates them)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from pipelines.demo.synthetic.common import _Clock

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
