"""The JVM's loaded classes, kept between runs: Java's class-data sharing (AppCDS) for the sessions
this process starts.

A Spark driver loads about 13,000 classes at start and on its first queries, each read from a
jar, parsed and verified; a scheduled job pays that on every run. A dynamic archive
(``-XX:ArchiveClassesAtExit``, JDK 13+) holds them as a JVM left them, and a later JVM maps it
(``-XX:SharedArchiveFile``): a local session and its first queries about 3 s sooner, a third less
of the JVM's CPU at start (docs/performance.md).

One archive per JVM build, pyspark build and jar set, in the user's cache, named by a digest of
them. A session that finds none starts as Java's default does and hands the archive's making to a
builder process of its own (``python -m pipelines.config.class_archive``, at low priority, one at
a time): it starts a session of the same JVM and jars, runs the pipeline's transforms on a few
events, and at its JVM's exit waits while Java writes the archive (about 10 s), then renames it
into place only if the JVM exited cleanly, so a reader never maps a part-written archive (Java
faults on one). A JVM that does not accept an archive (another build, a changed jar) starts
without it, as Java does by default.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Keeps the archive's messages off the console (Java logs a refused archive as a warning).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: A lock whose builder's process id cannot be read is taken to be left by a dead one after this long.
STALE_SECONDS = 600.0
#: A builder gives its JVM this long to exit and write the archive.
DUMP_TIMEOUT = 300.0


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "medallion" / "jvm-classes"


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def archive_key(java: str, jars: list[str]) -> str:
    """A digest of what the archive's classes come from: the JVM binary, pyspark's jars and the
    extra jars (``spark.jars``). Any change names a new archive."""
    spark_jars = Path(pyspark.__file__).parent / "jars"
    listed = sorted(spark_jars.glob("*.jar")) if spark_jars.is_dir() else []
    parts = [
        _stamp(Path(os.path.realpath(java))),
        version("pyspark"),
        *(_stamp(p) for p in listed),
        *(_stamp(Path(j)) for j in jars if "://" not in j),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Archive:
    """Where the archive of one JVM and jar set lives, and the builder's lock beside it."""

    path: Path

    @property
    def lock(self) -> Path:
        return self.path.with_suffix(".lock")

    def dump(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.{os.getpid()}.tmp")


def archive_for(java: str, jars: list[str], folder: Path | None = None) -> Archive:
    return Archive((folder or cache_dir()) / f"{archive_key(java, jars)}.jsa")


def options(archive: Archive) -> str | None:
    """The JVM options that map ``archive``; None while it does not exist."""
    return f"-XX:SharedArchiveFile={archive.path} {QUIET}" if archive.path.is_file() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _held(lock: Path) -> bool:
    """Whether a live builder holds ``lock`` (the file holds its process id)."""
    try:
        pid = int(lock.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # being written (or unreadable): its age decides
        try:
            return time.time() - lock.stat().st_mtime < STALE_SECONDS
        except OSError:
            return False
    return _alive(pid)


def start_builder(archive: Archive, java_options: str, jars: list[str]) -> subprocess.Popen[bytes] | None:
    """Starts the builder of ``archive`` in a session of its own, unless one is at work on it or
    its folder cannot be written. It outlives this process and ends by itself."""
    if _held(archive.lock):
        return None
    try:
        archive.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(archive.path.parent, os.W_OK):
        return None
    command = [sys.executable, "-m", __name__, str(archive.path), java_options, ",".join(jars)]
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the caller's process group: a Ctrl-C there does not reach it
    )


def _take_lock(lock: Path) -> bool:
    if lock.exists() and not _held(lock):
        lock.unlink(missing_ok=True)  # its builder died
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _remove_dead_dumps(folder: Path) -> None:
    """Dumps left by builders that died before renaming them (``<key>.<pid>.tmp``)."""
    for left in folder.glob("*.tmp"):
        pid = left.suffixes[-2][1:] if len(left.suffixes) >= 2 else ""
        if not pid.isdigit() or not _alive(int(pid)):
            left.unlink(missing_ok=True)


def _work(spark: SparkSession) -> None:
    """The pipeline's transforms on a few events, so that the JVM loads what a run loads: the
    JSON and variant parse of bronze, silver's property documents and buckets, gold's fan-out and
    aggregation, and a Parquet write and read."""
    import json
    from datetime import UTC, datetime

    from bronze.events import parse_events
    from bronze.landing import LANDING_SCHEMA, valid
    from gold.property_values import fan_out, partials
    from pipelines.config import layers
    from pipelines.config.settings import Settings
    from silver.events import to_silver_events

    settings = Settings()
    now = datetime.now(UTC)
    events = [
        {
            "uuid": f"00000000-0000-4000-8000-00000000000{i}",
            "event": "$pageview",
            "team_id": 1 + i,
            "distinct_id": f"user-{i}",
            "timestamp": "2024-06-01T00:00:00Z",
            "properties": {"$browser": "Firefox", "n": i, "x": 1.5, "tags": ["a"], "$set": {"plan": "free"}},
        }
        for i in range(4)
    ]
    rows = [(json.dumps(e).encode(), "file", None, None, i, None, "x", now, "x") for i, e in enumerate(events)]
    landing = spark.createDataFrame(rows, LANDING_SCHEMA)
    parsed = landing.transform(parse_events(settings.kafka.max_message_bytes))
    bronze = valid(parsed, [c for c in parsed.columns if c not in ("value", "reason")])
    silver = bronze.transform(to_silver_events(layers.bucket_mapping(settings)))
    gold = silver.transform(fan_out(layers.fanout_rules(settings))).transform(partials(settings.gold.window))
    with tempfile.TemporaryDirectory(prefix="medallion-classes-") as folder:
        gold.write.parquet(f"{folder}/gold")
        spark.read.parquet(f"{folder}/gold").groupBy("team_id").count().collect()


def build(path: Path, java_options: str, jars: list[str]) -> int:
    """Writes the archive at ``path`` (the builder process's body); 0 when it was written."""
    archive = Archive(path)
    if archive.path.is_file() or not _take_lock(archive.lock):
        return 0
    try:
        _remove_dead_dumps(archive.path.parent)
        os.nice(10)
        dump = archive.dump()
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[1]").appName("medallion-class-archive")
        builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
        java_options = f"{java_options} -XX:ArchiveClassesAtExit={dump} {QUIET}"
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        spark = builder.getOrCreate()
        proc = SparkContext._gateway.proc  # type: ignore[union-attr]
        try:
            _work(spark)
        finally:
            spark.stop()
            proc.stdin.close()  # the gateway exits at EOF on its stdin; Java then writes the archive
            code = proc.wait(timeout=DUMP_TIMEOUT)
        if code == 0 and dump.is_file() and dump.stat().st_size > 0:
            os.replace(dump, archive.path)
            return 0
        dump.unlink(missing_ok=True)
        return 1
    finally:
        archive.lock.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(build(Path(sys.argv[1]), sys.argv[2], [j for j in sys.argv[3].split(",") if j]))
