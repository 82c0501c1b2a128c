"""The ingest runner: land files and Kafka messages in bronze as they came, each batch exactly once.

The ingest flows (``ingest.kafka``, ``ingest_file.<kind>``) start at the edge: a consumer group or
files given on the command line. What each kind lands is its :class:`Kind`, bronze's parse and
checks (Context-free, in bronze/); this module reads the source, gates the parsed rows and commits
them with their offsets or file digests, as :mod:`pipelines.runtime.incremental` does for the other flows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from bronze.event_values import ParsedValues, parse_event_values
from bronze.events import BRONZE_EVENTS_COLUMNS, duplicate_keys, parse_events
from bronze.landing import REASON, quarantined, valid
from bronze.page_changes import BRONZE_PAGE_CHANGES_COLUMNS, parse_page_changes
from pipelines.config.spark import observed_as_read
from pipelines.errors import InputError
from pipelines.flows import flow_names
from pipelines.runtime import quality
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.progress import append_once
from pipelines.runtime.runner import Context, run_job

if TYPE_CHECKING:
    from expectations.in_write import InWrite
from pipelines.runtime.tables import BRONZE_EVENTS, BRONZE_PAGE_CHANGES, BRONZE_QUARANTINE
from pipelines.sources.files import LandingFile, compression_of, file_digests, landing_rows
from pipelines.storage import AppTxn, TableSpec


@dataclass(frozen=True)
class Kind:
    """What bronze lands for one kind of document: its table, its parse and columns, and what of
    bronze's checks it adds."""

    target: TableSpec
    #: ``max_bytes`` -> landing rows -> parsed rows (with ``REASON`` for the ones quarantined).
    parse: Callable[[int], Callable[[DataFrame], DataFrame]]
    columns: list[str]
    #: Parsed rows -> whether the row's document repeats a key (counted as ``duplicate_keys``).
    repeats_keys: Callable[[DataFrame], Column] | None = None
    #: Parses message values in this process (``kafka.parse_in_process``), without Spark.
    parse_values: Callable[[Sequence[bytes | None], int], ParsedValues] | None = None


KINDS = {
    "events": Kind(
        BRONZE_EVENTS,
        parse_events,
        BRONZE_EVENTS_COLUMNS,
        repeats_keys=lambda parsed: duplicate_keys(parsed["raw"]),
        parse_values=parse_event_values,
    ),
    "page_changes": Kind(BRONZE_PAGE_CHANGES, parse_page_changes, BRONZE_PAGE_CHANGES_COLUMNS),
}


@dataclass
class Landed:
    """Landing rows parsed once: rows for the bronze table and rows for the quarantine.

    Both derive from one cached parse. The pass that fills the cache counts the rows parsed and
    the messages that repeat a key as it reads them (``DataFrame.observe``): :meth:`count` them
    once a first action has read the rows, then :meth:`release` the cache.
    """

    good: DataFrame
    bad: DataFrame
    cached: DataFrame
    observed: Callable[[], dict[str, Any]]
    #: Whether a pass has read the rows (the gate's): the figures are then known.
    read: bool = False
    #: Good rows the gate's ``drop`` checks moved to ``bad`` (at most: a row failing two counts twice).
    dropped: int = 0

    @functools.cached_property
    def figures(self) -> dict[str, Any]:
        """The observed figures, taken once (where no pass gave them, one query counts them)."""
        return self.observed()

    def none_bad(self) -> bool:
        """Whether the batch is known to hold no row for the quarantine, with no pass of its own."""
        return self.read and not self.dropped and not self.figures["bad"]

    def count(self, record: RunRecord) -> int:
        """The rows parsed (good and bad); the repeated keys go into ``record``."""
        figures = self.figures
        if "duplicate_keys" in figures:
            record.incr(duplicate_keys=int(figures["duplicate_keys"]))
        return int(figures["rows"])

    def release(self) -> None:
        self.cached.unpersist()


def parse_landing(
    ctx: Context, record: RunRecord, kind: str, landing: pa.Table | DataFrame, gate: bool = True
) -> Landed:
    """Landing rows -> the rows for the bronze table of ``kind`` and for the quarantine, one parse.

    The parsed rows are validated with the bronze table's suite (unless ``gate`` is False: the
    caller validates them); rows a ``drop`` expectation removes join the quarantine rows, so both
    land in the same commits as the batch.
    """
    spec = KINDS[kind]
    target = spec.target
    rows = ctx.spark.createDataFrame(landing) if isinstance(landing, pa.Table) else landing
    parsed = rows.transform(spec.parse(ctx.settings.kafka.max_message_bytes))
    counted = {"rows": F.count(F.lit(1)), "bad": F.count_if(F.col(REASON).isNotNull())}
    if spec.repeats_keys is not None:
        counted["duplicate_keys"] = F.count_if(F.col(REASON).isNull() & spec.repeats_keys(parsed))
    observed, figures = observed_as_read(parsed, **counted)
    parsed = observed.persist()
    landed = Landed(valid(parsed, spec.columns), quarantined(parsed, kind), parsed, figures)
    if gate and quality.enabled(ctx):
        try:
            checked = quality.run_suite(ctx, record, quality.suite_for(ctx, target.key).for_batches(), landed.good)
        except BaseException:
            landed.release()  # a failing gate: nothing is written, and the cache is not the caller's
            raise
        landed.good, landed.read, landed.dropped = checked.kept, True, checked.dropped_rows
        if checked.dropped is not None:
            landed.bad = landed.bad.unionByName(quality.to_quarantine(checked.dropped, kind, landed=True))
    return landed


def _of(files: Sequence[tuple[LandingFile, AppTxn]]) -> Column:
    return F.col("source_file").isin([str(b.path) for b, _ in files])


def _rows_by_file(rows: DataFrame) -> dict[str, int]:
    # One row per landed file: a figure, not row data.
    return {r["source_file"]: int(r["count"]) for r in rows.groupBy("source_file").count().collect()}


def _files_to_land(
    ctx: Context, record: RunRecord, kind: str, readable: Sequence[Path]
) -> list[tuple[LandingFile, AppTxn]]:
    """The files not landed before (by content), each with the app transaction that records it;
    a file landed before, or twice in this call, is counted as skipped."""
    target = KINDS[kind].target
    files: list[tuple[LandingFile, AppTxn]] = []
    for f in file_digests(readable):
        txn = AppTxn(f"medallion/ingest-file/{kind}/{f.digest}", 0, once=True)
        seen = any(b.digest == f.digest for b, _ in files)
        if seen or ctx.store.txn_version(target, txn.app_id) is not None:
            record.incr(files_skipped=1)
            continue
        files.append((f, txn))
    return files


def _commit_files(
    ctx: Context, record: RunRecord, target: TableSpec, files: Sequence[tuple[LandingFile, AppTxn]], landed: Landed
) -> tuple[int, int]:
    """The landed rows of ``files`` committed with their files' transactions; (good, quarantined)."""
    # Quarantined rows per file (one small row per file): files with none get no quarantine
    # commit. A batch the gate's pass showed to hold none needs no query for it.
    bad_by_file = {} if landed.none_bad() else _rows_by_file(landed.bad)
    n_bad = sum(bad_by_file.values())
    # Every parsed row is good or quarantined (a dropped row is one, not the other): the pass
    # that filled the cache counted them, so the good rows need no count of their own.
    n_good = landed.count(record) - n_bad
    # As many files per commit as the engine records app transactions in one. Quarantine
    # rows go first, under their own files' transactions, so a redo after a crash between
    # the two commits finds them recorded and does not quarantine them twice.
    step = ctx.store.max_txns_per_commit or len(files)
    for i in range(0, len(files), step):
        group = files[i : i + step]
        bad = [
            (b, t)
            for b, t in group
            if bad_by_file.get(str(b.path)) and ctx.store.txn_version(BRONZE_QUARANTINE, t.app_id) is None
        ]
        if bad:
            ctx.store.append(BRONZE_QUARANTINE, landed.bad.where(_of(bad)), [t for _, t in bad])
        append_once(ctx.store, target, landed.good.where(_of(group)), [t for _, t in group])
    return n_good, n_bad


def ingest_files(ctx: Context, kind: str, paths: Sequence[Path]) -> RunRecord:
    """Land JSON-lines / JSON-array files into bronze, idempotently per file content."""
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")
    target = KINDS[kind].target
    # A compressed file is refused by name; the other files of the call still land.
    refused = {p: why for p in paths if (why := compression_of(Path(p))) is not None}
    readable = [p for p in paths if p not in refused]

    def body(record: RunRecord) -> None:
        for spec in (target, BRONZE_QUARANTINE):
            ctx.store.ensure(spec)
        if refused:
            record.add(files_refused=len(refused))
        now = datetime.now(UTC)
        files = _files_to_land(ctx, record, kind, readable)
        if not files:
            record.noop("every file was landed before" if readable else "no file could be read")
            return
        # Spark reads the files and splits them into records: no row passes through the driver.
        n_good = n_bad = 0
        # As many files per commit as the engine records app transactions in one.
        step = ctx.store.max_txns_per_commit or len(files)
        for i in range(0, len(files), step):
            group = files[i : i + step]
            landing = landing_rows(ctx.spark, [f for f, _ in group], now)
            good, bad = _land_in_one_pass(ctx, record, kind, group, landing)
            n_good, n_bad = n_good + good, n_bad + bad
        record.rows_in = n_good + n_bad
        record.rows_out = n_good
        record.add(files=len(files), quarantined=n_bad)
        ctx.say(f"landed {n_good:,} {kind} from {len(files)} file(s), {n_bad:,} quarantined")

    record = run_job(ctx, flow_names.ingest_file(kind), body)
    if refused:
        path, why = next(iter(refused.items()))
        more = f" (and {len(refused) - 1} more file(s))" if len(refused) > 1 else ""
        raise InputError(f"{path}: not landed, {why}{more}; the other files were landed ({record.status})")
    return record


def _land_in_one_pass(
    ctx: Context, record: RunRecord, kind: str, files: Sequence[tuple[LandingFile, AppTxn]], landing: DataFrame
) -> tuple[int, int]:
    """Files' landing rows parsed, gated and appended to bronze by one Spark job; (good, quarantined).

    The write counts what it reads (the rows, the quarantined ones, the repeated keys, each check's
    failing rows) and leaves out the rows the parse or a ``drop`` check sends to the quarantine.
    Only where those figures show any are the quarantine's rows written, by a pass of their own
    that parses the files again, and before the bronze commit (between its files and its commit),
    so a redo after a crash between the two finds them recorded and does not quarantine them twice.
    Where the store cannot run a step before its commit (Delta on Spark), or the suite needs the
    whole batch before it is written, the batch is parsed once into a cache (:func:`_land_cached`).
    """
    from expectations.in_write import in_write  # with the gates' modules: imported when a gate runs

    spec = KINDS[kind]
    target = spec.target
    parsed = landing.transform(spec.parse(ctx.settings.kafka.max_message_bytes))
    counted = {"rows": F.count(F.lit(1)), "bad": F.count_if(F.col(REASON).isNotNull())}
    if spec.repeats_keys is not None:
        counted["duplicate_keys"] = F.count_if(F.col(REASON).isNull() & spec.repeats_keys(parsed))
    observed, figures = observed_as_read(parsed, **counted)
    rows = valid(observed, spec.columns)
    checked = None
    if quality.enabled(ctx):
        suite = quality.suite_for(ctx, target.key).for_batches()
        checked = in_write(rows, suite, drops=True, whole=valid(parsed, spec.columns))
    if not ctx.store.checks_before_commit or (checked is None and quality.enabled(ctx)):
        return _land_cached(ctx, record, kind, files, landing)
    if checked is not None:
        rows = checked.rows
    txns = [t for _, t in files]
    n_bad = 0

    def quarantine_first() -> None:
        nonlocal n_bad
        got = figures(query=False)
        if "duplicate_keys" in got:
            record.incr(duplicate_keys=int(got["duplicate_keys"]))
        bad, n_bad = _to_quarantine(ctx, record, kind, parsed, int(got.get("bad", 0)), checked)
        if bad is not None:
            append_once(ctx.store, BRONZE_QUARANTINE, bad, txns)

    try:
        if not append_once(ctx.store, target, rows, txns, before_commit=quarantine_first):
            return 0, 0
    except Exception as exc:
        from expectations.in_write import FAILED_IN_WRITE

        if FAILED_IN_WRITE not in str(exc):
            raise
        # A row failed a ``fail`` check and stopped the write: the batch is validated whole, for
        # the results and the error (nothing was committed).
        return _land_cached(ctx, record, kind, files, landing)
    return int(figures()["rows"]) - n_bad, n_bad


def _to_quarantine(
    ctx: Context, record: RunRecord, kind: str, parsed: DataFrame, n_bad: int, checked: InWrite | None
) -> tuple[DataFrame | None, int]:
    """The quarantine rows of a batch the write counted (None when it holds none) and how many: the
    ``n_bad`` rows the parse refused, and the rows a ``drop`` check left out. The gate's results
    are recorded; a failed ``fail`` check raises, before any commit."""
    bad = quarantined(parsed, kind) if n_bad else None
    if checked is None:
        return bad, n_bad
    validation = checked.validation()
    quality.record_results(record, validation)
    if validation.failed:
        raise quality.ExpectationFailed(validation)
    if not validation.dropped_rows:
        return bad, n_bad
    ctx.say(validation.summary())
    assert validation.dropped is not None
    dropped = quality.to_quarantine(validation.dropped, kind, landed=True)
    return (dropped if bad is None else bad.unionByName(dropped)), n_bad + validation.dropped_rows


def _land_cached(
    ctx: Context, record: RunRecord, kind: str, files: Sequence[tuple[LandingFile, AppTxn]], landing: DataFrame
) -> tuple[int, int]:
    """Files' landing rows parsed once into a cache, gated, and committed; (good, quarantined)."""
    landed = parse_landing(ctx, record, kind, landing)
    try:
        return _commit_files(ctx, record, KINDS[kind].target, files, landed)
    finally:
        landed.release()
