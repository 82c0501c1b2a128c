"""Data-quality gates: validate a batch before it is written, and whole tables on demand.

A gate runs the table's suite (``expectations/``) with the policies from settings on the persisted
batch. ``fail`` raises before anything is written (the run is recorded as failed, with its
results); ``drop`` returns the batch without the failing rows, which go to ``bronze/quarantine``
with the expectation's name; ``warn`` only records. Results are added to the run's record and land
in ``_meta/expectation_results`` with the event-log row.

Great Expectations is imported on first use: it takes seconds, and most commands never validate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bronze.landing import LANDING_COLUMNS, QUARANTINE_SCHEMA, RAW
from bronze.primitives import DROPPED_REASON, quarantine_row
from pipelines.errors import MedallionError, SettingsError
from pipelines.runtime.eventlog import RunRecord
from pipelines.runtime.flow_types import Frames, TableCheck, WriteGate
from pipelines.runtime.progress import append_once
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_QUARANTINE, suite_params
from pipelines.runtime.tables import table as spec_of
from pipelines.storage import AppTxn
from pipelines.storage.conform import conform

log = logging.getLogger("medallion")

if TYPE_CHECKING:
    from expectations.core import Suite
    from expectations.runner import Validation


class ExpectationFailed(MedallionError):
    """A ``fail`` expectation did not hold: the run stops before it writes."""

    def __init__(self, validation: Validation) -> None:
        from expectations.runner import describe

        self.validation = validation
        lines = [describe(r) for r in validation.failed]
        super().__init__(f"{validation.suite.table}: expectation failed, nothing written: " + "; ".join(lines))


def enabled(ctx: Context) -> bool:
    return ctx.settings.quality.enabled


_preloading: list[threading.Thread] = []


def preload() -> None:
    """Import the gates' modules in the background while Spark starts.

    Not Great Expectations: importing it takes 3.5-4 CPU-seconds, and no check of the shipped
    suites runs through it (Spark or Arrow counts each: :func:`expectations.runner.validate`).
    The first check that does imports it."""

    def load() -> None:
        try:
            from expectations.arrow import validate_arrow  # noqa: F401  (the Kafka flushes' gates)
            from expectations.runner import validate  # noqa: F401
        except Exception:  # the first gate imports them again and reports what is wrong
            log.debug("preloading the gates failed", exc_info=True)

    thread = threading.Thread(target=load, name="gates-preload", daemon=True)
    thread.start()
    _preloading.append(thread)


def wait_preloaded(timeout: float = 120.0) -> None:
    """Wait for :func:`preload` (if it ran) to finish."""
    for thread in _preloading:
        thread.join(timeout)


def suite_for(ctx: Context, table: str, **params: Any) -> Suite:
    """The suite of ``table`` with the policies from settings (bad policy settings raise)."""
    from expectations.core import PolicyError
    from expectations.suites import SUITES

    params = {**suite_params(table, ctx.settings), **params}
    try:
        return SUITES[table](**params).with_policies(ctx.settings.quality.policies)
    except PolicyError as exc:
        raise SettingsError(exc.problems) from None


def check_policies(ctx: Context) -> None:
    """Raise a SettingsError for a policy naming an unknown table or expectation."""
    from expectations.suites import SUITES

    known = set(SUITES)
    unknown = sorted({k.partition(":")[0] for k in ctx.settings.quality.policies} - known)
    if unknown:
        raise SettingsError(
            [f"MEDALLION_QUALITY__POLICIES: no suite for {', '.join(unknown)}; suites: {', '.join(sorted(known))}"]
        )
    for table in known:
        suite_for(ctx, table)


def record_results(record: RunRecord, validation: Validation) -> None:
    record.quality.extend(r.as_row() for r in validation.results)
    failed_rows = sum(r.rows_failed or 0 for r in validation.results if r.outcome != "passed")
    key = validation.suite.table
    record.incr(**{"quality.seconds": validation.seconds})
    record.add(**{f"quality.{key}.failed_rows": failed_rows, f"quality.{key}.dropped_rows": validation.dropped_rows})
    checked = [r.rows_checked for r in validation.results if r.kind != "figures" and r.rows_checked is not None]
    if checked:
        record.add(**{f"quality.{key}.rows": max(checked)})


def run_suite(
    ctx: Context, record: RunRecord, suite: Suite, df: DataFrame, figures: DataFrame | None = None
) -> Validation:
    """Validate ``df`` (already persisted) with ``suite``; record results; raise on a ``fail``."""
    from expectations.runner import validate

    validation = validate(df, suite, figures)
    record_results(record, validation)
    if validation.failed:
        raise ExpectationFailed(validation)
    if validation.dropped is not None:
        ctx.say(validation.summary())
    return validation


def gate(ctx: Context, record: RunRecord, table: str, df: DataFrame, txn: AppTxn | None, **params: Any) -> DataFrame:
    """The rows of ``df`` to write into ``table``: validated, failing ``drop`` rows quarantined.

    ``txn`` is the app transaction of the write the batch is for; the quarantined rows are
    appended under ``<app id>#dropped`` at the same version, so a redo after a crash does not
    quarantine them twice.
    """
    if not enabled(ctx):
        return df
    validation = run_suite(ctx, record, suite_for(ctx, table, **params).for_batches(), df)
    if validation.dropped is not None:
        rows = to_quarantine(validation.dropped, table)
        if txn is None:
            ctx.store.append(BRONZE_QUARANTINE, rows)
        else:
            append_once(ctx.store, BRONZE_QUARANTINE, rows, AppTxn(f"{txn.app_id}#dropped", txn.version))
    return validation.kept


def gate_in_write(
    ctx: Context,
    record: RunRecord,
    table: str,
    df: DataFrame,
    txn: AppTxn | None,
    before_commit: bool = False,
    **params: Any,
) -> WriteGate:
    """The gate of a batch appended to ``table``, checked by the write where the suite allows it.

    A suite of row-level checks without ``drop`` is counted as the rows are written, and a row
    failing a ``fail`` check stops the write before its commit (:func:`expectations.in_write.in_write`):
    one pass over the batch instead of two. With ``before_commit`` (the store can run a check
    between writing the files and committing them), checks on a total of the batch are counted by
    the write too and judged before the commit. A parameter given as a callable is a figure the
    same write observes (the batch's fanned-out tuples), read once it has run. Otherwise (a check
    on the whole batch, a ``drop``) the batch is cached and validated first, as :func:`gate` does.
    Call ``passed`` after the write (or before its commit), ``failed`` when the write raised: it
    raises :class:`ExpectationFailed` if a check stopped it."""
    from expectations.in_write import FAILED_IN_WRITE, in_write

    def nothing() -> None:
        pass

    if not enabled(ctx):
        return WriteGate(df, nothing, nothing)

    def suite(known: bool) -> Suite:
        given = {k: ((v() if known else 0) if callable(v) else v) for k, v in params.items()}
        return suite_for(ctx, table, **given).for_batches()

    checked = in_write(df, suite(known=False), totals=before_commit)
    if checked is None:
        # Read more than once: cached here unless the caller cached it (and releases it itself).
        mine = not df.storageLevel.useMemory and not df.storageLevel.useDisk
        cached = df.persist() if mine else df

        def release() -> None:
            if mine:
                cached.unpersist()

        if any(callable(v) for v in params.values()):
            cached.count()  # fills the cache; the figures the batch's parameters come from are observed
        kept = gate(ctx, record, table, cached, txn, **{k: (v() if callable(v) else v) for k, v in params.items()})
        return WriteGate(kept, nothing, nothing, kept_all=kept is cached, release=release)

    def passed() -> None:
        validation = checked.validation(suite(known=True))
        record_results(record, validation)
        if validation.failed:  # a check the write could not stop on (a total), or a failing row it did not
            raise ExpectationFailed(validation)

    def failed() -> None:
        # The write stopped on a failing row (the error text is the only sign it gives): the
        # batch is validated for the whole results, which raise with them.
        run_suite(ctx, record, suite(known=True), df)
        raise RuntimeError(f"{table}: the write stopped on a failing row, yet the batch validates: {FAILED_IN_WRITE}")

    return WriteGate(checked.rows, passed, failed, before_commit=before_commit)


def gate_arrow(ctx: Context, record: RunRecord, table: str, rows: pa.Table, kind: str) -> tuple[pa.Table, pa.Table]:
    """Rows born in this process (a Kafka flush) -> (rows to write, quarantine rows of the ``drop``
    checks), validated in Arrow when every check of the suite has an Arrow form, else in Spark.
    Results are recorded as :func:`gate` records them; a ``fail`` raises before anything is written."""
    empty = BRONZE_QUARANTINE.arrow_schema.empty_table()
    if not enabled(ctx):
        return rows, empty
    from expectations.arrow import validate_arrow
    from expectations.runner import DROPPED_BY

    suite = suite_for(ctx, table).for_batches()
    validation = validate_arrow(rows, suite)
    if validation is None:  # a check Arrow cannot run: the batch goes through Spark
        # The rows came from this process (one flush, bounded by --max-batch) and go back to it.
        df = ctx.spark.createDataFrame(rows).persist()
        checked = run_suite(ctx, record, suite, df)
        kept = checked.kept.toArrow()
        dropped = None if checked.dropped is None else to_quarantine(checked.dropped, kind, landed=True).toArrow()
        df.unpersist()
        return kept, dropped if dropped is not None else empty
    record_results(record, validation)
    if validation.failed:
        raise ExpectationFailed(validation)
    if validation.dropped is None:
        return validation.kept, empty
    ctx.say(validation.summary())
    gone = validation.dropped
    n = gone.num_rows
    before, after = DROPPED_REASON
    quarantine = quarantine_row(
        pa.array([kind] * n, pa.string()),
        pc.cast(gone[RAW], pa.binary()),
        pc.binary_join_element_wise(before, gone[DROPPED_BY], after, ""),
        gone[DROPPED_BY],
        {c: gone[c] if c in gone.column_names else pa.nulls(n) for c in LANDING_COLUMNS},
        LANDING_COLUMNS,
    )
    return validation.kept, conform(pa.table(quarantine), BRONZE_QUARANTINE.arrow_schema)


def to_quarantine(dropped: DataFrame, kind: str, landed: bool = False) -> DataFrame:
    """Rows a ``drop`` expectation removed, in the quarantine table's shape.

    ``raw`` is the row as it was: for ``landed`` rows (bronze's, as they landed) the landed text,
    further down the row as JSON (a silver event's with the message it came in among its fields).
    """
    from expectations.runner import DROPPED_BY

    columns = set(dropped.columns)
    data = [c for c in dropped.columns if c != DROPPED_BY]
    raw = F.col(RAW) if landed else F.to_json(F.struct(*data))
    before, after = DROPPED_REASON
    row = quarantine_row(
        F.lit(kind),
        F.encode(raw.cast("string"), "UTF-8"),
        F.concat(F.lit(before), F.col(DROPPED_BY), F.lit(after)),
        F.col(DROPPED_BY),
        {c: (F.col(c) if c in columns else F.lit(None)).cast(QUARANTINE_SCHEMA[c].dataType) for c in LANDING_COLUMNS},
        LANDING_COLUMNS,
    )
    return dropped.select(*(v.alias(k) for k, v in row.items()))


# -- whole tables ---------------------------------------------------------------------------------
@dataclass
class TableValidation:
    table: str
    validation: Validation | None
    note: str | None = None  # why a table or a check was skipped


def validate_tables(
    ctx: Context, record: RunRecord, tables: Sequence[str], checks: Mapping[str, TableCheck]
) -> list[TableValidation]:
    """Validate whole tables (and their cross-table figures); failures are reported, not raised.
    ``checks``: how to read a table with the figures that tie it to its sources (a conservation
    check its flow declares, :func:`pipelines.flows.checks`); a table without one is read alone."""
    from expectations.runner import validate
    from expectations.suites import SUITES
    from pipelines.errors import InputError

    unknown = [t for t in tables if t not in SUITES]
    if unknown:
        raise InputError(f"no suite for {', '.join(unknown)}; suites: {', '.join(SUITES)}")
    out = []
    for table in tables or list(SUITES):
        check = checks.get(table)
        loaded = check(ctx.store, ctx.settings) if check is not None else _table_alone(ctx, table)
        if loaded is None:
            out.append(TableValidation(table, None, "table does not exist yet"))
            continue
        df, figures, params, note = loaded
        df = df.persist()
        try:
            validation = validate(df, suite_for(ctx, table, **params).for_tables(), figures)
        finally:
            df.unpersist()
        record_results(record, validation)
        out.append(TableValidation(table, validation, note))
    return out


def _table_alone(ctx: Context, table: str) -> Frames | None:
    """A table as its suite checks it when no flow adds figures to it: the table alone."""
    spec = spec_of(table)
    if not ctx.store.exists(spec):
        return None
    return ctx.store.read(spec), None, {}, None
