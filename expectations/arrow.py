"""A suite evaluated on an Arrow table in one vectorised pass, for batches born in the process
(a Kafka flush) that would otherwise go to Spark only to be checked.

It covers the expectation kinds the batch gates use: values not null, between bounds, in a set, and
unique (one column or several, rows with a missing value not compared), with Great Expectations'
counts and outcomes. A suite with any other check gets None: the caller validates it in Spark.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from expectations.core import Check, Expects, Suite
from expectations.runner import DROPPED_BY, Result, Validation, outcome


def _passing(check: Check, table: pa.Table) -> pa.ChunkedArray | None:
    """True for each row that passes a row-level check (nulls pass, as in GX), or None when the
    check has no Arrow form."""
    e = check.expects
    if e.kind == "ExpectColumnValuesToNotBeNull":
        return pc.is_valid(table[e.get("column")])
    if e.kind == "ExpectColumnValuesToBeBetween" and _not_strict(e):
        column = table[e.get("column")]
        ok = pc.is_null(column)
        within = pa.chunked_array([pa.array([True] * len(table), pa.bool_())])
        low, high = e.get("min_value"), e.get("max_value")
        if low is not None:
            within = pc.and_(within, pc.greater_equal(column, low))
        if high is not None:
            within = pc.and_(within, pc.less_equal(column, high))
        return pc.or_(ok, pc.fill_null(within, False))
    if e.kind == "ExpectColumnValuesToBeInSet":
        column = table[e.get("column")]
        return pc.or_(pc.is_null(column), pc.is_in(column, value_set=pa.array(list(e.get("value_set")))))
    if e.kind == "ExpectColumnValuesToNotBeInSet":
        column = table[e.get("column")]
        return pc.or_(pc.is_null(column), pc.invert(pc.is_in(column, value_set=pa.array(list(e.get("value_set"))))))
    return None


def _not_strict(e: Expects) -> bool:
    return not (e.get("strict_min", False) or e.get("strict_max", False))  # GX's defaults: False


def _duplicated(columns: list[str]) -> Callable[[pa.Table], int] | None:
    """Rows that share their values of ``columns`` with another row (rows with a null among them
    are not compared), as GX counts them."""

    def count(table: pa.Table) -> int:
        keys = table.select(columns).drop_null()
        if keys.num_rows == 0:
            return 0
        groups = keys.group_by(columns).aggregate([([], "count_all")])
        sizes = groups["count_all"]
        return int(pc.sum(pc.filter(sizes, pc.greater(sizes, 1))).as_py() or 0)

    return count


def _batch_check(check: Check) -> Callable[[pa.Table], int] | None:
    e = check.expects
    if e.kind == "ExpectCompoundColumnsToBeUnique" and e.get("ignore_row_if") == "any_value_is_missing":
        return _duplicated(list(e.get("column_list")))
    if e.kind == "ExpectColumnValuesToBeUnique":
        return _duplicated([e.get("column")])
    return None


def validate_arrow(table: pa.Table, suite: Suite) -> Validation[pa.Table] | None:
    """``suite`` on ``table``: results, and the table split by the ``drop`` checks (the dropped rows
    carry the first failed check's name in ``_expectation``); None if a check has no Arrow form."""
    t0 = time.perf_counter()
    rows = table.num_rows
    checks = [c for c in suite.checks if c.on == "rows"]  # figures checks need figures: skipped
    if not all(_SUPPORTED.get(c.expects.kind, lambda _: False)(c.expects) for c in checks):
        return None
    results: list[Result] = []
    failing: list[tuple[Check, pa.ChunkedArray]] = []
    for check in checks:
        try:
            if check.row_level:
                passing = _passing(check, table)
                assert passing is not None
                n_failed = rows - int(pc.sum(passing.cast(pa.int64())).as_py() or 0)
                results.append(_result(suite, check, "row", rows, n_failed))
                failing.append((check, pc.invert(passing)))
            else:
                counter = _batch_check(check)
                assert counter is not None
                results.append(_result(suite, check, "batch", rows, counter(table)))
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise RuntimeError(f"{suite.table}: expectation {check.name} could not run: {exc}") from None
    drops = {r.expectation for r in results if r.outcome == "dropped"}
    if not drops:
        return Validation(suite, results, table, None, time.perf_counter() - t0)
    dropped_by = pa.nulls(rows, pa.string())
    for check, mask in reversed([(c, m) for c, m in failing if c.name in drops]):  # the first failed wins
        dropped_by = pc.if_else(mask, pa.scalar(check.name), dropped_by)
    gone = pc.is_valid(dropped_by)
    dropped = table.filter(gone).append_column(DROPPED_BY, pc.filter(dropped_by, gone))
    kept = table.filter(pc.invert(gone))
    return Validation(suite, results, kept, dropped, time.perf_counter() - t0)


#: Expectation kinds with an Arrow form, and when (their options).
_SUPPORTED: dict[str, Callable[[Expects], bool]] = {
    "ExpectColumnValuesToNotBeNull": lambda e: True,
    "ExpectColumnValuesToBeBetween": _not_strict,
    "ExpectColumnValuesToBeInSet": lambda e: True,
    "ExpectColumnValuesToNotBeInSet": lambda e: True,
    "ExpectCompoundColumnsToBeUnique": lambda e: e.get("ignore_row_if") == "any_value_is_missing",
    "ExpectColumnValuesToBeUnique": lambda e: True,
}


def _result(suite: Suite, check: Check, kind: str, rows: int, n_failed: int) -> Result:
    return Result(
        suite.table,
        check.name,
        check.policy,
        kind,
        rows,
        n_failed,
        outcome(check, n_failed == 0),
        None,
        check.description,
    )
