"""The ClickHouse export of gold: closed windows' count changes -> ``property_values``, exactly once.

Each batch is first appended to ``_meta/export_outbox`` under the next batch number (one commit),
then sent, then recorded in ``_meta/exports`` under the same number. A run that stopped anywhere in
between is finished by the next one: it resends the same rows with the same insert token, which
ClickHouse drops if they had arrived. The outbox holds every row ever sent, so it is also what
ClickHouse holds: a late count's correction is set against the counts the outbox sent for its
tuple (:func:`gold.export.exported_of`). What a batch holds is gold's rules (:mod:`gold.export`);
this module moves it.

How a batch is sent is :mod:`pipelines.flows.clickhouse_send`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from gold.export import (
    CHANGE_COLUMNS,
    EXPORT_DATASET,
    EXPORT_KEY,
    PROGRESS_COLUMNS,
    BatchFigures,
    CutFigures,
    ExportProgress,
    as_collected,
    as_stored,
    batch_figures,
    change_bounds,
    changed_keys,
    cut_figure_columns,
    cut_figures,
    cut_figures_of,
    export_batch,
    export_bounds,
    exported_of,
    held_change_bounds,
    incremental_batch,
    newest_event,
    outbox_rows,
    progress_in,
    progress_of,
)
from gold.property_values import KEY_FIELDS, WINDOW_START
from pipelines.config.sections import ClickHouseSettings, GoldSettings
from pipelines.config.settings import Settings
from pipelines.errors import StorageError
from pipelines.flows.clickhouse_send import APP, BULK_APP, OUTBOX_APPS, send_batch
from pipelines.runtime.flow_types import DeclaredTables, ExportRun, FlowRecord, WriteGate
from pipelines.runtime.tables import EXPORT_OUTBOX, EXPORTS, GOLD_PROPERTY_VALUES
from pipelines.sinks import clickhouse
from pipelines.storage import AppTxn

#: A batch of at most this many rows is written to the outbox from the driver, where the store
#: writes there (a few MB); a larger one is written by Spark.
HELD_BATCH_ROWS = 100_000
#: Gold's change feed since the last batch is read into the driver up to this many rows (counted
#: from the log first: a few MB), where a Spark job would find its bounds and late keys.
HELD_CHANGE_ROWS = 100_000
#: The late keys of a held change feed, as a frame (EXPORT_KEY).
LATE_KEYS = StructType([f for f in KEY_FIELDS if f.name in EXPORT_KEY])


@dataclass(frozen=True)
class ExportConfig:
    """What the export is configured with: gold's windows and cut, and its ClickHouse."""

    gold: GoldSettings
    clickhouse: ClickHouseSettings


def export_config(settings: Settings) -> ExportConfig:
    return ExportConfig(settings.gold, settings.clickhouse)


@dataclass(frozen=True)
class Cut:
    """The next batch to export, cut from gold: the rows to send and those the cut holds back
    (``_gated``, ``_dropped``), where the batch leaves the export, and the gold version read."""

    rows: DataFrame
    closed_before: datetime | None
    newest: datetime
    through: datetime
    gold_version: int


@dataclass(frozen=True)
class Batch:
    """A batch as the outbox records it: its rows (a view of a frame the run cached, or a frame
    the outbox write counts as it reads it) and their figures (None: counted by that write, see
    ``counted``), with the rows the gate held back (those counted first)."""

    rows: DataFrame
    figures: BatchFigures | None
    gated: int = 0
    #: Where the figures are counted by the outbox write: (sent figures, gated, dropped) once it ran.
    counted: Callable[[], CutFigures] | None = None


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
        """(the newest batch in the outbox, the newest one recorded as sent)."""
        out_seq = max(self.tables.txn_version(EXPORT_OUTBOX, a) or 0 for a in OUTBOX_APPS)
        return out_seq, self.tables.txn_version(EXPORTS, APP) or 0

    def outbox_app(self, seq: int) -> str:
        """The app id the outbox recorded batch ``seq`` under: how it is sent (see OUTBOX_APPS)."""
        return next((a for a in OUTBOX_APPS[:-1] if self.tables.txn_version(EXPORT_OUTBOX, a) == seq), APP)

    def recorded(self, seq: int) -> DataFrame:
        """The outbox's rows of batch ``seq``: what it sends, and what ClickHouse holds once sent."""
        return self.tables.read(EXPORT_OUTBOX, where=f"export_seq = {seq}")

    def progress(self, seq: int) -> ExportProgress | None:
        """Where outbox batch ``seq`` left the export. Every row of a batch carries it, so one row
        is read: from the files of the commit that recorded the batch where the store reads a
        commit's files (no Spark job), else through Spark."""
        tables, app = self.tables, self.outbox_app(seq)
        if app != APP and tables.streams_commit_files(EXPORT_OUTBOX):
            version = tables.commit_of(EXPORT_OUTBOX, AppTxn(app, seq))
            with tables.stream_added(EXPORT_OUTBOX, version, PROGRESS_COLUMNS) as reader:
                return progress_in(next((b for b in reader if b.num_rows), None))
        return progress_of(self.recorded(seq))

    def resend(self, seq: int) -> int:
        """Send outbox batch ``seq`` again, as it was first sent, and record it; returns rows sent."""
        app = self.outbox_app(seq)
        if app != APP and not self.tables.streams_commit_files(EXPORT_OUTBOX):
            raise StorageError(
                f"export batch {seq} was recorded to be sent from its outbox files, which tables by name do "
                "not read: finish it with the tables by path (catalog and schema unset), then switch"
            )
        rows = self.record.cache(self.recorded(seq))
        version = self.tables.commit_of(EXPORT_OUTBOX, AppTxn(app, seq)) if app != APP else None
        return self.deliver(seq, app, rows, batch_figures(rows), version)

    def deliver(self, seq: int, app: str, rows: DataFrame, figures: BatchFigures, outbox_version: int | None) -> int:
        """Send batch ``seq`` (its outbox ``rows``, recorded under ``app`` by the outbox commit
        ``outbox_version``) and record it as sent; returns rows sent."""
        sent = self.send(seq, app, rows, outbox_version)
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

    def send(self, seq: int, app: str, rows: DataFrame, outbox_version: int | None) -> int:
        """Send batch ``seq`` as its ``app`` says (:func:`send_batch`); returns rows sent."""
        connected = nullcontext(self.client()) if self.client else clickhouse.connect(self.config.clickhouse)
        with connected as client:
            ch, width = self.config.clickhouse, self.config.gold.window
            return send_batch(self.tables, client, ch, width, seq, app, rows, outbox_version)

    def changes_since(
        self, prev: ExportProgress, version: int, changed: int | None
    ) -> tuple[datetime | None, list[datetime], DataFrame | None]:
        """Gold's changes since batch ``prev`` up to ``version`` (``changed`` rows, None: not known)
        -> (the newest event time counted; the windows of the late keys; the late keys, None where
        there are none). A change feed read through Spark is cached for the run.

        Commits that only appended rows (stage 2's first load of new windows) say both from their
        files' statistics, with no Spark job: the newest event, and whether any row is in a window
        closed before (none is, unless its earliest window is). Otherwise one pass over the
        changes finds them, to read only the late keys' part of gold and of what was sent; a feed of
        at most HELD_CHANGE_ROWS rows (counted from the log) is read into the driver instead."""
        g, start = self.config.gold, prev.gold_version + 1
        added = self.tables.inserted_stats(GOLD_PROPERTY_VALUES, start, version)
        if added is not None:
            earliest, latest = added.earliest.get(WINDOW_START), added.latest.get("max_event_time")
            closed = as_stored(prev.closed_through - g.window) if prev.closed_through else None
            if not added.rows or (earliest is not None and latest is not None and closed and earliest > closed):
                appended = as_collected(latest) if latest is not None else None
                return max(appended, prev.newest_event) if appended else prev.newest_event, [], None
        held = None
        if changed is not None and changed <= HELD_CHANGE_ROWS:
            held = self.tables.held_changes(GOLD_PROPERTY_VALUES, start, version, CHANGE_COLUMNS)
        if held is not None:
            newest, windows, keys = held_change_bounds(held, g.window, prev)
            return newest, windows, self.tables.to_spark(keys, LATE_KEYS)
        changes = self.record.cache(self.tables.read_changes(GOLD_PROPERTY_VALUES, start, version))
        newest, windows = change_bounds(changes, g.window, prev)
        return newest, windows, changes.transform(changed_keys(g.window, prev.closed_through))

    def sent_in(self, windows: list[datetime] | None) -> DataFrame:
        """What ClickHouse holds of ``windows`` (None: of every window): the outbox's rows of them,
        summed per tuple (:func:`gold.export.exported_of`), read from the files whose windows cover
        them."""
        if windows is None:
            return self.tables.read(EXPORT_OUTBOX).transform(exported_of)
        return self.tables.read_windows(EXPORT_OUTBOX, WINDOW_START, None, windows).transform(exported_of)

    def next_cut(self, prev: ExportProgress | None, changed: int | None = None) -> Cut | str:
        """What gold holds for windows closed since the batch before (``prev``) and corrections for
        late counts in windows closed before it (rows to send, and those held back); or why there
        is none. ``changed``: the rows of gold's change feed since ``prev`` (None: not known)."""
        g = self.config.gold
        version = self.tables.version(GOLD_PROPERTY_VALUES)
        assert version is not None  # the runner ensured it
        if prev is None:
            # The first export (or the first since the lake kept its progress): all of gold. Not
            # cached: the newest event time reads one column, the cut reads gold once.
            gold = self.tables.read(GOLD_PROPERTY_VALUES)
            newest = newest_event(gold, None)
            exported = self.sent_in(None)
        else:
            # Only what changed: the windows closed since the last batch, and the tuples of
            # windows closed before it that gold's change feed shows late counts for.
            newest, windows, late = self.changes_since(prev, version, changed)
            exported = self.sent_in(windows)
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
        # A cached change feed the cut reads its late keys from is released once the batch is sent.
        return Cut(cut, bounds.closed_before, newest, bounds.through, version)


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


class _NothingToSend(Exception):
    """A batch its outbox write counted no row to send in: its files are not committed."""


def _export(
    export: PropertyValuesExport, seq: int, prev: ExportProgress | None, changed: int | None, record: FlowRecord
) -> None:
    """Batch ``seq`` cut, gated, written to the outbox, sent and recorded (:func:`property_values`)."""
    run, tables = export.run, export.tables
    cut = export.next_cut(prev, changed)
    if isinstance(cut, str):
        record.noop(cut)
        return
    record.add(source_to=cut.gold_version)
    if cut.closed_before is not None:
        record.add(watermark_epoch_s=cut.closed_before.timestamp())
    # A small increment (a few changes since the last batch), or a store that commits inside its
    # write: the cut is counted first, from a cache, and a small batch is written by the driver. A
    # large one is counted by the write itself, which commits nothing if it sends no row.
    counted_first = (changed is not None and changed <= HELD_CHANGE_ROWS) or not tables.checks_before_commit
    batch = _counted(export, cut, seq) if counted_first else _observed(export, cut, seq)
    if batch.figures is not None and batch.figures.rows == 0:
        _nothing(record, batch.gated)
        return
    gate = run.gate(EXPORT_DATASET, batch.rows, AppTxn(APP, seq))
    # Sent from the outbox commit's files where the store reads a commit's files (by path); tables
    # by name are read through the catalog only, so their batches are sent sorted by key.
    in_files = tables.streams_commit_files(EXPORT_OUTBOX)
    app = BULK_APP if in_files else APP
    # Provably small (the cut counted at most HELD_BATCH_ROWS rows to send; the gate only drops):
    # collected from the run's cache, as the gate checks them, and written by the driver where the
    # store writes there, with no Spark write job. A larger batch is written by Spark.
    figures = batch.figures
    held = in_files and tables.writes_in_driver and figures is not None and figures.rows <= HELD_BATCH_ROWS

    def write(rows: DataFrame, passed: Callable[[], None] | None) -> int:
        def before_commit() -> None:
            if passed is not None:
                passed()
            if batch.counted is not None and not batch.counted().sent.rows:
                raise _NothingToSend

        check = before_commit if passed is not None or batch.counted is not None else None
        return tables.append(EXPORT_OUTBOX, rows.toArrow() if held else rows, [AppTxn(app, seq)], check)

    try:
        outbox_version = gate.write_staged(write)
    except _NothingToSend:
        _nothing(record, batch.counted().gated if batch.counted else 0)
        return
    # The outbox is what ClickHouse holds once it commits, so the cut, evaluated again, is empty:
    # what a batch sends (and figures not counted by its write) is the outbox's rows of the batch.
    recorded = export.recorded(seq)
    figures_sent = _sent_figures(batch, gate, record, recorded)
    sent = export.deliver(seq, app, recorded, figures_sent, outbox_version if in_files else None)
    export.record.release()
    record.rows(sent, sent)
    record.say(
        f"export: batch {seq}: {sent:,} rows to ClickHouse {clickhouse.PROPERTY_VALUES_TABLE} "
        f"({int(record.figure('late_corrections')):,} corrections, {int(record.figure('gated')):,} gated)"
        + (" (drained)" if run.options.drain else "")
    )


def _sent_figures(batch: Batch, gate: WriteGate, record: FlowRecord, recorded: DataFrame) -> BatchFigures:
    """The figures of what a batch's outbox write kept: as counted before it or by it (its gated and
    dropped rows to ``record``); counted again from the ``recorded`` rows where a gate's drop check
    kept fewer rows."""
    figures = batch.figures
    if batch.counted is not None:
        counted = batch.counted()
        figures = counted.sent
        record.add(gated=counted.gated, top_values_dropped=counted.dropped)
    if figures is None or not gate.kept_all:
        figures = batch_figures(recorded)
    return figures


def _counted(export: PropertyValuesExport, cut: Cut, seq: int) -> Batch:
    """The batch of ``cut``, cached and counted first (one pass that fills the cache)."""
    whole = export.record.cache(cut.rows)
    figures = cut_figures(whole)
    export.record.add(gated=figures.gated, top_values_dropped=figures.dropped)
    # A view of the cached batch, not cached again: the gate checks it as the outbox write reads it.
    return Batch(_outbox_rows(whole, cut, seq), figures.sent, figures.gated)


def _observed(export: PropertyValuesExport, cut: Cut, seq: int) -> Batch:
    """The batch of ``cut``, counted by the outbox write as it reads it (no pass of its own)."""
    record = export.record
    observed = record.observe("cut", cut.rows, **cut_figure_columns())
    counted = functools.cache(lambda: cut_figures_of(record.observed("cut", query=False)))
    return Batch(_outbox_rows(observed, cut, seq), None, counted=counted)


def _outbox_rows(cut_rows: DataFrame, cut: Cut, seq: int) -> DataFrame:
    """The rows of ``cut`` (``cut_rows``: its rows as counted) the outbox records as batch ``seq``:
    those neither gated nor dropped."""
    sendable = cut_rows.where("NOT _gated AND NOT _dropped").drop("_gated", "_dropped")
    return sendable.transform(outbox_rows(seq, cut.gold_version, cut.newest, cut.through))


def _nothing(record: FlowRecord, gated: int) -> None:
    record.add(gated=gated)
    record.noop("no closed window has counts to export" + (f" ({gated:,} gated)" if gated else ""))
