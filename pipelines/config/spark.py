"""The one place that builds the SparkSession.

Local defaults keep a laptop run quick (UI off, few shuffle partitions, UTC, Arrow on). Under
spark-submit or on a cluster the master and resources come from there, and only the pipeline's
confs are added. The Delta SQL extension is enabled only for the ``delta-spark`` engine, since
it needs the Delta jars on the JVM classpath.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame, Observation, SparkSession

from pipelines.config import class_archive
from pipelines.config.settings import Settings
from pipelines.errors import EngineUnavailableError, JavaNotFoundError

log = logging.getLogger(__name__)

DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

#: ``spark.generated_code: false``: no Java generated and compiled per query (whole-stage code and
#: expression code alike). A small batch's queries carry new literals each run (versions,
#: watermarks), so their code is compiled anew each time, and compiling costs more than running them.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}

#: pyspark's DataFrame debugging (``spark.dataframe_debugging``), on by Spark's default: with it, each
#: pyspark function call captures its Python call site and hands it to the JVM (PySparkCurrentOrigin,
#: a conf read and two calls more per function), so a runtime error can name the line. A 1-event
#: pass of ``run all`` made 16,400 JVM calls with it and 9,000 without (docs/performance.md). A
#: static conf: a session this process starts takes it; a cluster's own session keeps its value.
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "true",
    "spark.sql.adaptive.enabled": "true",
    # A JSON object with a key twice keeps the last occurrence, as JSON parsers (PostHog's too) do,
    # instead of failing to parse and sending the whole event to quarantine.
    "spark.sql.variant.allowDuplicateKeys": "true",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC -Dlog4j2.configurationFile={log4j}",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.warehouse.dir": "",  # set per lake root below
}

#: Confs of the classic Python client that a Connect session refuses (it has no Arrow fallback).
CLASSIC_ONLY = {"spark.sql.execution.arrow.pyspark.fallback.enabled"}
#: Where a Connect server this process starts listens: a free port on loopback, unless the
#: settings say otherwise. Its only client is this process; Spark's default (0.0.0.0:15002, one
#: per host) made a second process on a local remote fail to bind ("Failed to bind ... 15002").
CONNECT_SERVER = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": "0"}
CONNECT_SERVICE = "org.apache.spark.sql.connect.service.SparkConnectService$"

JAVA_HELP = (
    "Java 17 is required by Spark but was not found: install a JDK/JRE 17 "
    "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`; macOS: `brew install openjdk@17`) "
    "or point JAVA_HOME at one"
)


def check_java() -> str:
    """Return the java executable Spark will use, or raise :class:`JavaNotFoundError`."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        where = f" (JAVA_HOME={java_home} has no bin/java)" if java_home else ""
        raise JavaNotFoundError(JAVA_HELP + where)
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaNotFoundError(f"{JAVA_HELP} ({java} -version failed: {exc})") from exc
    return java


def _under_cluster_manager() -> bool:
    # spark-submit and Databricks start the JVM first and hand Python a gateway.
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT")) or SparkSession.getActiveSession() is not None


def spark_confs(settings: Settings) -> dict[str, str]:
    """Every conf the pipeline sets on a new session (user confs win over defaults)."""
    confs = dict(LOCAL_DEFAULTS)
    log4j = Path(__file__).with_name("log4j2.properties").as_uri()
    confs["spark.driver.extraJavaOptions"] = confs["spark.driver.extraJavaOptions"].format(log4j=log4j)
    confs["spark.sql.warehouse.dir"] = f"{settings.lake_root}/_spark_warehouse"
    confs["spark.sql.shuffle.partitions"] = str(settings.spark.shuffle_partitions)
    # Listing a table's folders in parallel runs up to this many tasks, 10,000 by default, and
    # Delta's VACUUM always lists that way: VACUUM of a small table took 22-33 s of those tasks on
    # 2 cores, 2 s with the shuffle's count. The shuffle's count scales with the cluster as set.
    confs["spark.sql.sources.parallelPartitionDiscovery.parallelism"] = str(settings.spark.shuffle_partitions)
    confs["spark.driver.memory"] = settings.spark.driver_memory
    if not settings.spark.generated_code:
        confs.update(INTERPRETED)
    confs[DATAFRAME_DEBUGGING] = str(settings.spark.dataframe_debugging).lower()
    if not os.environ.get("PYSPARK_PYTHON"):
        # Python workers (pandas UDFs) need this interpreter's packages; Spark's default is
        # whatever ``python3`` is first on PATH, which outside an activated venv has none of them.
        confs["spark.pyspark.python"] = sys.executable
    if settings.delta_engine == "delta-spark":
        confs.update(DELTA_CONFS)
        # Sessions this process starts (never a cluster's: those take only spark.sql.* confs).
        # Delta rebuilds a table's state (files, app transactions) after each commit in a Spark
        # job of ``snapshotPartitions`` tasks, 50 by default: on a laptop that was most of a
        # small commit's time, so the log state follows the shuffles. A checkpoint cost ~5 s
        # here and came every 10 commits; new tables take delta-rs's cadence, every 100.
        confs["spark.databricks.delta.snapshotPartitions"] = str(settings.spark.shuffle_partitions)
        confs["spark.databricks.delta.properties.defaults.checkpointInterval"] = "100"
        if settings.delta_jars:
            missing = [j for j in settings.delta_jars if "://" not in j and not Path(j).exists()]
            if missing:
                raise EngineUnavailableError(
                    f"MEDALLION_DELTA_JARS names files that do not exist: {', '.join(missing)}"
                )
            confs["spark.jars"] = ",".join(settings.delta_jars)
    confs.update(settings.spark.conf)
    return confs


def _runtime_confs(confs: dict[str, str]) -> dict[str, str]:
    """The confs a running session takes: SQL confs, less the static ones set at its start."""
    return {
        k: v
        for k, v in confs.items()
        if k.startswith("spark.sql.") and k not in DELTA_CONFS and k != "spark.sql.warehouse.dir"
    }


def _gateway_exited(exc: Exception) -> bool:
    return "JAVA_GATEWAY_EXITED" in str(exc) or "Java gateway process exited" in str(exc)


def _start_jvm(
    settings: Settings, confs: dict[str, str], start: Callable[[dict[str, str]], SparkSession]
) -> SparkSession:
    """``start(confs)``, the session whose JVM this process starts, with the class archive of this
    JVM and class path mapped (``spark.class_archive``). Where there is none yet, the session starts
    without it and its builder is started. An archive the JVM cannot start with is removed once the
    start without it succeeds. No archive when the setting is off, a JVM runs in this process
    already or a cluster manager started one, or the user's own JVM options set class sharing."""
    java = check_java()
    options = confs.get("spark.driver.extraJavaOptions", "")
    theirs = " ".join(
        [options, confs.get("spark.driver.defaultJavaOptions", "")]
        + [os.environ.get(v, "") for v in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")]
    )
    own = any(flag in theirs for flag in ("Xshare", "SharedArchiveFile", "ArchiveClassesAtExit"))
    if not settings.spark.class_archive or own or SparkContext._gateway is not None or _under_cluster_manager():
        return start(confs)
    jars = [j for j in confs.get("spark.jars", "").split(",") if j]
    class_path = confs.get("spark.driver.extraClassPath", "")
    archive, mapped = None, None
    try:  # the archive is a speed-up: whatever stops it (no home folder, say), the session starts without
        if class_archive.usable_here():
            archive = class_archive.archive_for(java, jars, class_path)
            mapped = class_archive.options(archive)
    except Exception:
        archive = None
    if archive is None or mapped is None:
        spark = start(confs)
        if archive is not None:
            class_archive.start_builder(archive, jars, class_path)
        return spark
    try:
        return start({**confs, "spark.driver.extraJavaOptions": f"{options} {mapped}".strip()})
    except Exception as exc:
        if not _gateway_exited(exc):
            raise
        spark = start(confs)  # raises as before if the JVM cannot start without it either
        archive.path.unlink(missing_ok=True)  # the JVM could not start with it: the next run rebuilds it
        return spark


def connect_server_port() -> int:
    """The port the Connect server this process started is bound to (it binds a free one)."""
    jvm = SparkContext._jvm
    assert jvm is not None, "the Connect server's session started no JVM"
    return int(getattr(getattr(jvm, CONNECT_SERVICE), "MODULE$").localPort())


def build_connect(settings: Settings, confs: dict[str, str]) -> SparkSession:
    """A Spark Connect session: ``sc://host:port`` reaches a running Connect server (serverless
    and standard-access compute work this way); a master (``local[N]``, ``spark://host:port``)
    starts one here, with every conf, whose work runs on that master."""
    remote = settings.spark.remote
    assert remote is not None
    confs = {k: v for k, v in confs.items() if k not in CLASSIC_ONLY}
    if remote.startswith("sc://"):
        spark = SparkSession.builder.remote(remote).getOrCreate()
        for key, value in _runtime_confs(confs).items():
            spark.conf.set(key, value)
        return spark
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable

    def start(confs: dict[str, str]) -> SparkSession:
        # As Spark's API mode "connect" does on any master (remote() takes only local[N]): a
        # classic session in this process starts the server, and the client session talks to it,
        # here at the port the server bound (pyspark's own client assumes 15002).
        from pyspark.sql.connect.session import SparkSession as RemoteSession

        opts: dict[str, Any] = {**CONNECT_SERVER, **confs, "spark.app.name": settings.spark.app_name}
        os.environ["SPARK_LOCAL_REMOTE"] = "1"
        RemoteSession._start_connect_server(remote, opts)  # leaves the runtime confs in opts
        port = connect_server_port()
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        with warnings.catch_warnings():
            # The local server starts with every conf; the client then sets them again on its
            # session, and Spark refuses the static ones it already has ("Failed to set ...").
            warnings.filterwarnings("ignore", message="Failed to set spark")
            client = RemoteSession.builder.remote(f"sc://localhost:{port}").config(map=opts).getOrCreate()
        return client  # type: ignore[return-value]

    return _start_jvm(settings, confs, start)


def build_spark(settings: Settings) -> SparkSession:
    """Return the SparkSession for these settings (reusing an active one on a cluster)."""
    confs = spark_confs(settings)
    if settings.spark.remote:
        return build_connect(settings, confs)
    if _under_cluster_manager():
        spark = SparkSession.builder.getOrCreate()
        for key, value in _runtime_confs(confs).items():
            spark.conf.set(key, value)
        return spark

    if not os.environ.get("PYSPARK_PYTHON"):
        # The conf alone does not reach every worker launch (Arrow UDFs in local mode start
        # ``$PYSPARK_PYTHON`` or ``python3`` from PATH), so the environment says it too.
        os.environ["PYSPARK_PYTHON"] = sys.executable

    def start(confs: dict[str, str]) -> SparkSession:
        builder = SparkSession.builder.master(settings.spark.master or "local[2]").appName(settings.spark.app_name)
        for key, value in confs.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    try:
        spark = _start_jvm(settings, confs, start)
    except Exception as exc:  # py4j/pyspark raise several types when the JVM cannot start
        if _gateway_exited(exc):
            raise JavaNotFoundError(f"{JAVA_HELP} (the Java gateway exited at start)") from exc
        raise
    spark.sparkContext.setLogLevel(settings.spark.log_level)
    return spark


def has_delta_classes(spark: SparkSession) -> bool:
    """True when this session can read Delta: the Delta Lake classes are on its classpath.

    Asked of the session itself (the ``delta`` source resolves, or Spark names it as missing), so
    it holds over Spark Connect too, where no JVM is at hand.
    """
    probe = f"{spark.conf.get('spark.sql.warehouse.dir', '/tmp')}/_medallion_delta_probe_missing"
    try:
        spark.read.format("delta").load(probe).schema  # noqa: B018 (resolving it is the probe)
    except Exception as exc:
        text = str(exc)
        if "DATA_SOURCE_NOT_FOUND" in text or "Failed to find the data source" in text:
            return False
        return True  # the source resolved; the probe path is (meant to be) missing
    return True


#: The confs blocks of :func:`session_confs` hold on a session, by session and key: the value the
#: session had before the first of them, and how many hold it. Threads may share a session (the
#: buckets of one gold stage, on delta-rs); the last block out restores the first one's value.
_HELD: dict[tuple[int, str], list[Any]] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """``confs`` set on the session in this block; each key's own value (or its absence) comes
    back after the last block that set it ends.

    Blocks may overlap on one session (threads sharing it): each restoring what it found would
    leave the session with a value one of them set, where the last one out restores the value the
    session had before the first. While they overlap, the session holds the value set last (a block
    inside another that sets a key to another value leaves its value until the outer one ends).
    Blocks are counted by the session object (``id``): one Python session, one count."""
    taken: list[tuple[int, str]] = []
    try:
        with _HELD_LOCK:
            for key, value in confs.items():
                held = _HELD.get((id(spark), key))
                if held is None:
                    held = _HELD[(id(spark), key)] = [spark.conf.get(key, None), 0]
                held[1] += 1
                taken.append((id(spark), key))
                spark.conf.set(key, value)
        yield
    finally:
        with _HELD_LOCK:
            restore: list[tuple[str, str | None]] = []
            for held_key in taken:  # every count given back first: a restore that fails leaks none
                held = _HELD[held_key]
                held[1] -= 1
                if not held[1]:
                    del _HELD[held_key]
                    restore.append((held_key[1], held[0]))
            failed: Exception | None = None
            for key, old in restore:
                try:
                    if old is None:
                        spark.conf.unset(key)
                    else:
                        spark.conf.set(key, old)
                except Exception as exc:  # the others still restored; the first error raised
                    failed = failed or exc
            if failed is not None:
                raise failed


#: A small increment's queries are planned whole (:func:`small_increment`).
ADAPTIVE = "spark.sql.adaptive.enabled"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@contextmanager
def small_increment(
    spark: SparkSession, settings: Settings, rows: int | None, interpreted: bool = False
) -> Iterator[None]:
    """A block of a flow run whose new rows are ``rows`` (None: not known): where they are at most
    ``spark.small_increment_rows``, its queries are planned whole, without adaptive execution, over
    one shuffle partition per core of the session (at most the session's own count).

    Adaptive execution runs each shuffle stage as a Spark job of its own and plans the rest of the
    query again after it: that pays on a large batch and only costs on a small one. A 1-event pass of
    ``run all`` ran about a sixth sooner without it, over one partition per core
    (docs/performance.md). A partition per core, not one: a small batch's flow still reads some
    tables by time (silver's identities within the dedup horizon), and those keep every core busy.
    With ``interpreted`` (a flow whose queries read its new rows alone), they also run interpreted:
    Java compiled for each new query costs more than it saves on a few rows, but a query that reads
    a table by time, which grows with the lake, wants it (docs/performance.md).
    Where the session refuses the confs (a serverless cluster may), the block runs as it is."""
    with ExitStack() as stack:
        confs = _small_increment_confs(spark, settings, rows)
        if confs and interpreted:
            confs.update(INTERPRETED)
        if confs:
            try:
                stack.enter_context(session_confs(spark, confs))
            except Exception:  # refused: planned as the session plans
                log.debug("small increment: the session refused %s", confs, exc_info=True)
        yield


def _small_increment_confs(spark: SparkSession, settings: Settings, rows: int | None) -> dict[str, str]:
    limit = settings.spark.small_increment_rows
    if rows is None or not limit or rows > limit:
        return {}
    confs = {ADAPTIVE: "false"}
    try:
        cores = spark.sparkContext.defaultParallelism if hasattr(type(spark), "sparkContext") else None
        partitions = int(spark.conf.get(SHUFFLE_PARTITIONS) or 0)
    except Exception:  # a session that does not say: its partitions as they are
        log.debug("small increment: the session's partitions unread", exc_info=True)
        return confs
    if cores and partitions > cores:
        confs[SHUFFLE_PARTITIONS] = str(cores)
    return confs


def interpreted(spark: SparkSession) -> AbstractContextManager[None]:
    """Queries run interpreted in a block (``spark.generated_code: false``)."""
    return session_confs(spark, INTERPRETED)


def observed_as_read(df: DataFrame, **figures: Column) -> tuple[DataFrame, Callable[..., dict[str, Any]]]:
    """``df`` computing the aggregates ``figures`` as the first action that reads it runs
    (``DataFrame.observe``), and how to get them, by name, once such an action has run: no pass of
    their own. (Asked before, it waits for one.) Where the action did not run the observed plan
    (Spark knew the frame empty), they are a query of their own, over the observed frame (so over
    its cache where the caller cached it); asked with ``query=False``, none then."""
    observed = Observation(f"figures_{uuid.uuid4().hex}")
    named = [column.alias(name) for name, column in figures.items()]
    counted = df.observe(observed, *named)

    def values(query: bool = True) -> dict[str, Any]:
        try:
            if _given(observed):
                given = dict(observed.get)
                if all(name in given for name in figures):  # Spark Connect may give none, and no error
                    return given
        except Exception:  # Spark's error for an observation the action did not run
            pass
        if not query:
            return {}
        # Over the observed frame, not ``df``: where the caller cached it, the cache answers (a
        # query over ``df`` read and parsed ``ingest file``'s files a second time).
        row = counted.agg(*named).first()  # one row: figures, not rows
        return row.asDict() if row else {}

    return counted, values


def _given(observed: Observation, wait: float = 2.0) -> bool:
    """Whether an action gave ``observed`` its figures. A classic session's ``get`` waits for one
    without end (a plan run only inside another engine's query, such as a Delta MERGE, may never
    give them), so its JVM future is asked first, for up to ``wait`` seconds (the figures arrive
    with the action's end). Spark Connect's ``get`` raises instead."""
    jo = getattr(observed, "_jo", None)
    if jo is None:
        return True
    deadline = time.monotonic() + wait
    while not jo.future().isCompleted():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
