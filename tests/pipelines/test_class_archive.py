"""The JVM's class archive (``spark.class_archive``): built once by a process of its own, mapped by
the sessions that start after it, never mapped part-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from pipelines.config import class_archive
from pipelines.config import spark as spark_module
from pipelines.config.settings import Settings, load_settings
from pipelines.config.spark import _start_jvm, check_java, spark_confs


@pytest.fixture
def no_jvm_yet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """As in a process that has not started its JVM, with the user's cache under ``tmp_path``."""
    monkeypatch.setattr(SparkContext, "_gateway", None)
    # The suite's own session is this process's active one: not a cluster manager's here.
    monkeypatch.setattr(spark_module, "_under_cluster_manager", lambda: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for handed_over in ("PYSPARK_GATEWAY_PORT", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(handed_over, raising=False)
    return tmp_path / "medallion" / "jvm-classes"


def test_the_archive_is_named_by_the_jvm_and_the_jars_it_comes_from(tmp_path: Path) -> None:
    jar = tmp_path / "delta.jar"
    jar.write_bytes(b"one")
    java = check_java()
    key = class_archive.archive_key(java, [str(jar)])
    assert key == class_archive.archive_key(java, [str(jar)])
    assert key != class_archive.archive_key(java, [])
    assert key != class_archive.archive_key(java, [str(jar)], "/opt/extra/*")
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
    archive = class_archive.archive_for(check_java(), [], folder=no_jvm_yet)
    assert _started_with(settings, monkeypatch) == ([default], [(archive, [], "")])  # Java's default

    no_jvm_yet.mkdir(parents=True)
    archive.path.write_bytes(b"an archive")
    mapped = f"{default} -XX:SharedArchiveFile={archive.path} {class_archive.QUIET}"
    assert _started_with(settings, monkeypatch) == ([mapped], [])


@pytest.mark.parametrize(
    "spark_settings",
    [
        {"class_archive": False},
        {"conf": {"spark.driver.extraJavaOptions": "-Xshare:off"}},
        {"conf": {"spark.driver.defaultJavaOptions": "-XX:SharedArchiveFile=/theirs.jsa"}},
    ],
    ids=["off", "users-own-sharing", "users-own-archive"],
)
def test_no_archive_when_turned_off_or_the_user_sets_class_sharing(
    no_jvm_yet: Path, monkeypatch: pytest.MonkeyPatch, spark_settings: dict[str, object]
) -> None:
    settings = load_settings(lake_root=str(no_jvm_yet.parent), spark=spark_settings)
    no_jvm_yet.mkdir(parents=True)
    class_archive.archive_for(check_java(), [], folder=no_jvm_yet).path.write_bytes(b"an archive")
    assert _started_with(settings, monkeypatch) == ([spark_confs(settings)["spark.driver.extraJavaOptions"]], [])


def test_the_module_imports_where_there_is_no_fcntl() -> None:
    # Windows has no fcntl: the module every session start imports must import there (the
    # archive is POSIX only, usable_here). A fresh interpreter, so no module is imported before.
    code = "import sys; sys.modules['fcntl'] = None; from pipelines.config import class_archive, spark; print('ok')"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (found.returncode, found.stdout.strip()) == (0, "ok"), found.stderr


def test_one_builder_at_a_time_and_none_again_soon_after_a_failure(tmp_path: Path) -> None:
    archive = class_archive.archive_for(check_java(), [], folder=tmp_path)
    held = class_archive._lock(archive)  # a builder at work
    assert held is not None
    assert class_archive._lock(archive) is None
    assert class_archive.start_builder(archive, []) is None
    assert class_archive.build(archive.path, []) == 0  # nothing to do: the other builder is at it
    os.close(held)
    assert not archive.path.exists()

    archive.beside(".failed").write_text("the JVM exited 1 without an archive\n")
    assert class_archive.start_builder(archive, []) is None


def test_the_folder_keeps_the_newest_used_archives(tmp_path: Path) -> None:
    for n, name in enumerate(["a", "b", "c", "d"]):
        for suffix in (".jsa", ".log"):
            (tmp_path / f"{name}{suffix}").write_text(name)
        os.utime(tmp_path / f"{name}.jsa", (1_000 + n, 1_000 + n))
    os.utime(tmp_path / "a.jsa")  # mapped just now
    class_archive._evict(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsa", "a.log", "c.jsa", "c.log", "d.jsa", "d.log"]


def test_a_builder_whose_jvm_fails_leaves_no_archive_and_says_why(tmp_path: Path) -> None:
    """Starts spark-submit, which refuses the options (Spark's own, here given a heap size)."""
    archive = class_archive.archive_for(check_java(), [], folder=tmp_path)
    part = tmp_path / f"{archive.path.stem}.99999999.tmp"
    part.write_bytes(b"a dead builder's dump")
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "--conf spark.driver.extraJavaOptions=-Xmx1g pyspark-shell"}
    build = [sys.executable, "-m", "pipelines.config.class_archive", str(archive.path), ""]
    done = subprocess.run(build, env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode != 0 and b"Xmx" in done.stderr + done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([archive.beside(s).name for s in (".lock", ".failed")])


@pytest.mark.slow(seconds=90)  # the builder's JVM and three sessions' one after another
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
    archive = class_archive.archive_for(check_java(), [], folder=tmp_path / "cache" / "medallion" / "jvm-classes")
    build = [sys.executable, "-m", "pipelines.config.class_archive", str(archive.path), ""]
    archive.path.parent.mkdir(parents=True)
    built = subprocess.run(
        build, env=env, capture_output=True, timeout=1200, check=False, start_new_session=True
    )  # it yields the processors to everything else: a busy machine slows it
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    assert sorted(p.name for p in archive.path.parent.iterdir()) == sorted(
        [archive.path.name, archive.beside(".lock").name]
    )

    ran = subprocess.run([sys.executable, "-c", session], env=env, capture_output=True, timeout=300, check=False)
    assert ran.returncode == 0 and ran.stdout.decode().split() == ["3"], ran.stderr.decode()[-2000:]
    shared = [line for line in loads.read_text().splitlines() if "shared objects file (top)" in line]
    assert any(" org.apache.spark.SparkContext " in line for line in shared), json.dumps(shared[:5])
    # An archive cut short (Java faults mapping one) is removed, and the session starts without it.
    with archive.path.open("r+b") as cut:
        cut.truncate(archive.path.stat().st_size // 3)
    # (Java's report of the fault goes to the JVM's stdout and an hs_err file in the working folder.)
    ran = subprocess.run(
        [sys.executable, "-c", session], env=env, cwd=tmp_path, capture_output=True, timeout=300, check=False
    )
    assert ran.returncode == 0 and ran.stdout.decode().split()[-1:] == ["3"], ran.stderr.decode()[-2000:]
    assert not archive.path.exists()
