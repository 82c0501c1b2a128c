"""Source progress in each commit's info, for tables read through a catalog.

A table by name (Unity Catalog's managed tables above all) is read through the catalog, never by
listing its ``_delta_log``: catalog-managed commits can sit where a listing misses them. Delta has
no SQL for a table's app transactions, so each commit that records one also writes it in its
commit info (``userMetadata``), which ``DESCRIBE HISTORY`` serves by name:

    {"medallion.txns": {"<app id>": [<version>, <set at>], ...}}

``set at`` is the table version of the commit that set the entry (``null``: this commit). A
commit carries forward every entry the writer read (the newest it knows of each app id), so the
newest commits hold the whole progress even after log retention removed the commits that set
it. Two writers that read the same version and commit one after the other each carry the other's
older entry; the entry with the newest ``set at`` wins, so reading the newest commits (more than
any writer's read-to-commit span) finds each app id's own last commit. App ids marked ``once``
(a landed file's content: written once, never advanced) are not carried: only their own commit
holds them, and once it is gone Delta's own check of the app transaction refuses a second write.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.storage.specs import TableSpec

PROGRESS_KEY = "medallion.txns"


@dataclass(frozen=True)
class Entry:
    """An app id's version, and the table version of the commit that set it."""

    version: int
    set_at: int
    once: bool = False


def commit_metadata(app_id: str, version: int, once: bool, carried: Mapping[str, Entry]) -> str:
    """The ``userMetadata`` of a commit that records ``app_id`` at ``version``, carrying forward
    the entries ``carried`` (those not ``once``)."""
    entries: dict[str, list[object]] = {
        a: [e.version, e.set_at] for a, e in sorted(carried.items()) if not e.once and a != app_id
    }
    entries[app_id] = [version, None, 1] if once else [version, None]
    return json.dumps({PROGRESS_KEY: entries}, separators=(",", ":"))


def merged(commits: Iterable[tuple[int, str | None]]) -> dict[str, Entry]:
    """Each app id's entry with the newest ``set at`` among ``commits`` ((version, userMetadata)
    pairs, in any order); metadata that is not ours is skipped."""
    found: dict[str, Entry] = {}
    for commit, metadata in commits:
        for app_id, entry in _entries(metadata).items():
            version, set_at = int(entry[0]), commit if entry[1] is None else int(entry[1])
            once = len(entry) > 2 and bool(entry[2])
            if app_id not in found or set_at > found[app_id].set_at:
                found[app_id] = Entry(version, set_at, once)
    return found


def sets(metadata: str | None, app_id: str, version: int) -> bool:
    """Whether the commit with this ``userMetadata`` is the one that set ``app_id`` to ``version``
    (not one that carried it forward)."""
    entry = _entries(metadata).get(app_id)
    return entry is not None and entry[0] == version and entry[1] is None


def _entries(metadata: str | None) -> dict[str, list[Any]]:
    try:
        recorded = json.loads(metadata or "{}")
    except ValueError:
        return {}
    entries = recorded.get(PROGRESS_KEY) if isinstance(recorded, dict) else None
    if not isinstance(entries, dict):
        return {}
    return {str(a): e for a, e in entries.items() if isinstance(e, list) and len(e) >= 2 and isinstance(e[0], int)}


class HistoryProgress:
    """Each app id's progress as of a table version, for tables by name: merged from the newest
    ``window`` commits' metadata (``read(spec, limit, version)`` serves them), or from only the
    commits since a version merged before, and cached per version."""

    def __init__(
        self,
        read: Callable[[TableSpec, int, int], list[tuple[int, str | None]]],
        location: Callable[[TableSpec], str],
        window: int,
    ) -> None:
        self._read, self._location, self._window = read, location, window
        self._cache: dict[tuple[str, int], dict[str, Entry]] = {}

    def at(self, spec: TableSpec, version: int) -> dict[str, Entry]:
        location = self._location(spec)
        if (location, version) in self._cache:
            return self._cache[(location, version)]
        base = max((v for (loc, v) in self._cache if loc == location and v < version), default=None)
        since_base = base is not None and version - base <= self._window
        commits = self._read(spec, version - base if since_base and base is not None else self._window, version)
        older = self._cache[(location, base)] if since_base and base is not None else {}
        as_commits = [(e.set_at, commit_metadata(a, e.version, e.once, {})) for a, e in older.items()]
        progress = self._cache[(location, version)] = merged([*as_commits, *commits])
        while len(self._cache) > 64:
            self._cache.pop(next(iter(self._cache)))
        return progress

    def newest(self, spec: TableSpec, version: Callable[[], int | None]) -> dict[str, Entry]:
        """The progress of the newest version read so far (of ``version()`` if none was)."""
        location = self._location(spec)
        known = max((v for (loc, v) in self._cache if loc == location), default=None)
        if known is not None:
            return self._cache[(location, known)]
        now = version()
        return {} if now is None else self.at(spec, now)
