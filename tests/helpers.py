"""Helpers shared by tests: landing frames from raw records, fixture files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from pipelines.fixtures import PAGE_CHANGE_FILES
from pipelines.sources.files import FileBatch, landing_table, read_records

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def landing(spark: SparkSession, records: list[bytes], name: str = "/tmp/input.jsonl") -> DataFrame:
    """A landing DataFrame (bronze parser input) holding ``records`` as one file batch."""
    batch = FileBatch(Path(name), "0" * 64, records)
    return spark.createDataFrame(landing_table([batch], NOW))


def fixture_page_change_batches() -> list[FileBatch]:
    return [read_records(p, p.read_bytes()) for p in PAGE_CHANGE_FILES]


def fixture_page_changes(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(landing_table(fixture_page_change_batches(), NOW))
