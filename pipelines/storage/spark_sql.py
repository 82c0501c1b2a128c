"""Spark SQL text for DDL: quoted identifiers, string literals and a schema's column list."""

from __future__ import annotations

from pyspark.sql.types import StructType


def quote(name: str) -> str:
    """A SQL identifier part in backticks."""
    return "`" + name.replace("`", "``") + "`"


def column_ddl(schema: StructType) -> str:
    """``schema`` as the column list of a CREATE TABLE (nullability and comments kept)."""
    cols = []
    for f in schema.fields:
        col = f"{quote(f.name)} {f.dataType.simpleString()}"
        if not f.nullable:
            col += " NOT NULL"
        if f.metadata.get("comment"):
            col += f" COMMENT {sql_string(str(f.metadata['comment']))}"
        cols.append(col)
    return ", ".join(cols)


def sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
