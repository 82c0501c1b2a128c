"""``import medallion``: the pipeline from Python, for notebooks and tests.

::

    import medallion

    lake = medallion.open(lake_root="/tmp/medallion-lake")  # engine="delta-spark", spark=... too
    lake.run("all")                                          # a stage, one flow, or all
    lake.backfill("gold", start, end)                        # a window range recounted
    lake.table("gold/property_values").orderBy("count", ascending=False).show()
    lake.validate(), lake.status()

The package installs as ``medallion`` from ``pipelines/app/api`` (setuptools' package-dir mapping);
the code it calls keeps its module names (``pipelines``, ``bronze``, ``silver``, ``gold``,
``expectations``). Everything here is what the ``medallion`` command line does, returned as values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import flows
from pipelines.flows import FLOWS
from pipelines.runtime import passes
from pipelines.runtime.flow_types import Flow

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import DataFrame, SparkSession

    from pipelines.config.settings import Settings
    from pipelines.runtime.eventlog import RunRecord
    from pipelines.runtime.runner import Context

__all__ = ["FLOWS", "Flow", "Pipeline", "open"]


@dataclass
class Pipeline:
    """A lake, its settings and the Spark session its flows run on."""

    context: Context

    @property
    def settings(self) -> Settings:
        return self.context.settings

    @property
    def spark(self) -> SparkSession:
        return self.context.spark

    def run(self, flow: str = "all", buckets: list[int] | None = None, drain: bool = False) -> list[RunRecord]:
        """One pass of ``flow`` (a stage such as ``gold``, a flow such as ``gold.merge``, or ``all``),
        as ``medallion run FLOW --once``; each flow's event-log record."""
        from pipelines import flows

        return list(passes.run_pass(self.context, flows.resolve(flow), buckets, drain))

    def ingest(self, kind: str, paths: list[str]) -> RunRecord:
        """Land JSON-lines files of ``kind`` (``events`` or ``page_changes``) into bronze, each file
        once, as ``medallion ingest file``."""
        from pipelines.runtime.ingest import ingest_files

        return ingest_files(self.context, kind, [Path(p) for p in paths])

    def backfill(self, layer: str, start: datetime, end: datetime, only: str | None = None) -> RunRecord:
        """Make the windows that start in [``start``, ``end``) again under the settings in force,
        as ``medallion backfill LAYER --from --to [--only]`` (``gold``, or ``silver``: its events,
        which go on to gold, and its page changes); the event-log record of the backfill of
        ``layer`` (of silver's events, or of the table ``only`` names: ``events``,
        ``page_changes``; gold's follows silver's events in the event log)."""
        from pipelines.runtime.backfill import backfill_gold
        from pipelines.runtime.backfill_page_changes import backfill_page_changes
        from pipelines.runtime.backfill_silver import backfill_silver

        if layer == "gold" and only is None:
            return backfill_gold(self.context, start, end)
        if layer != "silver" or only not in (None, "events", "page_changes"):
            raise ValueError(f"backfill {layer!r} (only={only!r}): 'gold' or 'silver' (events, page_changes)")
        records = [] if only == "page_changes" else backfill_silver(self.context, start, end)[:1]
        if only != "events":
            records.append(backfill_page_changes(self.context, start, end))
        return records[0]

    def table(self, name: str) -> DataFrame:
        """A table of the lake (``silver/events``) as a DataFrame at its latest version."""
        from pipelines.runtime.tables import table

        return self.context.store.read(table(name))

    def validate(self, tables: list[str] | None = None) -> list[dict[str, Any]]:
        """Validate whole tables with their suites (all when none is named): one row per
        expectation, as ``medallion validate --json`` gives them."""
        from pipelines.runtime import quality
        from pipelines.runtime.eventlog import recorded

        quality.check_policies(self.context)
        with recorded(self.context.events, "validate", self.context.run_id) as record:
            checked = quality.validate_tables(self.context, record, list(tables or []), flows.table_checks())
        return [r.as_row() for c in checked if c.validation for r in c.validation.results]

    def report(self, out: str | Path) -> Path:
        """Write the pipeline report (``medallion report --out``) under ``out``; its index.html."""
        from pipelines.app.report import build_report

        return build_report(self.context, Path(out))

    def status(self) -> list[dict[str, Any]]:
        """Every table's version, rows, files and last write."""
        from pipelines.runtime.tables import ALL_TABLES

        return [dataclasses.asdict(self.context.store.stats(spec)) for spec in ALL_TABLES]


def open(  # medallion.open, as duckdb.connect or sqlite3.connect
    lake_root: str | None = None,
    engine: str | None = None,
    spark: SparkSession | None = None,
    **settings: Any,
) -> Pipeline:
    """The lake at ``lake_root`` (default: settings, ``MEDALLION_LAKE_ROOT``), on ``spark`` or a
    session started from settings. Other keyword arguments are settings (``buckets={"count": 4}``)."""
    from pipelines.config.settings import load_settings
    from pipelines.config.spark import build_spark
    from pipelines.runtime.runner import Context
    from pipelines.storage import open_store

    overrides = dict(settings)
    if lake_root is not None:
        overrides["lake_root"] = lake_root
    if engine is not None:
        overrides["delta_engine"] = engine
    resolved = load_settings(**overrides)
    session = spark if spark is not None else build_spark(resolved)
    return Pipeline(Context(settings=resolved, spark=session, store=open_store(resolved, session)))
