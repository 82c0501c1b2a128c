"""The outbox of the jobs with state: their output rows ride in the state commit, then are published."""

from __future__ import annotations

from pipelines.runner import Context
from pipelines.storage import AppTxn, TableSpec


def publish_outbox(ctx: Context, state: TableSpec, out: TableSpec, app: str, kind: str, columns: list[str]) -> int:
    """Append the outbox rows (``kind``) a state commit holds, unless ``out`` already has them.

    Jobs with state replace their state table and its outbox in one commit, then publish the
    outbox under the same run number: a crash between the two is finished by the next run.
    """
    state_seq = ctx.store.txn_version(state, app)
    out_seq = ctx.store.txn_version(out, app)
    if state_seq is None or (out_seq is not None and out_seq >= state_seq):
        return 0
    rows = ctx.store.read(state, where=f"kind = '{kind}'").select(*columns).persist()
    try:
        ctx.store.append(out, rows, [AppTxn(app, state_seq)])
        return rows.count()
    finally:
        rows.unpersist()
