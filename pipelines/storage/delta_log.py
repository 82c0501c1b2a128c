"""What the delta-spark engine reads from a table's Delta log itself: the newest version and the
app transactions through Delta's JVM classes (a classic session with open-source Delta); and, where
those are not at hand, the app transactions from the log's files with Spark (the newest checkpoint
among ``_delta_log`` file names, then the commits after it)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.utils import is_remote

_TXN_SCHEMA = "txn struct<appId: string, version: long>"
#: Read app transactions from the commits since a version already read, up to this many commits.
MAX_INCREMENTAL_COMMITS = 100


class JvmDeltaLog:
    """Open-source Delta's ``DeltaLog`` through py4j: a table's newest version, brought up to date
    (a listing of its ``_delta_log`` from the version the JVM last saw; no query, no Spark job)."""

    def __init__(self, spark: SparkSession, delta_log: Any) -> None:
        self._jspark, self._delta_log = spark._jsparkSession, delta_log
        self._none = spark._jvm.scala.Option.empty()  # type: ignore[union-attr]

    def version_of(self, location: str) -> int:
        """The newest version at ``location``; -1 where there is no Delta table."""
        return int(self._snapshot(location).version())

    def txn_versions_at(self, location: str, version: int, app_ids: Sequence[str]) -> dict[str, int | None] | None:
        """The app ids' versions in the snapshot of ``location`` if the newest one is ``version``
        (None where it is another). Delta builds a snapshot's app transactions from its whole state
        (a Spark job over the log); a write with an app id asks the same snapshot for its own check,
        so the state built here is the one that write then uses, not a second reading of the log."""
        snapshot = self._snapshot(location)
        if int(snapshot.version()) != version:
            return None
        txns = snapshot.transactions()  # a Scala Map[String, Long]
        found: dict[str, int | None] = {}
        for app_id in app_ids:
            known = txns.get(app_id)
            found[app_id] = int(known.get()) if known.isDefined() else None
        return found

    def _snapshot(self, location: str) -> Any:
        # update(stalenessAcceptable, checkIfUpdatedSinceTs, catalogTableOpt), as Delta 4 has it.
        return self._delta_log.forTable(self._jspark, location).update(False, self._none, self._none)


def jvm_delta_log(spark: SparkSession) -> JvmDeltaLog | None:
    """Delta's log classes on a classic session with open-source Delta, else None (Spark Connect,
    or a Delta built under other names)."""
    if is_remote() or not hasattr(spark, "_jvm"):
        return None
    try:
        delta_log = spark._jvm.org.apache.spark.sql.delta.DeltaLog  # type: ignore[union-attr]
    except Py4JError:
        return None
    return JvmDeltaLog(spark, delta_log) if isinstance(delta_log, JavaClass) else None


def newest_checkpoint(names: Sequence[str], version: int) -> int | None:
    """The newest complete checkpoint at or before ``version`` among ``_delta_log`` file names."""
    parts: dict[tuple[int, int], set[int]] = {}
    complete: set[int] = set()
    for name in names:
        multi = re.fullmatch(r"(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet", name)
        if multi:
            v, part, of = (int(g) for g in multi.groups())
            parts.setdefault((v, of), set()).add(part)
        elif single := re.fullmatch(r"(\d{20})\.checkpoint(\.[0-9a-f-]{36})?\.parquet", name):
            complete.add(int(single.group(1)))
    complete |= {v for (v, of), seen in parts.items() if seen == set(range(1, of + 1))}
    return max((v for v in complete if v <= version), default=None)


def read_txns(
    spark: SparkSession, location: str, version: int, app_ids: Sequence[str], since: int | None = None
) -> dict[str, int | None]:
    """The app ids' versions as of version ``version`` of the table at ``location``, from its Delta
    log (the protocol's ``txn`` actions): the latest checkpoint at or before it, then each commit
    after it; or, ``since`` a version, the commits after that one alone (None: not set in them)."""
    log = f"{location}/_delta_log"
    checkpoint = since if since is not None else checkpoint_version(spark, log, version)
    sources = []
    if checkpoint is not None and since is None:
        sources.append(
            spark.read.schema(_TXN_SCHEMA)
            .parquet(f"{log}/{checkpoint:020d}.checkpoint*.parquet")
            .select("txn", F.lit(checkpoint).alias("v"))
        )
    start = 0 if checkpoint is None else checkpoint + 1
    if start <= version:
        commits = [f"{log}/{v:020d}.json" for v in range(start, version + 1)]
        sources.append(
            spark.read.schema(_TXN_SCHEMA)
            .json(commits)
            .select("txn", F.regexp_extract(F.col("_metadata.file_name"), r"^(\d+)\.json$", 1).cast("long").alias("v"))
        )
    found: dict[str, int | None] = dict.fromkeys(app_ids)
    if not sources:
        return found
    txns = sources[0]
    for more in sources[1:]:
        txns = txns.unionByName(more)
    # The asked app ids' txn actions, at most one per commit read (about 100 at most, as
    # checkpoints come every 100 commits): bookkeeping, not row data. The newest one wins.
    newest: dict[str, tuple[int, int]] = {}
    for row in txns.where(F.col("txn.appId").isin(list(app_ids))).select("txn.appId", "txn.version", "v").collect():
        if row["appId"] not in newest or row["v"] > newest[row["appId"]][0]:
            newest[row["appId"]] = (int(row["v"]), int(row["version"]))
    found.update({app: v for app, (_, v) in newest.items()})
    return found


def checkpoint_version(spark: SparkSession, log: str, version: int) -> int | None:
    """The newest complete checkpoint at or before ``version``, from the log's file names.

    ``_last_checkpoint`` would name it, but Spark's file sources skip files whose names start
    with ``_``, so the checkpoint files are listed instead (``binaryFile`` lists them without
    reading them): one file for a classic or V2 checkpoint, all ``n`` parts of a multi-part
    one (a crash can leave some parts of a newer one written; Delta then reads the older).
    """
    try:
        names = (
            spark.read.format("binaryFile")
            .load(f"{log}/*.checkpoint*.parquet")
            .select(F.regexp_extract("path", r"[^/]+$", 0).alias("name"))
        )
        # One row per checkpoint file: a listing, not row data.
        listed = [r["name"] for r in names.collect()]
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            return None
        raise
    return newest_checkpoint(listed, version)


class PathTxns:
    """App transactions of tables by path, each version's read once: from the JVM's snapshot where
    ``jvm`` is at hand, else from the log's files, only the commits since a version read before
    where there is one (txn actions are never removed)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        #: (table location, table version) -> app id -> version.
        self._cache: dict[tuple[str, int], dict[str, int | None]] = {}

    def at(self, location: str, version: int, app_ids: Sequence[str], jvm: JvmDeltaLog | None) -> dict[str, int | None]:
        cached = self._cache.setdefault((location, version), {})
        missing = [a for a in dict.fromkeys(app_ids) if a not in cached]
        if missing and jvm is not None:
            with contextlib.suppress(Py4JError):  # the log's own reads below answer instead
                found = jvm.txn_versions_at(location, version, missing)
                if found is not None:
                    cached.update(found)
                    missing = []
        if missing:
            base = self._known_base(location, version, missing)
            newer = None
            if base is not None and version - base <= MAX_INCREMENTAL_COMMITS:
                with contextlib.suppress(AnalysisException):  # a commit file cleaned up since: read it all
                    newer = read_txns(self.spark, location, version, missing, since=base)
            if newer is not None and base is not None:
                older = self._cache[(location, base)]
                cached.update({a: newer[a] if newer[a] is not None else older[a] for a in missing})
            else:
                cached.update(read_txns(self.spark, location, version, missing))
        while len(self._cache) > 256:
            self._cache.pop(next(iter(self._cache)))
        return {a: cached[a] for a in app_ids}

    def _known_base(self, location: str, version: int, app_ids: Sequence[str]) -> int | None:
        """The newest version before ``version`` whose app transactions for ``app_ids`` are cached."""
        known = [
            v for (loc, v), txns in self._cache.items() if loc == location and v < version and set(app_ids) <= set(txns)
        ]
        return max(known, default=None)
