"""Rows conformed to a table's schema: its columns, in its order, of its types.

Shared by the engines and by everything that builds rows for a table (ingest, the sources, the
quality gate's quarantine rows), in Arrow and in Spark alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select ``schema``'s columns from ``table`` in order and cast them to its types.

    Missing nullable columns are filled with nulls; a missing non-nullable column is an error.
    Engines hand back view and large string types that Spark cannot take, so reads conform too.
    """
    columns = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                col = col.cast(f.type)
            columns.append(col)
        else:
            if not f.nullable:
                raise ValueError(f"column {f.name!r} is missing and not nullable")
            columns.append(pa.nulls(table.num_rows, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def conform_df(df: DataFrame, schema: StructType) -> DataFrame:
    """:func:`conform` for a DataFrame: ``schema``'s columns in order and types, missing ones null."""
    present = set(df.columns)
    return df.select(
        *[(F.col(f.name) if f.name in present else F.lit(None)).cast(f.dataType).alias(f.name) for f in schema.fields]
    )


def clustered(df: DataFrame, partition_by: Sequence[str], cluster_by: Sequence[str] = ()) -> DataFrame:
    """``df`` as a table's writer hands it to Spark: a partitioned table's rows gathered by
    partition (one writer task, so few files, per partition), each task's rows sorted by
    ``cluster_by``, so its files (cut at the table's ``file_rows``) each hold a narrow range of
    them. An unpartitioned table's rows are sorted where they are: no shuffle of their own. The
    partition columns lead the sort: Spark's writer sorts each task's rows by them, and would
    otherwise sort again and lose the order."""
    out = df.repartition(*partition_by) if partition_by else df
    return out.sortWithinPartitions(*partition_by, *cluster_by) if cluster_by else out
