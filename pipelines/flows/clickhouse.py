"""The ClickHouse export of gold: closed windows' count changes -> ``property_values``, exactly once.

Each batch is first appended to ``_meta/export_outbox`` under the next batch number (one commit),
then sent in a fixed order and chunking, each insert carrying the token ``<batch>:<chunk>``, then
recorded in ``gold/property_value_exports`` under the same number. A run that stopped anywhere in
between is finished by the next one: it resends the same rows with the same tokens, which
ClickHouse drops if they had arrived. What a batch holds is gold's rules (:mod:`gold.export`);
this module moves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from gold.export import (
    CHANGE_COLUMNS,
    EXPORT_COLUMNS,
    EXPORT_DATASET,
    EXPORT_KEY,
    EXPORTED_ON,
    EXPORTED_UPDATE,
    PROGRESS_COLUMNS,
    BatchFigures,
    ExportProgress,
    batch_figures,
    change_bounds,
    changed_keys,
    cut_figures,
    export_batch,
    export_bounds,
    exported_rows,
    held_change_bounds,
    held_exported_rows,
    in_send_order,
    incremental_batch,
    newest_event,
    outbox_rows,
    progress_in,
    progress_of,
    rechunk,
    with_last_seen,
)
from gold.property_values import KEY_FIELDS, WINDOW_START
from pipelines.config.sections import ClickHouseSettings, GoldSettings
from pipelines.config.settings import Settings
from pipelines.errors import StorageError
from pipelines.flows import flow_names
from pipelines.runtime.flow_types import DeclaredTables, ExportRun, FlowRecord
from pipelines.runtime.runner import app_id
from pipelines.runtime.tables import EXPORT_OUTBOX, EXPORTS, GOLD_EXPORTED, GOLD_PROPERTY_VALUES
from pipelines.sinks import clickhouse
from pipelines.storage import AppTxn

APP = app_id(flow_names.EXPORT_CLICKHOUSE, GOLD_PROPERTY_VALUES)
#: A batch of at most this many rows is read from its outbox files into the driver once, and sent
#: and recorded from there (a few MB); a larger one is streamed to ClickHouse and recorded by Spark.
HELD_BATCH_ROWS = 100_000
#: Gold's change feed since the last batch is read into the driver up to this many rows (counted
#: from the log first: a few MB), where a Spark job would find its bounds and late keys.
HELD_CHANGE_ROWS = 100_000
#: The late keys of a held change feed, as a frame (EXPORT_KEY).
LATE_KEYS = StructType([f for f in KEY_FIELDS if f.name in EXPORT_KEY])
#: The outbox columns a held batch is read with: what is sent, and what the exported state records.
HELD_COLUMNS = (*EXPORT_COLUMNS, "total", "correction")
#: The outbox records each batch under this app id: sent in the order of its files. Batches written
#: before that, and those of tables by name, are under ``APP``: sent sorted by key.
FILES_APP = f"{APP}#files"


@dataclass(frozen=True)
class ExportConfig:
    """What the export is configured with: gold's windows and cut, and its ClickHouse."""

    gold: GoldSettings
    clickhouse: ClickHouseSettings


def export_config(settings: Settings) -> ExportConfig:
    return ExportConfig(settings.gold, settings.clickhouse)


@dataclass(frozen=True)
class Batch:
    """The next batch to export: its outbox rows (a view of a frame the run cached), their
    figures and the gold version they were cut from."""

    rows: DataFrame
    figures: BatchFigures
    gated: int
    dropped: int
    closed_before: datetime | None
    gold_version: int


@dataclass
class PropertyValuesExport:
    """One run of the export of gold/property_values to ClickHouse."""

    run: ExportRun
    config: ExportConfig
    record: FlowRecord
    #: The ClickHouse client, connecting while the batch is cut (None: connect when sending).
    client: Callable[[], Any] | None = None

    @property
    def tables(self) -> DeclaredTables:
        return self.run.tables

    def batches(self) -> tuple[int, int]:
        """(the newest batch in the outbox, the newest one recorded as exported)."""
        out_seq = max(self.tables.txn_version(EXPORT_OUTBOX, a) or 0 for a in (APP, FILES_APP))
        return out_seq, self.tables.txn_version(GOLD_EXPORTED, APP) or 0

    def progress(self, seq: int) -> ExportProgress | None:
        """Where outbox batch ``seq`` left the export. Every row of a batch carries it, so one row
        is read: from the files of the commit that recorded the batch where the store reads a
        commit's files (no Spark job), else through Spark."""
        tables = self.tables
        if tables.streams_commit_files(EXPORT_OUTBOX) and tables.txn_version(EXPORT_OUTBOX, FILES_APP) == seq:
            version = tables.commit_of(EXPORT_OUTBOX, AppTxn(FILES_APP, seq))
            with tables.stream_added(EXPORT_OUTBOX, version, PROGRESS_COLUMNS) as reader:
                return progress_in(next((b for b in reader if b.num_rows), None))
        return progress_of(tables.read(EXPORT_OUTBOX, where=f"export_seq = {seq}"))

    def resend(self, seq: int) -> int:
        """Send outbox batch ``seq`` again, as it was first cut, and record it; returns rows sent."""
        rows = self.record.cache(self.tables.read(EXPORT_OUTBOX, where=f"export_seq = {seq}"))
        in_files = self.tables.txn_version(EXPORT_OUTBOX, FILES_APP) == seq  # else sent sorted by key
        if in_files and not self.tables.streams_commit_files(EXPORT_OUTBOX):
            raise StorageError(
                f"export batch {seq} was recorded to be sent from its outbox files, which tables by name do "
                "not read: finish it with the tables by path (catalog and schema unset), then switch"
            )
        outbox_version = self.tables.commit_of(EXPORT_OUTBOX, AppTxn(FILES_APP, seq)) if in_files else None
        return self.deliver(seq, rows, batch_figures(rows), outbox_version)

    def deliver(self, seq: int, rows: DataFrame, figures: BatchFigures, outbox_version: int | None) -> int:
        """Send batch ``seq`` (its outbox ``rows``) and record it as exported; returns rows sent.

        The rows go to ClickHouse straight from the files the outbox commit ``outbox_version``
        added, in their order (no sort, no copy), in chunks of ``insert_chunk_rows`` whose tokens
        name their place in that order: a resend cuts the same files into the same chunks. A batch
        written before the outbox recorded ``FILES_APP`` (``outbox_version`` None) is resent as it
        was first sent: sorted by its key.
        """
        if outbox_version is not None and figures.rows <= HELD_BATCH_ROWS:
            # Provably small (at most HELD_BATCH_ROWS rows): the batch's outbox files are read
            # once, into the driver, and both sent and recorded from there, with no Spark job.
            with self.tables.stream_added(EXPORT_OUTBOX, outbox_version, HELD_COLUMNS) as reader:
                held = reader.read_all()
            sent = self.send(seq, rows, outbox_version, held)
            self.record_exported(seq, held, figures)
        else:
            sent = self.send(seq, rows, outbox_version)
            self.record_exported(seq, rows, figures)
        log_row = pa.Table.from_pylist(
            [
                {
                    "sink": "clickhouse",
                    "target": clickhouse.PROPERTY_VALUES_TABLE,
                    "source": GOLD_PROPERTY_VALUES.key,
                    "from_version": seq,
                    "to_version": seq,
                    "rows": sent,
                    "count_sum": figures.count_sum,
                    "exported_at": datetime.now(UTC),
                }
            ],
            schema=EXPORTS.arrow_schema,
        )
        self.tables.append_once(EXPORTS, log_row, AppTxn(APP, seq))
        self.record.incr(rows_exported=sent, late_corrections=figures.corrections, count_sum=figures.count_sum)
        return sent

    def send(self, seq: int, rows: DataFrame, outbox_version: int | None, held: pa.Table | None = None) -> int:
        """Send batch ``seq``: sorted by key from ``rows`` (``outbox_version`` None), else from the
        outbox commit's files in their order, or from ``held``, those files' rows already read."""
        window, ch = self.config.gold.window, self.config.clickhouse
        if held is not None:
            batches: AbstractContextManager[Iterable[pa.RecordBatch]] = nullcontext(
                held.select(list(EXPORT_COLUMNS)).to_batches()
            )
        elif outbox_version is None:
            batches = self.tables.stream(in_send_order(rows, window))
        else:
            batches = self.tables.stream_added(EXPORT_OUTBOX, outbox_version, EXPORT_COLUMNS)
        sent = 0
        connected = nullcontext(self.client()) if self.client else clickhouse.connect(ch)
        with connected as client, batches as reader:
            clickhouse.ensure_property_values(client, ch.database, ch.ttl_days)
            for i, data in enumerate(rechunk(reader, ch.insert_chunk_rows)):
                if outbox_version is not None:
                    data = with_last_seen(data, window)
                token = _token(seq, i, "c" if outbox_version is None else "f")
                clickhouse.insert(client, clickhouse.PROPERTY_VALUES_TABLE, data, token, ch.database)
                sent += data.num_rows
        return sent

    def record_exported(self, seq: int, rows: DataFrame | pa.Table, figures: BatchFigures) -> None:
        """What batch ``seq`` exported (its outbox ``rows``, as a frame or held in the driver), in
        two writes, each as cheap as the batch: the tuples exported for the first time are
        appended (under ``<app>#new``, so a redo does not append them twice), and only the
        corrections are merged into what was exported before, in the commit that records the
        batch. An append never rewrites the files the exported state holds.
        """

        def exported(correction: bool) -> DataFrame | pa.Table:
            if isinstance(rows, pa.Table):
                return held_exported_rows(rows, seq, correction)
            return exported_rows(rows.where(F.col("correction") == F.lit(correction)))

        if figures.rows > figures.corrections:
            self.tables.append_once(GOLD_EXPORTED, exported(False), AppTxn(f"{APP}#new", seq))
        if figures.corrections:
            self.tables.merge(
                GOLD_EXPORTED,
                exported(True),
                on=EXPORTED_ON,
                update=EXPORTED_UPDATE,
                txns=[AppTxn(APP, seq)],
            )
        else:  # nothing to correct: the commit records the batch alone
            self.tables.append(GOLD_EXPORTED, GOLD_EXPORTED.arrow_schema.empty_table(), [AppTxn(APP, seq)])

    def changes_since(
        self, prev: ExportProgress, version: int, changed: int | None
    ) -> tuple[DataFrame | None, datetime | None, list[datetime], DataFrame]:
        """Gold's changes since batch ``prev`` up to ``version`` (``changed`` rows, None: not known)
        -> (the change feed, cached, or None where it was held; the newest event time counted; the
        windows of the late keys; the late keys). One pass over the changes finds the newest event
        and the late keys' windows, to read only their part of gold and of what was exported; a
        feed of at most HELD_CHANGE_ROWS rows (counted from the log) is read into the driver
        instead, with no Spark job."""
        g, start = self.config.gold, prev.gold_version + 1
        held = None
        if changed is not None and changed <= HELD_CHANGE_ROWS:
            held = self.tables.held_changes(GOLD_PROPERTY_VALUES, start, version, CHANGE_COLUMNS)
        if held is not None:
            newest, windows, keys = held_change_bounds(held, g.window, prev)
            return None, newest, windows, self.tables.to_spark(keys, LATE_KEYS)
        changes = self.record.cache(self.tables.read_changes(GOLD_PROPERTY_VALUES, start, version))
        newest, windows = change_bounds(changes, g.window, prev)
        return changes, newest, windows, changes.transform(changed_keys(g.window, prev.closed_through))

    def next_batch(self, seq: int, prev: ExportProgress | None, changed: int | None = None) -> Batch | str:
        """Batch ``seq``: what gold holds for windows closed since batch ``seq - 1`` (``prev``),
        and corrections for late counts in windows closed before; or why there is none.
        ``changed``: the rows of gold's change feed since ``prev`` (None: not known)."""
        g, cache = self.config.gold, self.record.cache
        changes = None
        version = self.tables.version(GOLD_PROPERTY_VALUES)
        assert version is not None  # the runner ensured it
        if prev is None:
            # The first export (or the first since the lake kept its progress): all of gold. Not
            # cached: the newest event time reads one column, the batch reads gold once.
            gold = self.tables.read(GOLD_PROPERTY_VALUES)
            newest = newest_event(gold, None)
            exported = self.tables.read(GOLD_EXPORTED)
        else:
            # Only what changed: the windows closed since the last batch, and the tuples of
            # windows closed before it that gold's change feed shows late counts for.
            changes, newest, windows, late = self.changes_since(prev, version, changed)
            exported = self.tables.read_windows(GOLD_EXPORTED, WINDOW_START, None, windows)
        if newest is None:
            return "gold is empty"
        bounds = export_bounds(newest, g.window, g.grace, self.run.options.drain, prev)
        if prev is None:
            cut = gold.transform(
                export_batch(exported, g.window, bounds.closed_before, g.min_export_count, g.top_values_per_key)
            )
        else:
            # Gold's windows that may close since the last batch and its late windows, from their
            # files alone (gold is laid out by window); the cut keeps the rows it wants of them.
            since = prev.closed_through - g.window
            cut = self.tables.read_windows(GOLD_PROPERTY_VALUES, WINDOW_START, since, windows).transform(
                incremental_batch(
                    late,
                    windows,
                    exported,
                    g.window,
                    prev.closed_through,
                    bounds.closed_before,
                    g.min_export_count,
                    g.top_values_per_key,
                )
            )
        whole = cache(cut)
        figures = cut_figures(whole)  # the flags and what is sent, in one pass that fills the cache
        if changes is not None:  # the cut is all it needs from here on
            self.record.release(changes)
        sendable = whole.where("NOT _gated AND NOT _dropped").drop("_gated", "_dropped")
        # A view of the cached batch, not cached again: the gate checks it as the outbox write reads it.
        rows = sendable.transform(outbox_rows(seq, version, newest, bounds.through))
        return Batch(rows, figures.sent, figures.gated, figures.dropped, bounds.closed_before, version)


def property_values(run: ExportRun, config: ExportConfig, record: FlowRecord) -> None:
    """Closed windows of gold -> ClickHouse, exactly once, with corrections for late counts (see
    the module's docstring)."""
    export, tables = PropertyValuesExport(run, config, record), run.tables
    out_seq, done_seq = export.batches()
    if out_seq > done_seq:
        resent = export.resend(out_seq)
        record.say(f"export: finished batch {out_seq} that a stopped run had left ({resent:,} rows)")
    prev = None if out_seq == 0 else export.progress(out_seq)
    version = tables.version(GOLD_PROPERTY_VALUES)
    if prev is not None and prev.gold_version == version and not run.options.drain:
        record.noop(f"gold has not changed since export batch {out_seq}")
        return
    seq = out_seq + 1
    # Planned whole where gold's changes since the last batch are few (the first: not known). Its
    # change files, not the files a MERGE rewrote: a late count rewrites a file of gold whole.
    changed = None
    if prev is not None and version is not None and version > prev.gold_version:
        changed = tables.change_rows(GOLD_PROPERTY_VALUES, prev.gold_version + 1, version)
    with run.small(changed), clickhouse.connecting(config.clickhouse) as client:
        export.client = client
        _export(export, seq, prev, changed, record)


def _export(
    export: PropertyValuesExport, seq: int, prev: ExportProgress | None, changed: int | None, record: FlowRecord
) -> None:
    """Batch ``seq`` cut, gated, written to the outbox, sent and recorded (:func:`property_values`)."""
    run, tables = export.run, export.tables
    batch = export.next_batch(seq, prev, changed)
    if isinstance(batch, str):
        record.noop(batch)
        return
    record.add(gated=batch.gated, top_values_dropped=batch.dropped, source_to=batch.gold_version)
    if batch.closed_before is not None:
        record.add(watermark_epoch_s=batch.closed_before.timestamp())
    if batch.figures.rows == 0:
        gated = f" ({batch.gated:,} gated)" if batch.gated else ""
        record.noop("no closed window has counts to export" + gated)
        return
    gate = run.gate(EXPORT_DATASET, batch.rows, AppTxn(APP, seq))
    # Sent from the outbox commit's files where the store reads a commit's files (by path); tables
    # by name are read through the catalog only, so their batches are sent sorted by key.
    in_files = tables.streams_commit_files(EXPORT_OUTBOX)
    outbox_txn = AppTxn(FILES_APP if in_files else APP, seq)
    # Provably small (the cut counted at most HELD_BATCH_ROWS rows to send; the gate only drops):
    # collected from the run's cache, as the gate checks them, and written by the driver where the
    # store writes there, with no Spark write job. A larger batch is written by Spark.
    held = in_files and tables.writes_in_driver and batch.figures.rows <= HELD_BATCH_ROWS

    def write(rows: DataFrame) -> int:
        return tables.append(EXPORT_OUTBOX, rows.toArrow() if held else rows, [outbox_txn])

    outbox_version = gate.write(write)
    # A gate's drop check may have kept fewer rows than the batch counted: count what it kept.
    figures = batch.figures if gate.kept_all else batch_figures(gate.rows)
    sent = export.deliver(seq, gate.rows, figures, outbox_version if in_files else None)
    record.rows(sent, sent)
    record.say(
        f"export: batch {seq}: {sent:,} rows to ClickHouse {clickhouse.PROPERTY_VALUES_TABLE} "
        f"({int(record.figure('late_corrections')):,} corrections, {batch.gated:,} gated)"
        + (" (drained)" if run.options.drain else "")
    )


def _token(seq: int, chunk: int, order: str) -> str:
    """The insert token of chunk ``chunk`` of batch ``seq``; ``order`` tells how the batch was cut:
    ``c`` sorted by key (batches written before ``f``), ``f`` in the order of the outbox's files."""
    return f"medallion:{GOLD_PROPERTY_VALUES.key}:batch{seq}:{order}{chunk}"
