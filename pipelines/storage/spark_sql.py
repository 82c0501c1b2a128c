"""Spark SQL text: quoted identifiers, string literals, a schema's column list, a MERGE statement."""

from __future__ import annotations

from collections.abc import Mapping

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


def merge_sql(
    target: str,
    source: str,
    on: str,
    update: Mapping[str, str] | None,
    insert: Mapping[str, str] | None,
    update_when: str | None,
) -> str:
    """A MERGE of the view ``source`` (alias ``s``) into the table ``target`` (alias ``t``) on
    ``on``: matched rows updated by ``update`` (target column -> SQL expression; None: every column)
    where ``update_when`` holds, unmatched rows inserted by ``insert`` (likewise)."""
    matched = "WHEN MATCHED" + (f" AND ({update_when})" if update_when else "") + " THEN UPDATE SET "
    matched += "*" if update is None else ", ".join(f"t.{quote(c)} = {e}" for c, e in update.items())
    not_matched = "WHEN NOT MATCHED THEN INSERT "
    not_matched += (
        "*"
        if insert is None
        else "(" + ", ".join(quote(c) for c in insert) + ") VALUES (" + ", ".join(insert.values()) + ")"
    )
    return f"MERGE INTO {target} AS t USING {source} AS s ON {on} {matched} {not_matched}"


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
