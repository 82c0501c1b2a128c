"""A flow's progress on its tables: the source versions it has not processed, and appends that
happen once. Progress is a Delta app transaction (``app id -> last source version``) committed with
the flow's output, so a crash before that commit redoes the work and a crash after it skips it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql import DataFrame

from pipelines.storage import AppTxn, TableSpec, TableStore


@dataclass(frozen=True)
class Increment:
    """Source versions ``start..end`` (inclusive) that ``app_id`` has not processed yet."""

    source: TableSpec
    start: int
    end: int
    app_id: str
    #: The target's version the progress was read at (None: not known), which a write of the
    #: increment commits through, so that another writer's progress since fails it.
    read_version: int | None = None

    @property
    def txn(self) -> AppTxn:
        return AppTxn(self.app_id, self.end)

    def read(self, store: TableStore) -> DataFrame:
        """The rows added to the source in this increment."""
        return store.read_inserted(self.source, self.start, self.end)


def pending(store: TableStore, source: TableSpec, target: TableSpec, app: str) -> Increment | None:
    """The source versions not yet recorded by ``app`` on ``target``, or None when up to date."""
    # The version first: a commit between the two reads makes the write's check from it fail (a
    # retry reads both again), never pass a commit it did not see.
    read_version = store.version(target)
    if read_version is None:
        return after(store, source, None, app)
    inc = after(store, source, store.txn_version(target, app), app)
    return None if inc is None else replace(inc, read_version=read_version)


def after(store: TableStore, source: TableSpec, done: int | None, app: str) -> Increment | None:
    """The source versions after ``done`` (None: from the first), or None when there are none.

    For jobs that keep the source version they finished in their own state rather than in an
    app transaction on their target.
    """
    latest = store.version(source)
    if latest is None:
        return None
    start = 0 if done is None else done + 1
    if start > latest:
        return None
    return Increment(source, start, latest, app)


def append_once(
    store: TableStore,
    spec: TableSpec,
    data: pa.Table | DataFrame,
    txn: AppTxn | Sequence[AppTxn],
    before_commit: Callable[[], None] | None = None,
) -> bool:
    """Append unless ``spec`` already records ``txn`` (a redo after a crash). True when written.

    Several transactions are committed together, so the first one tells for all of them.
    ``before_commit``: as :meth:`TableStore.append` runs it (where the store can).
    """
    txns = [txn] if isinstance(txn, AppTxn) else list(txn)
    done = store.txn_version(spec, txns[0].app_id)
    if done is not None and done >= txns[0].version:
        return False
    store.append(spec, data, txns, before_commit=before_commit)
    return True
