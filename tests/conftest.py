"""Shared fixtures: one local Spark session for the whole test run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.settings import Settings, load_settings
from pipelines.spark import build_spark

# Real servers for integration tests: kafka_broker, node_exporter, prometheus_factory, vmagent_factory.
pytest_plugins = ["tests.infra"]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    settings = load_settings(
        lake_root=str(tmp_path_factory.mktemp("spark-lake")),
        spark={"shuffle_partitions": 2, "master": "local[2]", "driver_memory": "2g"},
        # With jars given, the session gets the Delta extension so the delta-spark engine can run.
        delta_engine="delta-spark" if os.environ.get("MEDALLION_DELTA_JARS") else "delta-rs",
    )
    session = build_spark(settings)
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted at a fresh lake folder, no config file or env leaking in."""
    return load_settings(lake_root=str(tmp_path / "lake"))
