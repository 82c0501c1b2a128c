"""Checks on the whole batch counted by Spark itself, all in one query: uniqueness (the rows that
share their key with another row, rows with a missing key value not compared) and ``no_rows``
queries (the rows the query returns), as Great Expectations counts them.

GX runs five or more Spark jobs per such check and plans each one anew; a gate on a small batch
paid more for that than for its own rows. The counts here are GX's ``unexpected_count`` and
``observed_value`` (a test holds each form to GX's own result), so the results read the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from pyspark.sql import DataFrame

from expectations.core import Check, _q


def failing_rows_query(check: Check) -> str | None:
    """SQL over ``{batch}`` whose rows are the rows ``check`` fails, or None when Spark does not
    count this kind of check (GX does)."""
    e = check.expects
    if e.kind == "UnexpectedRowsExpectation":
        return str(e.get("unexpected_rows_query"))
    if e.kind == "ExpectCompoundColumnsToBeUnique" and e.get("ignore_row_if") == "any_value_is_missing":
        columns = list(e.get("column_list"))
    elif e.kind == "ExpectColumnValuesToBeUnique":
        columns = [str(e.get("column"))]
    else:
        return None
    keys = ", ".join(_q(c) for c in columns)
    present = " AND ".join(f"{_q(c)} IS NOT NULL" for c in columns)
    return (
        f"SELECT * FROM (SELECT count(1) OVER (PARTITION BY {keys}) AS _copies FROM {{batch}} WHERE {present}) "
        "WHERE _copies > 1"
    )


def counts(
    df: DataFrame, checks: Sequence[tuple[Check, str]], table: str, with_rows: bool
) -> tuple[int | None, list[int]]:
    """(the batch's rows when ``with_rows``, each check's failing rows) in one Spark query over
    ``df``; ``checks`` pairs each check with its :func:`failing_rows_query`.

    Each query runs as a scalar subquery of one statement, over ``df`` as a temporary view with a
    name of its own (jobs run side by side in one session). A query Spark cannot resolve raises,
    naming the check."""
    from pyspark.errors import AnalysisException

    spark = df.sparkSession
    view = f"_medallion_batch_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(view)
    try:
        parts = [f"(SELECT count(1) FROM {view}) AS _rows"] if with_rows else []
        parts += [f"(SELECT count(1) FROM ({q.replace('{batch}', view)})) AS _b{i}" for i, (_, q) in enumerate(checks)]
        try:
            row = spark.sql("SELECT " + ", ".join(parts)).first()  # one row
        except AnalysisException:
            for check, query in checks:
                try:
                    spark.sql(query.replace("{batch}", view)).schema  # noqa: B018 - resolving is the check
                except AnalysisException as exc:
                    raise RuntimeError(f"{table}: expectation {check.name} could not run: {exc}") from None
            raise
    finally:
        spark.catalog.dropTempView(view)
    assert row is not None
    return int(row["_rows"]) if with_rows else None, [int(row[f"_b{i}"]) for i in range(len(checks))]
