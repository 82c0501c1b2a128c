"""How an export batch reaches ClickHouse, and how a resend reaches it the same way.

The outbox records each batch under an app id that says how it is sent: the embedded engine reads
a batch's outbox files itself, in one insert with one token; a server gets them from the driver, a
chunk of ``clickhouse.insert_chunk_rows`` rows per insert, each with a token naming its place. A
resend cuts the same chunks, or names the same files, so ClickHouse drops what had arrived.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from gold.export import EXPORT_COLUMNS, in_send_order, rechunk, with_last_seen
from pipelines.config.sections import ClickHouseSettings
from pipelines.flows import flow_names
from pipelines.runtime.flow_types import DeclaredTables
from pipelines.runtime.runner import app_id
from pipelines.runtime.tables import EXPORT_OUTBOX, GOLD_PROPERTY_VALUES
from pipelines.sinks import clickhouse

APP = app_id(flow_names.EXPORT_CLICKHOUSE, GOLD_PROPERTY_VALUES)
#: The outbox records each batch under one of these app ids, which says how it is sent (and resent):
#: ``BULK_APP`` (since 2026-12-07): its files whole, in one insert, where the embedded engine reads
#: them, else in chunks of their rows in order; ``FILES_APP`` (before): in chunks of its files'
#: rows in order; ``APP`` (before that, and tables by name): sorted by key, in chunks.
BULK_APP = f"{APP}#bulk"
FILES_APP = f"{APP}#files"
OUTBOX_APPS = (BULK_APP, FILES_APP, APP)
#: The columns of ``property_values`` as a batch's outbox files give them (``last_seen``: the end of
#: the row's window, to its width in seconds, ``{width}``).
BULK_COLUMNS = {
    **{c: f"`{c}`" for c in EXPORT_COLUMNS},
    "last_seen": "`window_start` + toIntervalSecond({width})",
}


def send_batch(
    tables: DeclaredTables,
    client: Any,
    ch: ClickHouseSettings,
    width: timedelta,
    seq: int,
    app: str,
    rows: DataFrame,
    outbox_version: int | None,
) -> int:
    """Send batch ``seq`` as its ``app`` says (OUTBOX_APPS): the files of the outbox commit
    ``outbox_version`` whole, where the embedded engine reads them; else in chunks whose tokens
    name their place: of those files' rows in their order, or of ``rows`` (the outbox's rows of the
    batch) sorted by key. Returns the rows sent."""
    clickhouse.ensure_property_values(client, ch.database, ch.ttl_days)
    if app == BULK_APP and clickhouse.embedded(ch) and outbox_version is not None:
        paths = tables.added_local_paths(EXPORT_OUTBOX, outbox_version)
        seconds = str(int(width.total_seconds()))
        columns = {c: e.replace("{width}", seconds) for c, e in BULK_COLUMNS.items()}
        token = _token(seq, 0, "bulk")
        table = clickhouse.PROPERTY_VALUES_TABLE
        if paths and clickhouse.insert_files(client, table, columns, paths, token, ch.database):
            return sum(pq.read_metadata(p).num_rows for p in paths)  # the files' footers
    if app == APP or outbox_version is None:
        batches: AbstractContextManager[Iterable[pa.RecordBatch]] = tables.stream(in_send_order(rows, width))
    else:
        batches = tables.stream_added(EXPORT_OUTBOX, outbox_version, EXPORT_COLUMNS)
    order = {APP: "c", FILES_APP: "f"}.get(app, "b")
    sent = 0
    with batches as reader:
        for i, data in enumerate(rechunk(reader, ch.insert_chunk_rows)):
            if order != "c":
                data = with_last_seen(data, width)
            clickhouse.insert(client, clickhouse.PROPERTY_VALUES_TABLE, data, _token(seq, i, order), ch.database)
            sent += data.num_rows
    return sent


def _token(seq: int, chunk: int, order: str) -> str:
    """The insert token of chunk ``chunk`` of batch ``seq``; ``order`` tells how the batch was cut:
    ``c`` sorted by key (batches written before ``f``), ``f`` in the order of the outbox's files,
    ``b`` in the order of the files sent in bulk, ``bulk`` all of them in one insert."""
    return f"medallion:{GOLD_PROPERTY_VALUES.key}:batch{seq}:{order}{chunk}"
