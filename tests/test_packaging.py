"""What ``pip install .`` pulls: the wheel must not replace a Spark runtime's own pyspark, nor
bring what a cluster task never uses (the embedded ClickHouse, charts)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

RUNTIME_OWNED = {"pyspark", "delta-spark"}
#: What only a laptop (the embedded ClickHouse) or a person (charts) needs.
NOT_ON_A_CLUSTER = {"chdb", "matplotlib"}


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
    assert pulled & (RUNTIME_OWNED | NOT_ON_A_CLUSTER) == set()
    extras = project["optional-dependencies"]
    local = {canonicalize_name(Requirement(r).name) for r in extras["local"]}
    assert local == RUNTIME_OWNED | {"chdb"}
    assert {canonicalize_name(Requirement(r).name) for r in extras["charts"]} == {"matplotlib"}


def test_base_requirements_are_ranges_and_ci_pins_every_one() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[canonicalize_name(name)] = pinned
    for text in project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]:
        req = Requirement(text)
        if canonicalize_name(req.name) == "medallion":
            continue
        assert not any(spec.operator == "==" for spec in req.specifier), f"{text}: a range, not a pin"
        assert canonicalize_name(req.name) in pins, f"{req.name} has no pin in .ci/constraints.txt"
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), (text, pins[req.name])


@pytest.mark.integration
@pytest.mark.slow
def test_pips_resolver_installs_neither_spark_nor_chdb_nor_matplotlib_with_the_wheel(tmp_path: Path) -> None:
    """What a fresh ``pip install .`` would install, as pip's own resolver says (dry run, nothing
    installed; the wheel's metadata is built in an isolated environment)."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installed = {canonicalize_name(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}
    assert {"medallion", "deltalake", "great-expectations", "aiohttp"} <= installed
    assert installed & (RUNTIME_OWNED | NOT_ON_A_CLUSTER | {"chdb-core"}) == set(), installed


def test_charts_without_matplotlib_say_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.app.plotting import pyplot
    from pipelines.errors import MedallionError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(MedallionError) as missing:
        pyplot()
    assert str(missing.value) == "charts need matplotlib, which is not installed: pip install 'medallion[charts]'"


def test_the_embedded_clickhouse_without_chdb_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    from pipelines.config.settings import load_settings
    from pipelines.sinks import clickhouse

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "chdb" else find_spec(name, *a))
    settings = load_settings(lake_root=str(tmp_path / "lake"))
    with pytest.raises(clickhouse.ClickHouseError) as missing, clickhouse.connect(settings):
        pass
    assert str(missing.value) == (
        f"the embedded ClickHouse (chdb://{tmp_path / 'lake'}/clickhouse) needs chdb, which is not installed: "
        "pip install 'medallion[local]', or set clickhouse.dsn to a ClickHouse server"
    )


def test_a_clickhouse_connection_begun_ahead_fails_only_when_its_client_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """:func:`clickhouse.connecting` opens in a thread: an export with nothing to send never asks
    for the client, so a ClickHouse it cannot reach is no error there; asked for, it is the same
    error :func:`clickhouse.connect` gives."""
    import importlib.util

    from pipelines.config.settings import load_settings
    from pipelines.sinks import clickhouse

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "chdb" else find_spec(name, *a))
    settings = load_settings(lake_root=str(tmp_path / "lake"))
    with clickhouse.connecting(settings):
        pass
    with pytest.raises(clickhouse.ClickHouseError) as missing, clickhouse.connecting(settings) as client:
        client()
    assert str(missing.value).startswith("the embedded ClickHouse (chdb://") and "needs chdb" in str(missing.value)


def test_the_wheel_lists_every_package_and_maps_medallion_to_the_api() -> None:
    import tomllib

    repo = Path(__file__).resolve().parents[1]
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(repo).parts)
        for top in ("pipelines", "bronze", "silver", "gold", "expectations")
        for p in (repo / top).rglob("__init__.py")
    }
    assert set(config["packages"]) == (on_disk - {"pipelines.app.api"}) | {"medallion"}
    assert config["package-dir"] == {"medallion": "pipelines/app/api"}


def test_every_asset_gx_pages_load_is_vendored_with_its_license_and_packaged() -> None:
    import tomllib

    from pipelines.app.report.gx_offline import ASSETS, VENDOR

    repo = Path(__file__).resolve().parents[1]
    assert all((VENDOR / path).is_file() for path in ASSETS.values())
    libraries = {path.split("/")[0] for path in ASSETS.values()}
    assert all(any((VENDOR / lib).glob("LICENSE*")) for lib in libraries)
    package_data = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "gx_vendor/**/*" in package_data["pipelines.app.report"]
