"""Bloom filters on a table's columns (``TableSpec.bloom_filter``): the settings each engine's
Parquet writer takes for them.

A column of random ids (silver's event ``uuid``) has min/max statistics that skip no file: every
file spans nearly the whole range. A Bloom filter per row group says which ids it cannot hold, so
a read for a few ids (``uuid IN (...)``, which Spark pushes down to Parquet up to
``spark.sql.parquet.pushdown.inFilterThreshold`` values) opens only the row groups that may hold
one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: parquet-mr sizes each filter to the distinct values its row group holds (among candidates
#: from ``parquet.bloom.filter.max.bytes``, 1 MB, halving), not at 1 MB whatever the file: a
#: 1-event file's filter is 2 KB.
_CANDIDATES = "10"
#: The false-positive rate a filter is sized for (parquet-mr's default, 0.01: a row group that
#: holds none of 10 ids is skipped 9 times in 10).
FPP = 0.01


def bloom_filter_confs(columns: Sequence[str]) -> dict[str, str]:
    """parquet-mr's settings for a Bloom filter on each of ``columns``, as Hadoop keys: Spark
    hands a write's options and its session's confs to the Parquet writer (none: none)."""
    if not columns:
        return {}
    confs = {f"parquet.bloom.filter.enabled#{c}": "true" for c in columns}
    confs.update({f"parquet.bloom.filter.fpp#{c}": str(FPP) for c in columns})
    confs.update({f"parquet.bloom.filter.candidates.number#{c}": _CANDIDATES for c in columns})
    confs["parquet.bloom.filter.adaptive.enabled"] = "true"
    return confs


def bloom_writer_properties(columns: Sequence[str]) -> Any:
    """delta-rs's writer properties for a Bloom filter on each of ``columns`` (its compaction
    rewrites files with its own writer; none: None, its defaults)."""
    if not columns:
        return None
    from deltalake import BloomFilterProperties, ColumnProperties, WriterProperties

    bloom = ColumnProperties(bloom_filter_properties=BloomFilterProperties(True, fpp=FPP))
    return WriterProperties(column_properties=dict.fromkeys(columns, bloom))
