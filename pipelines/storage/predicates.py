"""A condition as Delta's API takes one (SQL text, or a Column), as the SQL text each engine runs."""

from __future__ import annotations

from typing import Any, TypeAlias

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from pipelines.errors import InputError

#: A condition as Delta's API takes one: SQL text, or a Column (in a MERGE, ``t.`` names the
#: target's columns and ``s.`` the source's).
Predicate: TypeAlias = str | Column


def predicate_sql(
    spark: SparkSession,
    predicate: Predicate,
    schema: StructType,
    source: DataFrame | pa.Table | None = None,
    standard: bool = False,
) -> str:
    """``predicate`` as SQL text: text as it is; a Column as Spark's analyzer resolves it against
    a table of ``schema`` (aliased ``t``, with ``source`` aliased ``s``, for a MERGE).

    ``standard`` writes a Column's string literals as standard SQL does (``'it''s'``, for
    delta-rs, which parses with DataFusion) rather than as Spark does (``'it\\'s'``).
    """
    if isinstance(predicate, str):
        return predicate
    table = spark.createDataFrame([], schema)
    if source is None:
        plan, node = table.where(predicate), "Filter"
    else:
        source_schema = source.schema if isinstance(source, DataFrame) else from_arrow_schema(source.schema)
        plan = table.alias("t").join(spark.createDataFrame([], source_schema).alias("s"), predicate)
        node = "Join"
    jdf = getattr(plan, "_jdf", None)
    if jdf is None:  # Spark Connect: the analyzed plan stays on the server
        raise InputError(
            f"a Column condition needs a classic Spark session; over Spark Connect pass SQL text ({predicate})"
        )
    found = _plan_node(jdf.queryExecution().analyzed(), node)
    assert found is not None, f"no {node} in the plan of {predicate}"
    condition = found.condition()
    text = str((condition.get() if node == "Join" else condition).sql())
    return _standard_strings(text) if standard else text


_UNESCAPED = {"n": "\n", "t": "\t", "r": "\r", "'": "''"}


def _standard_strings(sql: str) -> str:
    """Spark SQL text with its string literals' backslash escapes written the standard way."""
    out: list[str] = []
    quoted, i = False, 0
    while i < len(sql):
        c = sql[i]
        if quoted and c == "\\" and i + 1 < len(sql):
            out.append(_UNESCAPED.get(sql[i + 1], sql[i + 1]))
            i += 2
            continue
        if c == "'":
            quoted = not quoted
        out.append(c)
        i += 1
    return "".join(out)


def _plan_node(plan: Any, name: str) -> Any:
    if plan.nodeName() == name:
        return plan
    children = plan.children()
    for i in range(children.size()):
        found = _plan_node(children.apply(i), name)
        if found is not None:
            return found
    return None
