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


#: Delta's commit-conflict exceptions, by class name and by error condition: classic sessions
#: raise them as captured JVM exceptions, Spark Connect as errors that carry the same names.
CONFLICTS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


def is_delta_conflict(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {getattr(exc, 'getCondition', lambda: '')() or ''} {exc}"
    return any(name in text for name in CONFLICTS)
