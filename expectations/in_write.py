"""A suite checked by the write of the batch itself (``DataFrame.observe``), with no pass of its own:
row-level checks counted as the write reads the rows, a ``fail`` check stopping the write before its
commit, and (where the caller lands them) the rows of ``drop`` checks left out.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from expectations import batch
from expectations.core import Check, Suite
from expectations.predicates import failing_sums, stops_on
from expectations.runner import (
    DROPPED_BY,
    Validation,
    batch_result,
    first_failed,
    row_counts,
    row_results,
    total_result,
)

log = logging.getLogger("medallion")


#: The text a gate checked in the write raises with when a ``fail`` check does not hold.
FAILED_IN_WRITE = "medallion: a fail expectation did not hold on a row being written"


@dataclass
class InWrite:
    """A suite checked as the batch is written (:func:`in_write`): ``rows`` are what to write, and
    :meth:`validation` gives the results once the write has run. With ``drops`` (a suite with
    ``drop`` checks), ``dropped`` are the rows those checks remove, tagged with the first one's
    name in ``_expectation``: a frame of the batch, read only where the results show any."""

    suite: Suite
    rows: DataFrame
    _batch: DataFrame
    _observed: Observation
    _checks: list[Check]
    _totals: list[Check]
    _started: float
    dropped: DataFrame | None = None
    _on_batch: list[Check] = field(default_factory=list)
    _whole: DataFrame | None = None

    def validation(self, suite: Suite | None = None) -> Validation[DataFrame]:
        """The results, read from the write's observed figures (call it after the write); ``suite``:
        the same suite with its parameters known now (its bounds may come from the same write).

        A batch Spark knows to be empty (an increment whose commits added no file) is written without
        running the observed plan, so Spark has no figures: the batch is counted in a pass of its own.
        Checks on the whole batch (a uniqueness) are counted by one query over it after the write."""
        suite = suite or self.suite
        try:
            got = self._observed.get
        except Exception:  # Spark's error for an observation no action ran
            log.debug("%s: no observed figures from the write; counting the batch", suite.table, exc_info=True)
            got = {}
        if "_rows" in got:
            rows, failed = int(got["_rows"]), [int(got[f"_f{i}"]) for i in range(len(self._checks))]
            totals = [int(got[f"_t{i}"]) for i in range(len(self._totals))]
        else:
            rows, failed, totals = row_counts(self._batch, suite, self._checks, self._totals)
        by_name = {r.expectation: r for r in row_results(suite, self._checks, rows, failed)}
        bounds = {c.name: c for c in suite.checks}
        for check, value in zip(self._totals, totals, strict=True):
            if known := bounds.get(check.name):  # None: the suite as its parameters came out has none
                by_name[check.name] = total_result(suite, known, rows, value)
        if self._on_batch:
            counted = [(c, q) for c in self._on_batch if (q := batch.failing_rows_query(c)) is not None]
            frame = self._batch if self._whole is None else self._whole
            _, failing = batch.counts(frame, counted, suite.table, with_rows=False)
            for (check, _), n_failed in zip(counted, failing, strict=True):
                by_name[check.name] = batch_result(suite, check, rows, n_failed, n_failed == 0, None)
        results = [by_name[c.name] for c in suite.checks if c.name in by_name]
        return Validation(suite, results, self.rows, self.dropped, time.perf_counter() - self._started)


def in_write(
    df: DataFrame, suite: Suite, totals: bool = False, drops: bool = False, whole: DataFrame | None = None
) -> InWrite | None:
    """``suite`` checked by the write of ``df`` itself, with no pass of its own: failing rows are
    counted as the write reads them (``DataFrame.observe``), and a row failing a ``fail`` check
    stops the write before it commits (``raise_error`` with :data:`FAILED_IN_WRITE`; the caller
    then validates the batch as :func:`validate` does, for the results and the error). With
    ``totals`` (a write checked between its files and its commit), a check on a total of the batch
    (a sum) is counted by the write too, and the caller judges it before the commit.

    With ``drops`` (a write whose caller lands the dropped rows itself, once the results show any),
    ``drop`` checks leave their failing rows out of the write (:attr:`InWrite.dropped`), and
    uniqueness checks on the whole batch are counted after the write by one query over ``whole``
    (the same rows as ``df`` without what the write observes, so that Spark can plan the query on
    its own: a key it knows to be null, as a landed file's Kafka offsets, costs no pass).

    None when the suite needs the batch before it is written: another check on the whole batch (GX,
    a query's rows), or a ``drop`` check without ``drops``. Checks on figures are left out."""
    checks = [c for c in suite.checks if c.on != "figures"]
    row_checks = [c for c in checks if c.row_level]
    total_checks = [c for c in checks if not c.row_level and c.total is not None] if totals else []
    on_batch = (
        [c for c in checks if not c.row_level and c.total is None and batch.failing_rows_query(c) is not None]
        if drops
        else []
    )
    if (
        not checks
        or any(c.on != "rows" or (c.policy == "drop" and not drops) for c in checks)
        or len(row_checks) + len(total_checks) + len(on_batch) < len(checks)
    ):
        return None
    started = time.perf_counter()
    observed = Observation(f"gate_{uuid.uuid4().hex}")
    sums = [F.expr(c.total or "").cast("long").alias(f"_t{i}") for i, c in enumerate(total_checks)]
    drop_checks = [c for c in row_checks if c.policy == "drop"]
    tagged = df.withColumn(DROPPED_BY, first_failed(drop_checks)) if drop_checks else df
    rows = tagged.observe(observed, F.count(F.lit(1)).alias("_rows"), *failing_sums(row_checks), *sums)
    dropped = None
    if drop_checks:
        dropped = tagged.where(F.col(DROPPED_BY).isNotNull())
        rows = rows.where(F.col(DROPPED_BY).isNull()).drop(DROPPED_BY)
    fails = [c for c in row_checks if c.policy == "fail"]
    if fails:
        rows = rows.where(stops_on(fails, FAILED_IN_WRITE))
    return InWrite(suite, rows, df, observed, row_checks, total_checks, started, dropped, on_batch, whole)
