"""Other writers' progress, checked around a write on the delta-spark engine. Delta on Spark commits
inside its write and records one app transaction per commit, so what delta-rs checks inside its
commit (no app id of ``txns`` recorded since the version read) is checked here just before the
write, whose own transaction then fails on such a commit after its snapshot; and a write Delta
skipped as done (another writer recorded the same progress first) is told from one it made."""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.errors import CommitConflictError, StorageError
from pipelines.storage.base import TableStore
from pipelines.storage.deltaspark_txns import SparkTxns
from pipelines.storage.specs import AppTxn, TableSpec


def unmoved(store: TableStore, read: SparkTxns, spec: TableSpec, txns: Sequence[AppTxn], since: int | None) -> None:
    """:class:`CommitConflictError` if a writer recorded one of ``txns``' app ids after table
    version ``since`` (None: no check); ``read``: the store's app transactions, at any version."""
    if since is None or not txns:
        return
    ids = [t.app_id for t in txns]
    then, now = read.at(spec, since, ids), {a: store.txn_version(spec, a) for a in ids}
    _moved(spec, [a for a in ids if then[a] != now[a]], since)


def hold(store: TableStore, spec: TableSpec, guards: Sequence[AppTxn], since: int | None) -> None:
    """:class:`CommitConflictError` if a guard's app id is not at its version any more (another
    writer's progress, read at table version ``since``)."""
    _moved(spec, [g.app_id for g in guards if store.txn_version(spec, g.app_id) != g.version], since)


def written(store: TableStore, spec: TableSpec, txn: AppTxn) -> None:
    """:class:`CommitConflictError` unless the newest commit that records ``txn`` is a replace:
    Delta skips a write whose app transaction is not ahead of the table's, so another writer's
    commit of the same progress first leaves this one's rows unwritten."""
    try:
        at = store.commit_of(spec, txn)
    except StorageError:
        at = None
    if at is None or at not in store.replaces(spec, at, at):
        raise CommitConflictError(
            f"replace in {spec.key} was not written: another writer recorded {txn.app_id} at {txn.version} first"
        )


def _moved(spec: TableSpec, app_ids: Sequence[str], since: int | None) -> None:
    if app_ids:
        raise CommitConflictError(f"{', '.join(app_ids)} recorded progress in {spec.key} since version {since}")
