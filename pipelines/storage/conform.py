"""Rows conformed to a table's schema: its columns, in its order, of its types.

Shared by the engines and by everything that builds rows for a table (ingest, the sources, the
quality gate's quarantine rows), in Arrow and in Spark alike.
"""

from __future__ import annotations

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
