"""What ``medallion report`` shows, read from the lake once: the flow registry's tables with their
Delta facts (version, rows, files, size, history, schema) and freshness, the recent runs of the
event log (``_meta/pipeline_events``) and the latest expectation results
(``_meta/expectation_results``), with examples of the rows that fail them.

Everything collected to the driver is bounded: one row of facts per table, the newest
:data:`RUNS_PER_JOB` runs of each job, one result per expectation, :data:`EXAMPLES` rows per
failing check. Rows of the tables themselves are only counted and their newest time read.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines import flows as registry
from pipelines.runtime.eventlog import EXPECTATION_RESULTS, PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_QUARANTINE, TIME_COLUMNS
from pipelines.runtime.tables import table as spec_of
from pipelines.storage import TableSpec

#: Runs of each job kept in the report (a page each); older ones stay in the event log.
RUNS_PER_JOB = 50
#: Failing rows shown per check.
EXAMPLES = 5
#: Commits of each table's history shown.
HISTORY = 25
OUTCOMES = ("passed", "warned", "dropped", "failed")


def slug(name: str) -> str:
    """A file name for a table key, job name or run id."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@dataclass(frozen=True)
class Result:
    """One expectation's outcome in one validation (a row of ``_meta/expectation_results``)."""

    dataset: str
    expectation: str
    policy: str
    kind: str
    rows_checked: int | None
    rows_failed: int | None
    outcome: str
    observed: str | None
    description: str
    run_id: str
    job: str
    validated_at: datetime | None


@dataclass
class Run:
    """One job run, from the event log."""

    run_id: str
    job: str
    started_at: datetime | None
    ended_at: datetime | None
    status: str
    rows_in: int
    rows_out: int
    metrics: dict[str, float]
    details: str | None
    error: str | None
    results: list[Result] = field(default_factory=list)

    @property
    def flow(self) -> str:
        return self.job.partition("#")[0]

    @property
    def seconds(self) -> float | None:
        if "seconds" in self.metrics:
            return self.metrics["seconds"]
        if self.started_at and self.ended_at:
            return (self.ended_at - self.started_at).total_seconds()
        return None

    @property
    def page(self) -> str:
        return f"runs/{slug(self.job)}__{slug(self.run_id)}.html"


@dataclass(frozen=True)
class Commit:
    version: int | None
    timestamp: datetime | None
    operation: str | None
    rows_added: int | None


@dataclass
class Table:
    """A table of the registry as the report shows it."""

    key: str
    description: str
    exists: bool = False
    version: int | None = None
    rows: int = 0
    files: int = 0
    bytes: int = 0
    last_write: datetime | None = None
    time_column: str | None = None
    newest: datetime | None = None
    schema: list[tuple[str, str, bool]] = field(default_factory=list)
    history: list[Commit] = field(default_factory=list)
    writers: list[str] = field(default_factory=list)
    readers: list[str] = field(default_factory=list)
    #: The latest result of each of its expectations.
    results: list[Result] = field(default_factory=list)
    #: Failing rows per expectation (as JSON text), for the checks whose latest result did not pass.
    examples: dict[str, list[str]] = field(default_factory=dict)
    #: Its GX Data Docs page (relative to the report), once built.
    gx_page: str | None = None

    @property
    def page(self) -> str:
        return f"tables/{slug(self.key)}.html"

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    @property
    def worst(self) -> str | None:
        """The worst outcome among its latest results (None: never validated)."""
        seen = {r.outcome for r in self.results}
        return next((o for o in reversed(OUTCOMES) if o in seen), None)


@dataclass
class FlowNode:
    """A flow of the registry with its runs."""

    flow: registry.Flow
    last: Run | None = None
    runs: int = 0
    failed: int = 0
    #: Versions of its source it has not read yet (None: no source, or it never recorded one).
    behind: int | None = None

    @property
    def name(self) -> str:
        return self.flow.name


@dataclass
class Report:
    generated_at: datetime
    lake_root: str
    engine: str
    tables: dict[str, Table]
    flows: list[FlowNode]
    #: Recent runs of every job, newest first (flows and the others: validate, maintenance).
    runs: list[Run]


def registry_tables() -> list[TableSpec]:
    """Every table a flow reads or writes, in pipeline order."""
    seen: dict[str, TableSpec] = {}
    for f in registry.FLOWS:
        for spec in (*f.sources, *f.targets):
            seen.setdefault(spec.key, spec)
    return list(seen.values())


def _commit(entry: dict[str, Any]) -> Commit:
    """A history entry of either engine (delta-rs: epoch milliseconds; Spark: a datetime)."""
    ts = entry.get("timestamp")
    if isinstance(ts, int | float):
        ts = datetime.fromtimestamp(ts / 1000, tz=UTC)
    elif isinstance(ts, datetime):
        ts = _utc(ts)
    metrics = entry.get("operationMetrics") or {}
    added = next(
        (metrics[k] for k in ("numOutputRows", "num_added_rows", "numTargetRowsInserted") if k in metrics), None
    )
    return Commit(entry.get("version"), ts, entry.get("operation"), None if added is None else int(added))


def _columns(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


def _table(ctx: Context, spec: TableSpec) -> Table:
    t = Table(spec.key, spec.description, time_column=TIME_COLUMNS.get(spec.key))
    t.writers = [f.name for f in registry.FLOWS if spec in f.targets]
    t.readers = [f.name for f in registry.FLOWS if spec in f.sources or spec in f.lookups]
    stats = ctx.store.stats(spec)
    if stats.version is None:
        t.schema = _columns(spec.schema)
        return t
    t.exists, t.version, t.rows, t.files, t.bytes = True, stats.version, stats.rows, stats.files, stats.bytes
    t.last_write = stats.last_write
    df = ctx.store.read(spec)
    t.schema = _columns(df.schema)
    if t.time_column and t.time_column in df.columns and t.rows:
        newest = df.agg(F.max(t.time_column)).first()  # one value
        t.newest = _utc(newest[0]) if newest else None
    t.history = [_commit(h) for h in ctx.store.history(spec, HISTORY)]
    return t


def _runs(ctx: Context) -> list[Run]:
    """The newest :data:`RUNS_PER_JOB` runs of each job, newest first."""
    if ctx.store.version(PIPELINE_EVENTS) is None:
        return []
    newest = Window.partitionBy("job").orderBy(F.col("started_at").desc())
    recent = (
        ctx.store.read(PIPELINE_EVENTS).withColumn("_n", F.row_number().over(newest)).where(f"_n <= {RUNS_PER_JOB}")
    )
    rows = recent.orderBy(F.col("started_at").desc()).collect()  # bounded: RUNS_PER_JOB per job
    return [
        Run(
            r["run_id"],
            r["job"],
            _utc(r["started_at"]),
            _utc(r["ended_at"]),
            r["status"],
            int(r["rows_in"] or 0),
            int(r["rows_out"] or 0),
            dict(r["metrics"] or {}),
            r["details"],
            r["error"],
        )
        for r in rows
    ]


def _utc(ts: datetime | None) -> datetime | None:
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


def _result(r: Any) -> Result:
    return Result(
        r["dataset"],
        r["expectation"],
        r["policy"],
        r["kind"],
        r["rows_checked"],
        r["rows_failed"],
        r["outcome"],
        r["observed"],
        r["description"] or "",
        r["run_id"],
        r["job"],
        _utc(r["validated_at"]),
    )


def _results(ctx: Context, runs: Sequence[Run]) -> tuple[list[Result], list[Result]]:
    """(the latest result of each expectation of each table, the results of ``runs``)."""
    if ctx.store.version(EXPECTATION_RESULTS) is None:
        return [], []
    results = ctx.store.read(EXPECTATION_RESULTS)
    latest = Window.partitionBy("dataset", "expectation").orderBy(F.col("validated_at").desc())
    newest = results.withColumn("_n", F.row_number().over(latest)).where("_n = 1").collect()  # one per check
    ids = sorted({r.run_id for r in runs})
    of_runs = results.where(F.col("run_id").isin(ids)).collect() if ids else []  # bounded by the runs kept
    return [_result(r) for r in newest], [_result(r) for r in of_runs]


def _examples(ctx: Context, table: Table) -> dict[str, list[str]]:
    """Up to :data:`EXAMPLES` rows failing each check whose latest result did not pass: rows a
    ``drop`` removed from the quarantine, the others from the table (a whole-table validation, or a
    ``warn`` that let them through)."""
    from pipelines.runtime import quality

    bad = [r for r in table.results if r.outcome != "passed" and r.kind == "row"]
    if not bad:
        return {}
    suite = quality.suite_for(ctx, table.key)
    checks = {c.name: c for c in suite.checks}
    out: dict[str, list[str]] = {}
    for r in bad:
        check = checks.get(r.expectation)
        if r.outcome == "dropped":
            if ctx.store.version(BRONZE_QUARANTINE) is None:
                continue
            rows: DataFrame = ctx.store.read(BRONZE_QUARANTINE).where(
                (F.col("kind") == table.key) & (F.col("expectation") == r.expectation)
            )
            text = rows.select(F.decode("raw", "UTF-8").alias("j")).limit(EXAMPLES)
        elif check is not None and check.passes is not None and table.exists:
            rows = ctx.store.read(spec_of(table.key)).where(~F.coalesce(F.expr(check.passes), F.lit(False)))
            text = rows.select(F.to_json(F.struct(*rows.columns)).alias("j")).limit(EXAMPLES)
        else:
            continue
        out[r.expectation] = [x["j"] for x in text.collect()]  # at most EXAMPLES rows
    return out


def collect(ctx: Context) -> Report:
    """Everything the report shows (see the module's docstring)."""
    tables = {spec.key: _table(ctx, spec) for spec in registry_tables()}
    runs = _runs(ctx)
    latest, of_runs = _results(ctx, runs)
    by_run: dict[tuple[str, str], list[Result]] = {}
    for r in of_runs:
        by_run.setdefault((r.run_id, r.job), []).append(r)
    for run in runs:
        run.results = by_run.get((run.run_id, run.job), [])
    for r in latest:
        if r.dataset in tables:
            tables[r.dataset].results.append(r)
    for t in tables.values():
        t.results.sort(key=lambda r: r.expectation)
        t.examples = _examples(ctx, t)
    nodes = []
    for f in registry.FLOWS:
        mine = [r for r in runs if r.flow == f.name]
        node = FlowNode(f, mine[0] if mine else None, len(mine), sum(r.status == "failed" for r in mine))
        read = [r.metrics["source_to"] for r in mine if "source_to" in r.metrics]
        if f.sources and read:
            now = tables[f.sources[0].key].version
            node.behind = max(0, (now or 0) - int(max(read)))
        nodes.append(node)
    return Report(datetime.now(UTC), ctx.settings.lake_root, ctx.store.engine, tables, nodes, runs)


def as_json(report: Report) -> str:
    """The report's figures as JSON (``report.json``), for scripts and tests."""

    def default(o: Any) -> Any:
        if isinstance(o, datetime):
            return o.isoformat()
        raise TypeError(type(o))

    return json.dumps(
        {
            "generated_at": report.generated_at,
            "lake_root": report.lake_root,
            "engine": report.engine,
            "tables": {
                k: {
                    "rows": t.rows,
                    "version": t.version,
                    "files": t.files,
                    "bytes": t.bytes,
                    "newest": t.newest,
                    "expectations": dict(t.outcomes),
                }
                for k, t in report.tables.items()
            },
            "flows": {
                n.name: {
                    "status": n.last.status if n.last else None,
                    "seconds": n.last.seconds if n.last else None,
                    "rows_in": n.last.rows_in if n.last else None,
                    "rows_out": n.last.rows_out if n.last else None,
                    "behind": n.behind,
                }
                for n in report.flows
            },
        },
        indent=2,
        default=default,
    )
