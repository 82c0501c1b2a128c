"""The JVM's class archive (``spark.class_archive``): built once by a process of its own, mapped by
the sessions that start after it, never mapped part-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from pipelines.config import class_archive
from pipelines.config.settings import Settings, load_settings
from pipelines.config.spark import _start_jvm, check_java, spark_confs


@pytest.fixture
def no_jvm_yet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """As in a process that has not started its JVM, with the user's cache under ``tmp_path``."""
    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "medallion" / "jvm-classes"


def test_the_archive_is_named_by_the_jvm_and_the_jars_it_comes_from(tmp_path: Path) -> None:
    jar = tmp_path / "delta.jar"
    jar.write_bytes(b"one")
    java = check_java()
    key = class_archive.archive_key(java, [str(jar)])
    assert key == class_archive.archive_key(java, [str(jar)])
    assert key != class_archive.archive_key(java, [])
    jar.write_bytes(b"other")
    assert key != class_archive.archive_key(java, [str(jar)])


def _started_with(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[object]]:
    """The driver JVM options each start was given, and the builders started."""
    options: list[str] = []
    builders: list[object] = []
    monkeypatch.setattr(class_archive, "start_builder", lambda *args: builders.append(args))

    def start(confs: dict[str, str]) -> SparkSession:
        options.append(confs["spark.driver.extraJavaOptions"])
        return cast(SparkSession, None)

    _start_jvm(settings, spark_confs(settings), start)
    return options, builders


def test_a_session_maps_the_archive_once_it_exists_and_otherwise_starts_its_builder(
    no_jvm_yet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(lake_root=str(no_jvm_yet.parent))
    default = spark_confs(settings)["spark.driver.extraJavaOptions"]
    archive = class_archive.archive_for(check_java(), [], no_jvm_yet)
    assert _started_with(settings, monkeypatch) == ([default], [(archive, default, [])])  # Java's default

    no_jvm_yet.mkdir(parents=True)
    archive.path.write_bytes(b"an archive")
    mapped = f"{default} -XX:SharedArchiveFile={archive.path} {class_archive.QUIET}"
    assert _started_with(settings, monkeypatch) == ([mapped], [])


@pytest.mark.parametrize(
    "spark_settings",
    [{"class_archive": False}, {"conf": {"spark.driver.extraJavaOptions": "-Xshare:off"}}],
    ids=["off", "users-own-sharing"],
)
def test_no_archive_when_turned_off_or_the_user_sets_class_sharing(
    no_jvm_yet: Path, monkeypatch: pytest.MonkeyPatch, spark_settings: dict[str, object]
) -> None:
    settings = load_settings(lake_root=str(no_jvm_yet.parent), spark=spark_settings)
    no_jvm_yet.mkdir(parents=True)
    class_archive.archive_for(check_java(), [], no_jvm_yet).path.write_bytes(b"an archive")
    assert _started_with(settings, monkeypatch) == ([spark_confs(settings)["spark.driver.extraJavaOptions"]], [])


def test_one_builder_at_a_time_and_what_a_dead_one_left_is_cleared(tmp_path: Path) -> None:
    archive = class_archive.archive_for(check_java(), [], tmp_path)
    archive.lock.write_text(str(os.getpid()))  # a live builder
    assert class_archive.start_builder(archive, "", []) is None
    assert class_archive.build(archive.path, "", []) == 0  # nothing to do: another builder is at it
    assert not archive.path.exists() and archive.lock.exists()

    gone = subprocess.Popen(["true"])
    gone.wait()
    archive.lock.write_text(str(gone.pid))
    part = archive.path.with_name(f"{archive.path.stem}.{gone.pid}.tmp")
    part.write_bytes(b"part of an archive")
    mine = archive.dump()
    mine.write_bytes(b"being written")
    assert class_archive._take_lock(archive.lock)
    class_archive._remove_dead_dumps(tmp_path)
    assert archive.lock.read_text() == str(os.getpid())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([archive.lock.name, mine.name])


def test_a_builder_whose_jvm_fails_leaves_no_archive_and_no_lock(tmp_path: Path) -> None:
    """Starts spark-submit, which refuses the options (a heap size belongs in driver memory)."""
    archive = class_archive.archive_for(check_java(), [], tmp_path)
    build = [sys.executable, "-m", "pipelines.config.class_archive", str(archive.path), "-Xmx1g", ""]
    done = subprocess.run(build, capture_output=True, timeout=120, check=False)
    assert done.returncode != 0
    assert sorted(tmp_path.iterdir()) == []


def test_the_builder_writes_an_archive_that_the_next_session_maps(tmp_path: Path) -> None:
    """Starts JVMs: the builder's, then a session's, then one that faults on a cut archive and the
    session's again (each once)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    loads = tmp_path / "class-load.log"
    session = (
        "from pipelines.config.settings import load_settings\n"
        "from pipelines.config.spark import build_spark\n"
        f"s = load_settings(lake_root={str(tmp_path / 'lake')!r}, delta_engine='delta-rs', spark={{'conf': {{"
        f"'spark.driver.extraJavaOptions': '-Duser.timezone=UTC -Xlog:class+load=info:file={loads}'}}}})\n"
        "spark = build_spark(s)\n"
        "print(spark.range(3).count())\n"
    )
    archive = class_archive.archive_for(check_java(), [], tmp_path / "cache" / "medallion" / "jvm-classes")
    build = [sys.executable, "-m", "pipelines.config.class_archive", str(archive.path), "-Duser.timezone=UTC", ""]
    archive.path.parent.mkdir(parents=True)
    built = subprocess.run(build, env=env, capture_output=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    assert [p.name for p in archive.path.parent.iterdir()] == [archive.path.name]  # no lock, no part left

    ran = subprocess.run([sys.executable, "-c", session], env=env, capture_output=True, timeout=300, check=False)
    assert ran.returncode == 0 and ran.stdout.decode().split() == ["3"], ran.stderr.decode()[-2000:]
    shared = [line for line in loads.read_text().splitlines() if "shared objects file (top)" in line]
    assert any(" org.apache.spark.SparkContext " in line for line in shared), json.dumps(shared[:5])
    # The session found the archive: it started no builder of its own.
    time.sleep(1)
    assert [p.name for p in archive.path.parent.iterdir()] == [archive.path.name]

    # An archive cut short (Java faults mapping one) is removed, and the session starts without it.
    with archive.path.open("r+b") as cut:
        cut.truncate(archive.path.stat().st_size // 3)
    # (Java's report of the fault goes to the JVM's stdout and an hs_err file in the working folder.)
    ran = subprocess.run(
        [sys.executable, "-c", session], env=env, cwd=tmp_path, capture_output=True, timeout=300, check=False
    )
    assert ran.returncode == 0 and ran.stdout.decode().split()[-1:] == ["3"], ran.stderr.decode()[-2000:]
    assert not archive.path.exists()
