"""Table maintenance: OPTIMIZE (compact small files), then VACUUM (delete files no version needs).

Each pipeline run commits small files: appends of one batch, and the state tables
(``silver/page_change_state``, ``silver/metric_state``, the outboxes) that a run rewrites whole, each
rewrite leaving the previous copy behind. OPTIMIZE bin-packs a table's live files into a few large
ones (the rows stay the same; it is a new table version), which compacts the state tables too;
VACUUM then deletes the files no version within the retention references any more, which is what
gives the old copies' storage back.

A retention under 168 hours (7 days, Delta's default) can delete files that a reader still
running, a time-travel query or a job catching up on a change feed needs; it is refused unless
forced. Either engine still refuses a retention shorter than the table's own
``delta.deletedFileRetentionDuration``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipelines.errors import InputError
from pipelines.runtime.tables import ALL_TABLES, table
from pipelines.storage import TableSpec, TableStore

MIN_RETENTION_HOURS = 168


@dataclass(frozen=True)
class Maintained:
    """What maintenance did to one table."""

    table: str
    status: str  # "done", "missing" (not created yet) or "failed: <why>"
    files_before: int = 0
    files_after: int = 0
    vacuumed: int | None = None  # files VACUUM deleted; None when the engine does not say
    seconds: float = 0.0


def check_retention(hours: int, force: bool = False) -> None:
    """Refuse a VACUUM retention under :data:`MIN_RETENTION_HOURS` unless ``force``."""
    if hours < 0:
        raise InputError(f"--vacuum-hours must not be negative (got {hours})")
    if hours < MIN_RETENTION_HOURS and not force:
        raise InputError(
            f"--vacuum-hours {hours} is under {MIN_RETENTION_HOURS} (7 days): VACUUM would delete files "
            "that running readers, time travel and jobs catching up on a change feed may still need; "
            "pass --force-short-retention to do it anyway"
        )


def select_tables(keys: Sequence[str] = ()) -> list[TableSpec]:
    """The specs named ``layer/name`` (every table of the lake when none is named)."""
    if not keys:
        return list(ALL_TABLES)
    try:
        return [table(k) for k in dict.fromkeys(keys)]
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None


def maintain_tables(
    store: TableStore,
    specs: Sequence[TableSpec],
    retention_hours: int = MIN_RETENTION_HOURS,
    force_short_retention: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> list[Maintained]:
    """OPTIMIZE then VACUUM each existing table of ``specs``; one table failing does not stop the rest."""
    check_retention(retention_hours, force_short_retention)
    done = []
    for spec in specs:
        if not store.exists(spec):
            done.append(Maintained(spec.key, "missing"))
            continue
        say(f"maintaining {spec.key}")
        t0 = time.perf_counter()
        before = store.stats(spec).files
        try:
            store.optimize(spec)
            removed = store.vacuum(spec, retention_hours)
            after = store.stats(spec).files
        except Exception as exc:  # a conflict with a pipeline write, a permission: report, go on
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            done.append(Maintained(spec.key, f"failed: {first}", before, before, None, time.perf_counter() - t0))
            continue
        # delta-spark's VACUUM does not list what it deleted.
        vacuumed = None if store.engine == "delta-spark" else len(removed)
        done.append(Maintained(spec.key, "done", before, after, vacuumed, time.perf_counter() - t0))
    return done
