"""What a query's executed plan says it did."""

from __future__ import annotations

from typing import Any


def files_scanned(df: Any) -> int:
    """How many files Spark read to compute ``df`` (its scans' ``numFiles``), after computing it."""
    df.collect()  # a test's few rows; runs df's own plan, whose scans then hold their metrics
    plan, found, todo = df._jdf.queryExecution().executedPlan(), 0, []
    todo.append(plan)
    while todo:
        node = todo.pop()
        if node.nodeName() == "AdaptiveSparkPlan":
            todo.append(node.finalPhysicalPlan())
            continue
        metrics = node.metrics()
        if node.nodeName().startswith("Scan") and metrics.contains("numFiles"):
            found += int(metrics.apply("numFiles").value())
        children = node.children()
        todo.extend(children.apply(i) for i in range(children.size()))
    return found
