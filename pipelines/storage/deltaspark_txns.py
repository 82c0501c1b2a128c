"""App transactions on the delta-spark engine, read back: by path from Delta's snapshot in the JVM
or the log's files (:class:`~pipelines.storage.delta_log.PathTxns`); by name from the progress each
commit writes in its commit info, which ``DESCRIBE HISTORY`` serves
(:mod:`pipelines.storage.commit_progress`). Which commit recorded a given one, too."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession

from pipelines.errors import StorageError
from pipelines.storage.commit_progress import HistoryProgress, commit_metadata, sets
from pipelines.storage.delta_log import JvmDeltaLog, PathTxns
from pipelines.storage.specs import AppTxn, TableSpec

#: Commits of history read for app transactions by name: more than any writer's span from its read
#: to its commit (see :mod:`pipelines.storage.commit_progress`).
HISTORY_WINDOW = 200


class SparkTxns:
    """The app transactions of a delta-spark store's tables (by name when ``by_name``, else by
    path): ``ident`` names a table as SQL does, ``location`` where its files are, ``version`` its
    newest version, ``history`` its commits newest first, ``delta_log`` the JVM's log if at hand."""

    def __init__(
        self,
        spark: SparkSession,
        by_name: bool,
        ident: Callable[[TableSpec], str],
        location: Callable[[TableSpec], str],
        version: Callable[[TableSpec], int | None],
        history: Callable[[str, int | None], DataFrame],
        delta_log: Callable[[], JvmDeltaLog | None],
    ) -> None:
        self.by_name = by_name
        self._ident, self._location, self._version, self._history = ident, location, version, history
        self._delta_log = delta_log
        #: By path: each version's app transactions, from the JVM's snapshot or the log's files.
        self._by_path = PathTxns(spark)
        #: By name: each version's progress, as its newest commits record it.
        self._by_name = HistoryProgress(self.history_commits, location, HISTORY_WINDOW)

    def metadata(self, spec: TableSpec, txn: AppTxn) -> str:
        """The commit info that records ``txn``: by name, with the progress carried forward."""
        carried = self._by_name.newest(spec, lambda: self._version(spec)) if self.by_name else {}
        return commit_metadata(txn.app_id, txn.version, txn.once, carried)

    def at(self, spec: TableSpec, version: int, app_ids: Sequence[str]) -> dict[str, int | None]:
        """The versions ``app_ids`` had recorded as of table ``version``."""
        if not self.by_name:
            return self._by_path.at(self._location(spec), version, app_ids, self._delta_log())
        progress = self._by_name.at(spec, version)
        return {a: progress[a].version if a in progress else None for a in app_ids}

    def history_commits(self, spec: TableSpec, limit: int, version: int) -> list[tuple[int, str | None]]:
        """(version, userMetadata) of the newest ``limit`` commits up to ``version``, by name.
        ``DESCRIBE HISTORY`` starts at the newest commit: commits that landed after ``version``
        are read past, so the window still holds ``limit`` commits up to it."""
        newer = 0
        while True:
            history = self._history(self._ident(spec), limit + newer).select("version", "userMetadata")
            # Commit metadata, one row per commit, at most ``limit`` plus the commits since
            # ``version``: bookkeeping, not row data.
            rows = [(int(r["version"]), r["userMetadata"]) for r in history.collect()]
            since = sum(1 for v, _ in rows if v > version)
            if since <= newer or len(rows) < limit + newer:  # the window is whole, or history ends
                return [(v, m) for v, m in rows if v <= version][:limit]
            newer = since

    def commit_of(self, spec: TableSpec, txn: AppTxn, version: int) -> int:
        """By name: the commit up to ``version`` that recorded ``txn``, from its commit info (the
        newest commits: a retry's)."""
        for at, metadata in self.history_commits(spec, HISTORY_WINDOW, version):
            if sets(metadata, txn.app_id, txn.version):
                return at
        window = f"in its last {HISTORY_WINDOW}"
        raise StorageError(f"no commit of {spec.key} {window} records {txn.app_id} at {txn.version}")
