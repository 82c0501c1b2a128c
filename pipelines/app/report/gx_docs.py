"""Great Expectations' own Data Docs, built by GX from the pipeline's validations.

Each table's recent validations (the gates of the runs the report keeps, and ``medallion
validate``) are handed to a file-backed GX context under ``<report>/gx`` as GX validation results,
with the table's suite as GX expectations, and GX renders its site
(``gx/uncommitted/data_docs/local_site``). Nothing here renders HTML: GX does, as it does for its
own checkpoints, so the pages are the ones GX users keep as CI artifacts. What GX's pages load from
public CDNs is vendored and linked from disk (``gx_offline``), so they work offline, styled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipelines.app.report.collect import Report, Result, Run, slug
from pipelines.app.report.gx_offline import make_offline
from pipelines.runtime.runner import Context

#: Validations of each table handed to GX (the newest ones).
VALIDATIONS_PER_TABLE = 10


def _suite_name(table: str) -> str:
    return slug(table.replace("/", "__"))


def _validations(report: Report) -> dict[str, list[tuple[Run, list[Result]]]]:
    """Per table, its newest validations: (the run, its results for that table)."""
    out: dict[str, list[tuple[Run, list[Result]]]] = {}
    for run in report.runs:  # newest first
        by_table: dict[str, list[Result]] = {}
        for r in run.results:
            by_table.setdefault(r.dataset, []).append(r)
        for table, results in by_table.items():
            kept = out.setdefault(table, [])
            if len(kept) < VALIDATIONS_PER_TABLE:
                kept.append((run, results))
    return out


def build(ctx: Context, report: Report, out: Path) -> str | None:
    """Build GX's Data Docs under ``out / "gx"``; set each table's ``gx_page`` (relative to
    ``out``) to its newest validation's page. Returns the site's index (relative), or None when
    nothing was validated."""
    validations = _validations(report)
    if not validations:
        return None
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    for name in ("great_expectations", "great_expectations.data_context"):
        logging.getLogger(name).setLevel(logging.WARNING)
    context: Any = gx.get_context(mode="file", project_root_dir=str(out / "gx"))
    site = out / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"
    newest: dict[str, Any] = {}
    for table, runs in validations.items():
        configs = _store_suite(context, ctx, table)
        for run, results in runs:
            key = _store_run(context, table, run, results, configs)
            if key is not None:
                newest.setdefault(table, key)
    context.build_data_docs()
    make_offline(site)
    for table, key in newest.items():
        if table in report.tables:
            run_name, run_time = key.run_id.run_name, key.run_id.to_tuple()[1]
            page = site / "validations" / _suite_name(table) / run_name / run_time / f"{_suite_name(table)}.html"
            if page.exists():
                report.tables[table].gx_page = page.relative_to(out).as_posix()
    return (site / "index.html").relative_to(out).as_posix()


def _store_suite(context: Any, ctx: Context, table: str) -> dict[Any, Any]:
    """``table``'s suite stored in GX's context, as GX expectations that name our checks; returns
    check name -> its GX expectation configuration."""
    import great_expectations as gx

    from pipelines.runtime import quality

    expectations = []
    for check in quality.suite_for(ctx, table).checks:
        meta = {"medallion_check": check.name, "policy": check.policy, "notes": check.description}
        expectations.append(check.expectation.copy(update={"meta": meta}, deep=True))
    stored = context.suites.add_or_update(gx.ExpectationSuite(name=_suite_name(table), expectations=expectations))
    return {(e.meta or {}).get("medallion_check"): e.configuration for e in stored.expectations}


def _store_run(context: Any, table: str, run: Run, results: list[Result], configs: dict[Any, Any]) -> Any:
    """One run's results for ``table`` stored in GX's context as a validation result; its key (None
    when none of its results is for a check the suite still has)."""
    from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    name = _suite_name(table)
    gx_results = list(_results(results, configs, ExpectationValidationResult))
    if not gx_results:
        return None
    passed = sum(r.success for r in gx_results)
    run_id = RunIdentifier(run_name=slug(f"{run.job}-{run.run_id}"), run_time=run.started_at)
    result = ExpectationSuiteValidationResult(
        success=passed == len(gx_results),
        results=gx_results,
        suite_name=name,
        statistics={
            "evaluated_expectations": len(gx_results),
            "successful_expectations": passed,
            "unsuccessful_expectations": len(gx_results) - passed,
            "success_percent": 100.0 * passed / len(gx_results),
        },
        meta={
            "run_id": run_id,
            "batch_spec": {"data_asset_name": table},
            "active_batch_definition": {"data_asset_name": table},
            "validation_time": run.started_at.isoformat() if run.started_at else None,
            "medallion_job": run.job,
        },
    )
    key = ValidationResultIdentifier(
        expectation_suite_identifier=ExpectationSuiteIdentifier(name=name), run_id=run_id, batch_identifier=name
    )
    context.validation_results_store.set(key, result)
    return key


def _results(results: Iterable[Result], configs: dict[Any, Any], cls: Any) -> Iterable[Any]:
    """Our results as GX expectation results, for the checks the suite still has."""
    for r in results:
        config = configs.get(r.expectation)
        if config is None:
            continue
        if r.kind == "row" and r.rows_checked is not None:
            failed = r.rows_failed or 0
            result: dict[str, Any] = {
                "element_count": r.rows_checked,
                "unexpected_count": failed,
                "unexpected_percent": 100.0 * failed / r.rows_checked if r.rows_checked else 0.0,
            }
        else:
            result = {"observed_value": r.observed if r.observed is not None else r.rows_failed}
        yield cls(
            success=r.outcome == "passed",
            expectation_config=config,
            result=result,
            meta={"policy": r.policy, "outcome": r.outcome},
        )
