"""Tables by name are read through the catalog only: while this guard is on, a read by the
project's code of a path under a table's ``_delta_log`` (Spark's readers, or Delta's log classes
by path through py4j) raises, and so fails the test.

Unity Catalog's managed tables keep commits where a listing of ``_delta_log`` can miss them, and
Delta's docs do not support reading them by path. The child runs by name
(``tests/pipelines/test_connect.py``) turn it on in ``tests/conftest.py``; the demo by name, in a
process of its own, through ``sitecustomize.py`` beside this file (its folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

LOG = "_delta_log"
#: The readers' methods that take paths, on classic and Spark Connect sessions.
READERS = ("pyspark.sql.readwriter", "pyspark.sql.connect.readwriter")
METHODS = ("load", "json", "parquet", "text", "csv", "orc")


class DeltaLogPathRead(AssertionError):
    """A read of a path under ``_delta_log`` while tables are by name."""


def _paths(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    found = []
    for value in [*args, kwargs.get("path"), kwargs.get("paths")]:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list | tuple):
            found += [v for v in value if isinstance(v, str)]
    return found


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        logs = [p for p in _paths(args, kwargs) if LOG in p]
        if logs:
            raise DeltaLogPathRead(f"read of {logs[0]} with tables by name: read them through the catalog")
        return method(self, *args, **kwargs)

    read.__medallion_guard__ = True  # type: ignore[attr-defined]
    return read


def forbid_delta_log_paths() -> None:
    """Turn the guard on in this process (idempotent)."""
    import importlib

    for module_name in READERS:
        try:
            reader = importlib.import_module(module_name).DataFrameReader
        except ImportError:  # Spark Connect's client needs grpc
            continue
        for name in METHODS:
            method = getattr(reader, name, None)
            if method is not None and not getattr(method, "__medallion_guard__", False):
                setattr(reader, name, _guarded(method))
    from pipelines.storage import delta_log
    from pipelines.storage.deltaspark import DeltaSparkStore

    def by_path(*_: Any, **__: Any) -> Any:
        raise DeltaLogPathRead("Delta's log classes by path with tables by name: read them through the catalog")

    delta_log.JvmDeltaLog._snapshot = by_path  # type: ignore[method-assign]
    if getattr(DeltaSparkStore.__init__, "__medallion_guard__", False):
        return
    init = DeltaSparkStore.__init__

    # The project's own reader of commit files (pyarrow, beside Spark): refused for a store by name.
    @functools.wraps(init)
    def guarded_init(self: DeltaSparkStore, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.catalog is not None:

            def log_files(*_: Any, **__: Any) -> Any:
                raise DeltaLogPathRead("commit files read by path with tables by name: read them through the catalog")

            self.files.commits = log_files  # type: ignore[method-assign]
            self.files.added = log_files  # type: ignore[method-assign]

    guarded_init.__medallion_guard__ = True  # type: ignore[attr-defined]
    DeltaSparkStore.__init__ = guarded_init  # type: ignore[method-assign]
