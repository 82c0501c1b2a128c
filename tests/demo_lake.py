"""The small demo lake that several modules read, built once per test process, and two ways to run
``medallion`` against a lake: in a process of its own, or through the CLI's entry point in this one.

A subprocess starts a JVM (15-20 s on 2 cores); keep it where the process is the subject (the demo
runs, Spark Connect, a new catalog, JVM stderr, exit codes). Read-only commands whose subject is
their answer run in this process, on the test session (:func:`medallion_here`).

The modules that use :func:`demo_lake` are in one ``xdist_group`` (:data:`DEMO_GROUP`), so the
lake is built by one worker, once. The tests that hold several GB beside the workers' sessions (the
standalone cluster, the bench, the soak) are in that group too, so no two of them run at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

#: The xdist group of every module that reads the shared demo lake, and of the memory-heavy tests:
#: one worker runs them one after another.
DEMO_GROUP = "demo-lake-and-heavy"

SMALL_DEMO = ("demo", "--events", "3000", "--page-changes", "1000", "--json")


def medallion(
    lake: Path,
    *args: str,
    config: Path | None = None,
    registry: Path | None = None,
    settings_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``medallion --lake-root LAKE ARGS`` in a process of its own, with no ``MEDALLION_*``
    variable of this process but those given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    if config is not None:
        env["MEDALLION_CONFIG"] = str(config)
    if registry is not None:
        env["MEDALLION_COUNTERS__REGISTRY"] = str(registry)
    env.update(settings_env or {})
    return subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", "--lake-root", str(lake), *args],
        capture_output=True,
        text=True,
        env=env,
        # A hang guard, not a timing: the cluster demo over Connect took 278-485 s here and over
        # 600 s on a loaded CI machine, whose speed moves by 2x from one run to the next.
        timeout=1800,
    )


@dataclass(frozen=True)
class Answer:
    """What a command run in this process printed, and its exit code (as a process would)."""

    returncode: int
    stdout: str
    stderr: str


def medallion_here(
    spark: SparkSession,
    lake: Path,
    *args: str,
    config: Path | None = None,
    registry: Path | None = None,
) -> Answer:
    """``medallion --lake-root LAKE ARGS`` through the CLI's entry point in this process.

    The command's ``build_spark`` gets the test session (``getOrCreate``) and sets its runtime
    confs on it; they are put back afterwards, so the next test sees the session it had. No
    ``MEDALLION_*`` variable of the test process reaches the command's settings, as for
    :func:`medallion`.
    """
    from pipelines.app.cli import main

    confs = dict(spark.conf.getAll)
    hidden = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("MEDALLION_")}
    if config is not None:
        os.environ["MEDALLION_CONFIG"] = str(config)
    if registry is not None:
        os.environ["MEDALLION_COUNTERS__REGISTRY"] = str(registry)
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["--lake-root", str(lake), *args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for key in [k for k in os.environ if k.startswith("MEDALLION_")]:
            del os.environ[key]
        os.environ.update(hidden)
        now = dict(spark.conf.getAll)
        for key in now.keys() - confs.keys():
            spark.conf.unset(key)
        for key, value in confs.items():
            if now.get(key) != value:
                spark.conf.set(key, value)
    return Answer(code, out.getvalue(), err.getvalue())


@dataclass(frozen=True)
class DemoLake:
    """The small demo's lake on the default engine (delta-rs), and what the demo printed."""

    path: Path
    summary_json: str

    @property
    def summary(self) -> Any:
        return json.loads(self.summary_json)

    def copy(self, to: Path) -> Path:
        """A copy to change (a test that corrupts the lake works on one)."""
        copy = to / "lakehouse"
        shutil.copytree(self.path, copy, symlinks=True)  # chdb links databases to their store relatively
        return copy


@pytest.fixture(scope="session")
def demo_lake(tmp_path_factory: pytest.TempPathFactory) -> DemoLake:
    """A small demo run on the default engine, delta-rs, in a process of its own (starts a JVM).

    Tests only read it, or copy it first (:meth:`DemoLake.copy`); the rerun test runs the demo on
    it again, which changes no table.
    """
    lake = tmp_path_factory.mktemp("demo") / "lakehouse"
    first = medallion(lake, *SMALL_DEMO)
    assert first.returncode == 0, first.stderr
    return DemoLake(lake, first.stdout)
