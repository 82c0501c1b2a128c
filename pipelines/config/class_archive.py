"""The JVM's loaded classes, kept between runs: Java's class-data sharing (AppCDS) for the sessions
this process starts.

A Spark driver loads about 13,000 classes at start and on its first queries, each read from a
jar, parsed and verified; a scheduled job pays that on every run. A dynamic archive
(``-XX:ArchiveClassesAtExit``, JDK 13+) holds them as a JVM left them, and a later JVM maps it
(``-XX:SharedArchiveFile``): a local session and its first queries about 3 s sooner, a third less
of the JVM's CPU at start (docs/performance.md).

One archive (about 175 MB) per JVM build, Spark build and class path, in the user's cache, named by
a digest of them; the newest :data:`KEEP` are kept. A session that finds none starts as Java's
default does and hands the archive's making to a builder process of its own (``python -m
pipelines.config.class_archive``): one at a time (a lock the kernel drops with its holder), at the
lowest priority, it starts a session of the same JVM and jars, runs the pipeline's transforms on a
few events, and at its JVM's exit waits while Java writes the archive (about 10 s), then renames it
into place only if the JVM exited cleanly, so a reader never maps a part-written archive (Java
faults on one). A build that fails is not tried again for a day (``<key>.failed``, its output in
``<key>.log``). A JVM that does not accept an archive (another build, a changed jar) starts without
it, as Java does by default.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Keeps the archive's messages off the console (Java logs a refused archive as a warning).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: Archives kept in the folder (the newest used); older ones are removed by the next build.
KEEP = 3
#: A build that failed is not tried again for this long.
RETRY_AFTER_SECONDS = 86_400.0
#: A builder gives its JVM this long to exit and write the archive (it yields the processors to
#: everything else, so a busy machine slows it).
DUMP_TIMEOUT = 900.0
#: What a builder must not inherit from the process that started it: a Connect session's or
#: spark-submit's hand-over to a JVM that is not the builder's own.
NOT_INHERITED = (
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN",
    "SPARK_API_MODE",
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "PYSPARK_SUBMIT_ARGS",
)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "medallion" / "jvm-classes"


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def archive_key(java: str, jars: list[str], class_path: str = "") -> str:
    """A digest of what the archive's classes come from: the JVM (its launcher and library), Spark's
    jars (pyspark's, or ``SPARK_HOME``'s), the extra jars (``spark.jars``) and class path. Any change
    names a new archive."""
    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    listed = sorted((home / "jars").glob("*.jar")) if (home / "jars").is_dir() else []
    launcher = Path(os.path.realpath(java))
    parts = [
        _stamp(launcher),
        _stamp(launcher.parent.parent / "lib" / "server" / "libjvm.so"),
        pyspark.__version__,
        class_path,
        *(_stamp(p) for p in listed),
        *(_stamp(Path(j)) for j in jars if "://" not in j),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Archive:
    """Where the archive of one JVM and class path lives, and its builder's files beside it."""

    path: Path

    def beside(self, suffix: str) -> Path:
        return self.path.with_suffix(suffix)

    def dump(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.{os.getpid()}.tmp")


def archive_for(java: str, jars: list[str], class_path: str = "", folder: Path | None = None) -> Archive:
    return Archive((folder or cache_dir()) / f"{archive_key(java, jars, class_path)}.jsa")


def usable_here() -> bool:
    """POSIX (the lock and the builder's priority are), and a cache path Spark's option parser
    keeps whole (it splits JVM options at spaces)."""
    return os.name == "posix" and not any(c.isspace() for c in str(cache_dir()))


def options(archive: Archive) -> str | None:
    """The JVM options that map ``archive``; None while it does not exist. Mapping it marks it used
    (the folder keeps the newest used)."""
    try:
        os.utime(archive.path)
    except OSError:
        return None
    return f"-XX:SharedArchiveFile={archive.path} {QUIET}"


def _lock(archive: Archive) -> int | None:
    """The builder's lock on ``archive``, held until the descriptor closes or the process dies;
    None while another process holds it. The file stays: only the kernel's lock on it counts."""
    import fcntl  # POSIX only, as the archive is (usable_here): the module imports everywhere

    fd = os.open(archive.beside(".lock"), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _failed_lately(archive: Archive) -> bool:
    try:
        return time.time() - archive.beside(".failed").stat().st_mtime < RETRY_AFTER_SECONDS
    except OSError:
        return False


def start_builder(archive: Archive, jars: list[str], class_path: str = "") -> subprocess.Popen[bytes] | None:
    """Starts the builder of ``archive`` in a session of its own, unless one is at work on it, a
    build failed lately, or its folder cannot be written. It outlives this process and ends by
    itself; its output goes to ``<key>.log``."""
    folder = archive.path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if _failed_lately(archive) or not os.access(folder, os.W_OK):
            return None
        held = _lock(archive)
        if held is None:
            return None
        os.close(held)  # free again: the builder takes it (of two started at once, one builds)
        # Nor the user's settings: the builder runs the transforms with the defaults, from the cache
        # folder, where a relative MEDALLION_CONFIG would not resolve.
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED and not k.startswith("MEDALLION_")}
        command = [sys.executable, "-m", __name__, str(archive.path), ",".join(jars), class_path]
        with archive.beside(".log").open("wb") as log:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=folder,  # a JVM's crash report lands beside the archive, not in the user's folder
                env=env,
                start_new_session=True,  # not in the caller's process group: a Ctrl-C there does not reach it
            )
    except OSError:
        return None


def _evict(folder: Path, keep: int = KEEP) -> None:
    """Archives past the newest used ``keep``, with their builders' files."""

    def used(archive: Path) -> float:
        try:
            return archive.stat().st_mtime
        except OSError:  # removed meanwhile (a session that could not start with it)
            return 0.0

    archives = sorted(folder.glob("*.jsa"), key=used, reverse=True)
    for old in archives[keep:]:
        for left in (old, old.with_suffix(".log"), old.with_suffix(".failed")):
            left.unlink(missing_ok=True)


def _work(spark: SparkSession) -> None:
    """The pipeline's transforms on a few events, so that the JVM loads what a run loads: the
    JSON and variant parse of bronze, silver's buckets, gold's fan-out and aggregation, and a
    Parquet write and read."""
    import json
    from datetime import UTC, datetime

    from bronze.events import parse_events
    from bronze.landing import LANDING_SCHEMA, valid
    from gold.property_values import counted_partials, tuple_counts
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
    counts = tuple_counts(layers.fanout_rules(settings), settings.gold.window, settings.bronze.number_notation)
    gold = silver.transform(counts).where("skip_reason IS NULL").transform(counted_partials())
    with tempfile.TemporaryDirectory(prefix="medallion-classes-") as folder:
        gold.write.parquet(f"{folder}/gold")
        # A row per team of four events: read back to load the read path's classes.
        spark.read.parquet(f"{folder}/gold").groupBy("team_id").count().collect()


def _lowest_priority() -> None:
    """The builder and its JVM yield the processors to anything else. Linux shares the processors
    between sessions first (autogroup), whatever a process's nice value, so a builder that leads a
    session of its own lowers the session's share as well."""
    if os.getsid(0) == os.getpid():
        try:
            Path("/proc/self/autogroup").write_text("19")
        except OSError:  # no autogroup (another OS, or the kernel's off)
            pass
    os.nice(19)


def _dump_with(dump: Path, jars: list[str], class_path: str) -> int:
    """Runs a session whose JVM dumps its classes into ``dump`` at exit; the JVM's exit code."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    log4j = Path(__file__).with_name("log4j2.properties").as_uri()
    java_options = f"-Duser.timezone=UTC -Dlog4j2.configurationFile={log4j} -XX:ArchiveClassesAtExit={dump} {QUIET}"
    builder = SparkSession.builder.master("local[1]").appName("medallion-class-archive")
    builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
    builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    if class_path:  # Java maps an archive only for the class path it was written with
        builder = builder.config("spark.driver.extraClassPath", class_path)
    spark = builder.getOrCreate()
    proc = SparkContext._gateway.proc  # type: ignore[union-attr]
    try:
        _work(spark)
    finally:
        try:
            spark.stop()
        finally:
            proc.stdin.close()  # the gateway exits at EOF on its stdin; Java then writes the archive
            try:
                proc.wait(timeout=DUMP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return int(proc.returncode)


def build(path: Path, jars: list[str], class_path: str = "") -> int:
    """Writes the archive at ``path`` (the builder process's body); 0 when it was written or is
    another builder's to write. A failure is marked ``<key>.failed`` for a day."""
    archive = Archive(path)
    held = _lock(archive)
    if held is None or archive.path.is_file():
        return 0
    dump = archive.dump()
    try:
        # Only the lock's holder dumps this key's archive: any other dump of it is a dead builder's.
        for left in archive.path.parent.glob(f"{archive.path.stem}.*.tmp"):
            left.unlink(missing_ok=True)
        _lowest_priority()
        code = _dump_with(dump, jars, class_path)
        if code != 0 or not dump.is_file() or dump.stat().st_size == 0:
            archive.beside(".failed").write_text(f"the JVM exited {code} without an archive\n")
            return 1
        with dump.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(dump, archive.path)
        archive.beside(".failed").unlink(missing_ok=True)
    except Exception as exc:
        archive.beside(".failed").write_text(f"{type(exc).__name__}: {exc}\n")
        raise
    finally:
        dump.unlink(missing_ok=True)
        os.close(held)
    _evict(archive.path.parent)
    return 0


if __name__ == "__main__":
    sys.exit(build(Path(sys.argv[1]), [j for j in sys.argv[2].split(",") if j], *sys.argv[3:4]))
