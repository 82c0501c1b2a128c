"""Delta table storage: one interface, two engines (see :mod:`pipelines.storage.base`)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipelines.config.settings import Settings
from pipelines.storage.base import AddedStats, Data, Predicate, TableStore
from pipelines.storage.specs import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    AppTxn,
    Greatest,
    TableSpec,
    TableStats,
    TxnSnapshot,
)


def open_store(settings: Settings, spark: SparkSession | None) -> TableStore:
    """The store for ``settings.delta_engine`` rooted at ``settings.lake_root``.

    ``spark`` may be None for the delta-rs engine when only Arrow goes in and out (the
    remote-write receiver runs without a JVM)."""
    if settings.delta_engine == "delta-spark":
        from pipelines.storage.deltaspark import DeltaSparkStore

        return DeltaSparkStore(
            spark,
            settings.lake_root,
            settings.storage_options,
            settings.catalog,
            settings.schema,
            managed=settings.table_kind == "managed",
        )
    from pipelines.storage.deltars import DeltaRsStore

    return DeltaRsStore(spark, settings.lake_root, settings.storage_options)


__all__ = [
    "CHANGE_TYPE",
    "COMMIT_TIMESTAMP",
    "COMMIT_VERSION",
    "AddedStats",
    "AppTxn",
    "Data",
    "Greatest",
    "Predicate",
    "TableSpec",
    "TableStats",
    "TableStore",
    "TxnSnapshot",
    "open_store",
]
