"""What a query's executed plan says it did."""

from __future__ import annotations

from typing import Any


def files_scanned(df: Any) -> int:
    """How many files Spark read to compute ``df`` (its scans' ``numFiles``), after computing it."""
    return _scans(df, "numFiles")


def rows_scanned(df: Any) -> int:
    """How many rows Spark's scans handed on to compute ``df``, after computing it: a row group
    skipped by its statistics or its Bloom filter hands on none."""
    return _scans(df, "numOutputRows")


def _scans(df: Any, metric: str) -> int:
    df.collect()  # a test's few rows; runs df's own plan, whose scans then hold their metrics
    plan, found, todo = df._jdf.queryExecution().executedPlan(), 0, []
    todo.append(plan)
    while todo:
        node = todo.pop()
        if node.nodeName() == "AdaptiveSparkPlan":
            todo.append(node.finalPhysicalPlan())
            continue
        metrics = node.metrics()
        if node.nodeName().startswith("Scan") and metrics.contains(metric):
            found += int(metrics.apply(metric).value())
        children = node.children()
        todo.extend(children.apply(i) for i in range(children.size()))
    return found
