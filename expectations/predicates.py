"""Columns built from checks' predicates: a check's failing rows, their sums, the stop of a write.

A gate runs with every write of its flow, and each predicate's column is a parse and a few calls
in the JVM: tens of milliseconds a suite, a share of a 1-event run. A column is an expression, not
data, so one built for a suite serves every frame it checks; they are kept per Spark driver.
"""

from __future__ import annotations

import functools
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from expectations.core import Check


def failing(check: Check) -> Column:
    """True for a row that fails a row-level ``check``: its predicate false, or null."""
    assert check.passes is not None
    return ~F.coalesce(F.expr(check.passes), F.lit(False))


def failing_sums(checks: Sequence[Check]) -> list[Column]:
    """Per row-level check, its failing rows as an aggregate column (``_f0``, ``_f1``, ...)."""
    return _built(
        ("sums", *(c.passes or "" for c in checks)),
        lambda: [F.coalesce(F.sum(failing(c).cast("long")), F.lit(0)).alias(f"_f{i}") for i, c in enumerate(checks)],
    )


#: Columns built from checks' predicates, per Spark driver that built them (a classic session's
#: columns are objects in its JVM), by what they were built from.
_BUILT: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], list[Column]]] = weakref.WeakKeyDictionary()
_BUILT_LOCK = threading.Lock()


def _built(key: tuple[str, ...], build: Callable[[], list[Column]]) -> list[Column]:
    """``build()``, once per driver for the same ``key``: a gate runs with every write of its flow,
    and each predicate's column is a parse and a few calls in the JVM (tens of ms a suite on a
    1-event run). A column is an expression, not data: one serves every frame. Over Spark Connect
    a column is built in Python alone, and is built each time."""
    from pyspark import SparkContext

    owner = SparkContext._active_spark_context
    if owner is None:
        return build()
    with _BUILT_LOCK:
        cached = _BUILT.setdefault(owner, {}).get(key)
    if cached is None:
        cached = build()
        with _BUILT_LOCK:
            _BUILT[owner][key] = cached
    return cached


def stops_on(checks: Sequence[Check], message: str) -> Column:
    """True for a row that fails none of ``checks``; a row failing one raises ``message``, which
    stops the query that reads it (a write before its commit)."""
    return _built(
        ("stop", message, *(c.passes or "" for c in checks)),
        lambda: [
            F.when(functools.reduce(operator.or_, (failing(c) for c in checks)), F.raise_error(F.lit(message))).isNull()
        ],
    )[0]
