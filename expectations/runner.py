"""Runs a suite and turns the results into warn / drop / fail outcomes: row-level checks as one
aggregation of their predicates, checks on the whole batch through Great Expectations' Spark
datasource.

One ephemeral GX context per process, one dataframe asset per table. Results are asked for in the
``BASIC`` format without sample values: counts are what the outcome needs, and each sample list
costs GX one more Spark job per expectation (failing rows land in the quarantine anyway).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from expectations import batch
from expectations.core import Check, Suite
from expectations.predicates import failing, failing_sums

log = logging.getLogger("medallion")

RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 0}
DROPPED_BY = "_expectation"


@dataclass(frozen=True)
class Result:
    """The outcome of one check on one batch (or table)."""

    dataset: str  # the table validated, layer/name
    expectation: str
    policy: str
    kind: str  # row | batch | figures
    rows_checked: int | None
    rows_failed: int | None
    outcome: str  # passed | warned | dropped | failed
    observed: str | None
    description: str

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


Rows = TypeVar("Rows")


@dataclass
class Validation(Generic[Rows]):
    """A suite's results on a batch, and the batch split by the ``drop`` checks (Spark DataFrames,
    or Arrow tables from :mod:`expectations.arrow`)."""

    suite: Suite
    results: list[Result]
    kept: Rows
    dropped: Rows | None  # failing rows with the first failed check's name in ``_expectation``
    seconds: float

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.outcome == "failed"]

    @property
    def dropped_rows(self) -> int:
        return sum(r.rows_failed or 0 for r in self.results if r.outcome == "dropped")

    def summary(self) -> str:
        bad = [r for r in self.results if r.outcome != "passed"]
        if not bad:
            return f"{self.suite.table}: {len(self.results)} expectations passed"
        return f"{self.suite.table}: " + "; ".join(describe(r) for r in bad)


def describe(r: Result) -> str:
    counted = f"{r.rows_failed:,} of {r.rows_checked:,} rows" if r.rows_failed is not None and r.rows_checked else ""
    seen = r.observed or counted
    return f"{r.expectation} ({r.description}) {r.outcome}" + (f": {seen}" if seen else "")


@functools.cache
def _context() -> Any:  # GX is imported by the first check that runs through it (see validate)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


@functools.cache
def _datasource() -> Any:
    # persist=False: GX would cache every validated frame and never release it (a long ingest ran out of heap).
    return _context().data_sources.add_spark("medallion", persist=False)


@functools.cache
def _batch_definition(name: str) -> Any:  # a GX BatchDefinition
    return _datasource().add_dataframe_asset(name).add_batch_definition_whole_dataframe("batch")


CHECK_META = "medallion_check"
_GX_LOCK = threading.RLock()


def _release_batches() -> None:
    """Drop GX's references to the frames it validated (its batch caches keep every one)."""
    manager = _datasource().get_execution_engine().batch_manager
    manager.reset_batch_cache()
    manager._batch_data_cache.clear()
    manager._active_batch_data_id = None


def _run_gx(df: DataFrame, checks: list[Check], name: str) -> list[Any]:
    """GX results in the order of ``checks`` (each expectation carries its check's name in ``meta``)."""
    import great_expectations as gx

    tagged = [c.expectation.copy(update={"meta": {CHECK_META: c.name}}, deep=True) for c in checks]
    suite = gx.ExpectationSuite(name=name, expectations=tagged)
    # One GX context serves the process, and neither its assets nor its batch caches are safe to
    # share between threads (jobs run side by side in one process, e.g. bucket tasks): one at a time.
    with _GX_LOCK:
        batch = _batch_definition(name).get_batch(batch_parameters={"dataframe": df})
        try:
            results = batch.validate(suite, result_format=RESULT_FORMAT).results
        finally:
            _release_batches()
    by_check = {(r.expectation_config.meta or {})[CHECK_META]: r for r in results if r.expectation_config}
    return [by_check[c.name] for c in checks]


def _counts(check: Check, result: Any, rows: int | None) -> tuple[int | None, int | None, str | None]:
    """(rows checked, rows failed, observed) from a GX result."""
    info = result.result or {}
    if "unexpected_count" in info:
        return info.get("element_count", rows), int(info["unexpected_count"] or 0), None
    observed = info.get("observed_value")
    if check.expects.kind == "UnexpectedRowsExpectation":
        return rows, int(observed or 0), None
    return (
        rows,
        None,
        None if observed is None else f"observed {observed:,}" if isinstance(observed, int | float) else str(observed),
    )


def total_result(suite: Suite, check: Check, rows: int | None, value: int) -> Result:
    """The result of a check on a total of the batch (a sum) that came out ``value``."""
    return batch_result(suite, check, rows, None, check.total_holds(value), f"observed {value:,}")


def _exception(info: Any) -> str | None:
    """The message of an exception GX caught while computing a result (flat or per metric)."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    nested = [_exception(v) for v in info.values() if isinstance(v, dict)]
    return next((m for m in nested if m), None)


def _figures_text(figures: DataFrame, check: Check) -> str:
    """The two figures a pair check compared, for the results table."""
    return _pair_text(figures.first(), check)


def _pair_text(row: Any, check: Check) -> str:
    names = [check.expects.get("column_A"), check.expects.get("column_B")]
    return " vs ".join(f"{n} {row[n]:,}" if row and row[n] is not None else f"{n} -" for n in names)


def _figures_results(suite: Suite, figures: DataFrame, checks: list[Check]) -> list[Result]:
    """The checks that two figures are equal, on the one row of figures read once (GX would run
    jobs per check on it); as GX counts them, a row where both figures are missing passes."""
    pairs = [c for c in checks if c.expects.kind == "ExpectColumnPairValuesToBeEqual"]
    if not pairs:
        return []
    row = figures.first()  # one row of figures from several tables
    results = []
    for check in pairs:
        a, b = (row[check.expects.get(n)] if row else None for n in ("column_A", "column_B"))
        n_failed = 0 if row is None or a == b else 1
        observed = _pair_text(row, check)
        results.append(
            Result(
                suite.table,
                check.name,
                check.policy,
                "figures",
                None,
                n_failed,
                outcome(check, not n_failed),
                observed,
                check.description,
            )
        )
    return results


def batch_result(
    suite: Suite, check: Check, rows: int | None, failed: int | None, success: bool, observed: str | None
) -> Result:
    """The result of a check on the whole batch that Spark counted (a total, a query's rows)."""
    return Result(
        suite.table,
        check.name,
        check.policy,
        "batch",
        rows,
        failed,
        outcome(check, success),
        observed,
        check.description,
    )


def outcome(check: Check, success: bool) -> str:
    if success:
        return "passed"
    return {"warn": "warned", "drop": "dropped", "fail": "failed"}[check.policy]


def row_counts(
    df: DataFrame, suite: Suite, checks: list[Check], totals: Sequence[Check] = ()
) -> tuple[int, list[int], list[int]]:
    """The batch's rows, the failing rows of each row-level check and the value of each check on a
    total (:attr:`Check.total`), in one pass over it.

    GX would run one or more Spark jobs per expectation; the checks' own predicates (the ones a
    ``drop`` filters on) and totals are computed in one aggregation instead. A predicate Spark
    cannot resolve (a missing column) raises, naming the check.
    """
    from pyspark.errors import AnalysisException

    columns = [
        *zip(checks, failing_sums(checks), strict=True),
        *((c, F.expr(c.total or "").cast("long").alias(f"_t{i}")) for i, c in enumerate(totals)),
    ]
    try:
        counted = df.agg(F.count(F.lit(1)).alias("_rows"), *(col for _, col in columns)).first()  # one row
    except AnalysisException:
        # Name the check: resolve each column alone (planning only, no Spark job).
        for check, col in columns:
            try:
                df.agg(col).schema  # noqa: B018 - resolving the column is the check
            except AnalysisException as exc:
                raise RuntimeError(f"{suite.table}: expectation {check.name} could not run: {exc}") from None
        raise
    assert counted is not None
    return (
        int(counted["_rows"]),
        [int(counted[f"_f{i}"]) for i in range(len(checks))],
        [int(counted[f"_t{i}"]) for i in range(len(totals))],
    )


def row_results(suite: Suite, checks: list[Check], rows: int, failed_rows: list[int]) -> list[Result]:
    return [
        Result(
            suite.table,
            check.name,
            check.policy,
            "row",
            rows,
            n_failed,
            outcome(check, n_failed == 0),
            None,
            check.description,
        )
        for check, n_failed in zip(checks, failed_rows, strict=True)
    ]


def validate(
    df: DataFrame, suite: Suite, figures: DataFrame | None = None, rows: int | None = None
) -> Validation[DataFrame]:
    """Run ``suite`` on ``df`` (persist it first: it is read more than once) and split off drops.

    Row-level checks are counted in one pass (:func:`row_counts`), uniqueness and ``no_rows``
    checks in one query (:mod:`expectations.batch`), pair checks on the one row of figures in
    Python; other checks on the whole batch run through GX. Checks ``on="figures"`` run on
    ``figures`` (one row of numbers from several tables) when given, else they are skipped. A
    check that cannot be evaluated (a missing column, a bad query) raises: a broken check must
    not pass silently.
    """
    t0 = time.perf_counter()
    by_name: dict[str, Result] = {}
    row_checks = [c for c in suite.checks if c.on == "rows" and c.row_level]
    total_checks = [c for c in suite.checks if c.on == "rows" and c.total is not None]
    if row_checks or total_checks:
        rows, failed_rows, totals = row_counts(df, suite, row_checks, total_checks)
        by_name.update((r.expectation, r) for r in row_results(suite, row_checks, rows, failed_rows))
        for check, value in zip(total_checks, totals, strict=True):
            by_name[check.name] = total_result(suite, check, rows, value)
    on_batch = [c for c in suite.checks if c.on == "rows" and not c.row_level and c.total is None]
    counted = [(c, q) for c in on_batch if (q := batch.failing_rows_query(c)) is not None]
    if counted:
        batch_rows, failing = batch.counts(df, counted, suite.table, with_rows=rows is None)
        rows = batch_rows if rows is None else rows
        for (check, _), n_failed in zip(counted, failing, strict=True):
            by_name[check.name] = batch_result(suite, check, rows, n_failed, n_failed == 0, None)
    on_figures = [c for c in suite.checks if c.on == "figures"]
    if figures is not None and on_figures:
        by_name.update((r.expectation, r) for r in _figures_results(suite, figures, on_figures))
    for frame, checks in (
        (df, [c for c in on_batch if c.name not in by_name]),
        (figures, [c for c in on_figures if c.name not in by_name]),
    ):
        if frame is not None and checks:
            rows = _gx_results(suite, frame, frame is df, checks, figures, rows, by_name)
    results = [by_name[c.name] for c in suite.checks if c.name in by_name]
    kept, dropped = split(df, suite, results)
    return Validation(suite, results, kept, dropped, time.perf_counter() - t0)


def _gx_results(
    suite: Suite,
    frame: DataFrame,
    is_batch: bool,
    checks: list[Check],
    figures: DataFrame | None,
    rows: int | None,
    by_name: dict[str, Result],
) -> int | None:
    """``checks`` run through GX on ``frame`` (the batch, else the figures), their results put in
    ``by_name``; returns the batch's row count, taken from GX's when it was not known yet."""
    name = suite.table.replace("/", "__") + ("" if is_batch else "__figures")
    for check, res in zip(checks, _run_gx(frame, checks, name), strict=True):
        error = None if res.success else _exception(res.exception_info)
        if error:
            raise RuntimeError(f"{suite.table}: expectation {check.name} could not run: {error}")
        checked, failed, observed = _counts(check, res, rows)
        if check.on == "figures" and figures is not None:
            observed = _figures_text(figures, check)
        if rows is None and checked is not None and is_batch:
            rows = checked
        by_name[check.name] = Result(
            suite.table,
            check.name,
            check.policy,
            "figures" if check.on == "figures" else "batch",
            checked if is_batch else None,
            failed,
            outcome(check, bool(res.success)),
            observed,
            check.description,
        )
    return rows


def first_failed(checks: Sequence[Check]) -> Column:
    """The name of the first of ``checks`` a row fails, else null."""
    return F.coalesce(*(F.when(failing(c), F.lit(c.name)) for c in checks))


def split(df: DataFrame, suite: Suite, results: list[Result]) -> tuple[DataFrame, DataFrame | None]:
    """(rows to write, rows the failed ``drop`` checks remove, tagged with the check's name)."""
    by_name = {c.name: c for c in suite.checks}
    drops = [by_name[r.expectation] for r in results if r.outcome == "dropped"]
    if not drops:
        return df, None
    tagged = df.withColumn(DROPPED_BY, first_failed(drops))
    return tagged.where(F.col(DROPPED_BY).isNull()).drop(DROPPED_BY), tagged.where(F.col(DROPPED_BY).isNotNull())
