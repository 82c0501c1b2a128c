"""What ``pip install .`` pulls: the wheel must not replace a Spark runtime's own pyspark."""

from __future__ import annotations

import tomllib
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

RUNTIME_OWNED = {"pyspark", "delta-spark"}


def _pulled_by(requirements: list[str]) -> set[str]:
    """Every distribution ``requirements`` (no extras) pull, walked through the installed metadata."""
    env = {**default_environment(), "extra": ""}
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (req.marker and not req.marker.evaluate(env)) or name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(Requirement(r) for r in metadata.requires(name) or [])
        except metadata.PackageNotFoundError:
            continue  # not installed here: its own requirements are unknown, its name is counted
    return seen


def test_the_base_install_pulls_neither_pyspark_nor_delta_spark() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pulled = _pulled_by(project["dependencies"])
    assert "deltalake" in pulled and "great-expectations" in pulled  # the walk did walk
    assert pulled & RUNTIME_OWNED == set()
    local = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["local"]}
    assert local == RUNTIME_OWNED
