"""The storage contract: every engine behaves the same on the same operations."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType
from pyspark.sql.utils import is_remote
from pyspark.testing import assertDataFrameEqual

from pipelines.config.settings import load_settings
from pipelines.errors import CommitConflictError, InputError, StorageError
from pipelines.storage import AddedStats, AppTxn, TableSpec, TableStore, open_store
from pipelines.storage.deltaspark import DeltaSparkStore
from pipelines.storage.specs import STATS_COMMITS

SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("part", LongType()),
        StructField("n", LongType()),
        StructField("ts", TimestampType()),
    ]
)
SPEC = TableSpec("test", "things", SCHEMA, partition_by=("part",), description="contract table")
T0 = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(store_for: Callable[[Path | str], TableStore], tmp_path: Path) -> TableStore:
    """The store of the engine under test (see ``engine`` in tests/conftest.py) on a fresh lake."""
    return store_for(tmp_path)


def delta_rs_store(spark: SparkSession, lake_root: Path) -> TableStore:
    """For the behaviours only the delta-rs engine offers (several app transactions per commit,
    ``read_version`` conflict checks)."""
    return open_store(load_settings(lake_root=str(lake_root), delta_engine="delta-rs"), spark)


def rows(spark: SparkSession, data: list[tuple]):  # type: ignore[no-untyped-def]
    return spark.createDataFrame(data, SCHEMA)


def test_ensure_creates_once_with_cdf_and_partitioning(store: TableStore) -> None:
    assert store.version(SPEC) is None
    assert store.ensure(SPEC) is True
    assert store.ensure(SPEC) is False
    assert store.version(SPEC) == 0
    dt = DeltaTable(store.path(SPEC))
    assert dt.metadata().partition_columns == ["part"]
    assert dt.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert store.path(SPEC).endswith("/test/things")


def test_append_and_read_round_trip(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    data = [("a", 1, 10, T0), ("b", 2, 20, T0), ("c", 1, None, None)]
    v = store.append(SPEC, rows(spark, data))
    assert v == 1
    assertDataFrameEqual(store.read(SPEC), rows(spark, data))
    assertDataFrameEqual(store.read(SPEC, where="part = 1"), rows(spark, [data[0], data[2]]))


def test_a_lake_under_a_folder_with_a_space_reads_back_what_it_wrote(
    store_for: Callable[[Path | str], TableStore], spark: SparkSession, tmp_path: Path
) -> None:
    store = store_for(tmp_path / "Application Support" / "lake")
    store.ensure(SPEC)
    data = [("a", 1, 10, T0), ("b", 2, 20, T0)]
    store.append(SPEC, rows(spark, data))
    assertDataFrameEqual(store.read(SPEC), rows(spark, data))
    assertDataFrameEqual(
        store.read_inserted(SPEC, 1).select("k", "n"), spark.createDataFrame([("a", 10), ("b", 20)], "k string, n long")
    )


def test_append_accepts_arrow_and_fills_missing_nullable_columns(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, pa.table({"k": ["x"], "part": [3]}))
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("x", 3, None, None)]))


def test_app_transaction_is_recorded_in_the_same_commit(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    assert store.txn_version(SPEC, "job-a") is None
    v = store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=[AppTxn("job-a", 7)])
    assert store.txn_version(SPEC, "job-a") == 7
    assert store.txn_version(SPEC, "job-b") is None
    store.merge(SPEC, rows(spark, [("a", 1, 5, T0)]), on="t.k = s.k", txns=[AppTxn("job-a", 8)])
    assert store.txn_version(SPEC, "job-a") == 8
    assert store.version(SPEC) == v + 1


def test_app_transactions_survive_checkpoints_and_the_cleanup_of_older_commits(
    store: TableStore, spark: SparkSession
) -> None:
    """Versions are read where the log keeps them: a checkpoint every 2 commits folds older ones
    in, and once the commit files before it are gone, the checkpoint alone still tells."""
    spec = TableSpec("test", "checkpointed", SCHEMA, properties={"delta.checkpointInterval": "2"})
    store.ensure(spec)
    expected: dict[str, int | None] = {"a": None, "b": None, "c": None}
    for i, app in enumerate(["a", "b", "a", "b", "a", "c", "b"]):
        store.append(spec, rows(spark, [(app, 1, i, T0)]), txns=[AppTxn(app, 10 * i)])
        expected[app] = 10 * i
        assert {a: store.txn_version(spec, a) for a in expected} == expected, f"after commit {i + 1}"
    log = Path(store.path(spec)) / "_delta_log"
    checkpoints = sorted(log.glob("*.checkpoint*.parquet"))
    assert checkpoints, "the table property asked for checkpoints"
    newest = int(checkpoints[-1].name.split(".")[0])
    for commit in log.glob("*.json"):
        if commit.name[0].isdigit() and int(commit.name.split(".")[0]) < newest:
            commit.unlink()  # what log cleanup does to commits older than a checkpoint
    # A new store as the pipeline opens it: by name where the tables are named (whose progress
    # comes from the commits' info through the catalog, carried forward past the cleanup).
    naming = {"catalog": store.catalog, "schema": store.schema} if isinstance(store, DeltaSparkStore) else {}
    fresh = type(store)(spark, store.lake_root, **naming)
    assert {a: fresh.txn_version(spec, a) for a in expected} == expected
    assert fresh.txn_version(spec, "never") is None


def test_a_commit_records_as_many_app_transactions_as_the_engine_allows(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    two = [AppTxn("g/t/0", 41), AppTxn("g/t/1", 99)]
    if store.max_txns_per_commit is None:  # delta-rs: any number, all in the one commit
        store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=two)
        assert (store.version(SPEC), store.txn_version(SPEC, "g/t/0"), store.txn_version(SPEC, "g/t/1")) == (1, 41, 99)
        return
    # delta-spark: one per commit; more is refused before anything is written.
    assert store.max_txns_per_commit == 1
    with pytest.raises(StorageError):
        store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=two)
    assert (store.version(SPEC), store.txn_version(SPEC, "g/t/0"), store.txn_version(SPEC, "g/t/1")) == (0, None, None)
    assertDataFrameEqual(store.read(SPEC), rows(spark, []))


def test_the_rows_a_commit_added_stream_in_the_same_order_every_time(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=[AppTxn("app", 1)])
    many = [(f"k{i}", i % 3, i, T0) for i in range(40)]
    v2 = store.append(SPEC, rows(spark, many).repartition(4), txns=[AppTxn("app", 2)])
    store.append(SPEC, rows(spark, [("z", 1, 1, T0)]), txns=[AppTxn("other", 7)])

    def streamed() -> list[tuple]:
        with store.stream_added(SPEC, v2, ["k", "n"]) as reader:
            table = reader.read_all()
        return list(zip(table["k"].to_pylist(), table["n"].to_pylist(), strict=True))

    if store.streams_commit_files(SPEC):
        first = streamed()
        assert sorted(first, key=lambda r: r[1]) == [(k, n) for k, _, n, _ in many]  # that commit's rows, no others
        assert streamed() == first  # and in the same order again
    else:  # tables by name: a commit's files would be read from the log by path, which is refused
        assert isinstance(store, DeltaSparkStore) and store.catalog is not None
        with pytest.raises(StorageError, match="by name"):
            streamed()
    # Either way the commit that recorded an app transaction is found (by name: from its info).
    assert (store.commit_of(SPEC, AppTxn("app", 2)), store.commit_of(SPEC, AppTxn("app", 1))) == (v2, v2 - 1)
    with pytest.raises(StorageError):
        store.commit_of(SPEC, AppTxn("app", 3))


def test_merge_updates_matches_with_expressions_and_inserts_the_rest(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 10, T0), ("b", 1, 20, T0)]))
    store.merge(
        SPEC,
        rows(spark, [("a", 1, 5, T0), ("z", 2, 1, T0)]),
        on="t.k = s.k AND t.part = s.part",
        update={"n": "t.n + s.n"},
    )
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 15, T0), ("b", 1, 20, T0), ("z", 2, 1, T0)]))


def test_read_changes_returns_inserts_and_update_images_by_version(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    v1 = store.append(SPEC, rows(spark, [("a", 1, 10, T0)]))
    v2 = store.merge(SPEC, rows(spark, [("a", 1, 5, T0), ("b", 1, 1, T0)]), on="t.k = s.k", update={"n": "t.n + s.n"})
    changes = store.read_changes(SPEC, v2).select("k", "n", "_change_type", "_commit_version")
    assertDataFrameEqual(
        changes,
        spark.createDataFrame(
            [("a", 10, "update_preimage", v2), ("a", 15, "update_postimage", v2), ("b", 1, "insert", v2)],
            "k string, n long, _change_type string, _commit_version long",
        ),
    )
    inserted = store.read_inserted(SPEC, v1, v2).select("k", "n", "_commit_version")
    assertDataFrameEqual(
        inserted,
        spark.createDataFrame([("a", 10, v1), ("a", 15, v2), ("b", 1, v2)], "k string, n long, _commit_version long"),
    )
    # Nothing committed since the last version read: no changes, on both engines (a reader that
    # caught up asks for the versions after the newest).
    assert store.read_changes(SPEC, v2 + 1, v2).count() == 0
    assert store.read_changes(SPEC, v2 + 1).count() == 0


def test_inserted_stats_bound_an_append_only_range_and_say_nothing_of_another(
    store: TableStore, spark: SparkSession
) -> None:
    hour = timedelta(hours=1)
    store.ensure(SPEC)
    v1 = store.append(SPEC, rows(spark, [("a", 1, 10, T0 + 2 * hour), ("b", 2, 20, None)]))
    arrow = pa.table({"k": ["c"], "part": [1], "n": [30], "ts": pa.array([T0 + hour], pa.timestamp("us", "UTC"))})
    store.append(SPEC, arrow)  # rows born in the driver: the engine's own statistics
    v3 = store.append(SPEC, rows(spark, [("d", 2, None, None)]))  # only nulls: no minimum, and none needed
    if not store.streams_commit_files(SPEC):  # tables by name: their log is not read by path
        assert isinstance(store, DeltaSparkStore) and store.catalog is not None
        assert store.inserted_stats(SPEC, v1, v3) is None
        return
    assert store.inserted_stats(SPEC, v1, v3) == AddedStats(4, {"ts": T0 + hour}, {"ts": T0 + 2 * hour})
    assert store.inserted_stats(SPEC, v3, v3) == AddedStats(1, {})
    assert store.inserted_stats(SPEC, 0, 0) == AddedStats(0, {})  # the table's creation added no rows
    v4 = store.delete(SPEC, "k = 'a'")
    assert store.inserted_stats(SPEC, v1, v4) is None  # a commit that removed rows: ask the rows
    assert store.inserted_stats(SPEC, v1, v1 + STATS_COMMITS) is None  # too many log files to read


def test_change_rows_count_what_a_read_of_the_changes_handles(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    v1 = store.append(SPEC, rows(spark, [("a", 1, 10, T0), ("b", 2, 20, None)]))
    v2 = store.append(SPEC, rows(spark, [("c", 1, 30, T0), ("d", 1, 40, T0), ("e", 1, 50, T0)]))
    if not store.streams_commit_files(SPEC):  # tables by name: their log is not read by path
        assert store.change_rows(SPEC, v1, v2) is None
        return
    assert (store.change_rows(SPEC, v1, v2), store.change_rows(SPEC, 0, 0)) == (5, 0)
    # One row updated in a file of three, which the MERGE rewrites whole: its changes are the row's
    # two images, as the change feed reads them, not the three rows of the rewritten file.
    v3 = store.merge(SPEC, rows(spark, [("c", 1, 31, T0)]), on="t.k = s.k", update={"n": "s.n"})
    assert store.read_changes(SPEC, v3, v3).count() == 2
    assert store.change_rows(SPEC, v3, v3) == 2
    assert store.change_rows(SPEC, v1, v3) == 7
    assert store.change_rows(SPEC, v1, v1 + STATS_COMMITS) is None  # too many log files to read


LAID_OUT = TableSpec("test", "laid_out", SCHEMA, partition_by=("part",), cluster_by=("n",), file_rows=2)


def files_of(store: TableStore, spec: TableSpec) -> dict[str, tuple[int, int, int, int]]:
    """Each data file of the table: (partition, least n, greatest n, rows), read from its rows."""
    found = store.read(spec).groupBy(F.input_file_name().alias("f"), "part").agg(F.min("n"), F.max("n"), F.count("n"))
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in found.collect()}


def test_a_clustered_table_is_written_sorted_in_files_of_its_rows_and_a_merge_rewrites_one(
    store: TableStore, spark: SparkSession
) -> None:
    store.ensure(LAID_OUT)
    data = [("a", 1, 5, T0), ("b", 1, 3, T0), ("c", 2, 10, T0), ("d", 1, 1, T0), ("e", 1, 4, T0)]
    data += [("f", 1, 2, T0), ("g", 2, 9, T0), ("h", 1, 6, T0)]
    store.append(LAID_OUT, rows(spark, data))
    # Each partition's rows sorted by n, cut every two rows: each file a range of n of its own.
    written = files_of(store, LAID_OUT)
    assert sorted(written.values()) == [(1, 1, 2, 2), (1, 3, 4, 2), (1, 5, 6, 2), (2, 9, 10, 2)]
    # A MERGE of one row rewrites the file of its range, not its partition whole.
    store.merge(LAID_OUT, rows(spark, [("b", 1, 3, T0 + timedelta(hours=1))]), on="t.part = s.part AND t.n = s.n")
    after = files_of(store, LAID_OUT)
    assert len(set(written) - set(after)) == 1 and sorted(after.values()) == sorted(written.values())


WIDE = TableSpec("test", "laid_out_wide", SCHEMA, partition_by=("part",), cluster_by=("n",), file_rows=1_000)


def test_optimize_lays_a_clustered_table_out_again_in_sorted_files_of_about_its_rows(
    store: TableStore, spark: SparkSession
) -> None:
    store.ensure(WIDE)

    def spread(ids: DataFrame) -> DataFrame:  # n scattered over 0..5,999, so each write spans them all
        n = ((F.col("id") * 7_919) % 6_000).cast("long")
        return ids.select(
            F.concat(F.lit("k"), n.cast("string")).alias("k"),
            F.lit(1).cast("long").alias("part"),
            n.alias("n"),
            F.lit(T0).alias("ts"),
        )

    store.append(WIDE, spark.range(0, 6_000, 2).transform(spread))
    store.append(WIDE, spark.range(1, 6_000, 2).transform(spread))  # every file overlaps the first write's
    store.optimize(WIDE)
    files = sorted(files_of(store, WIDE).values())
    assert sum(f[3] for f in files) == 6_000
    assert len(files) >= 3 and max(f[3] for f in files) <= 2_500, files  # about 1,000 rows a file
    for (_, _, hi), (_, lo, _) in itertools.pairwise((f[0], f[1], f[2]) for f in files):
        # Sorted ranges: Delta's ZORDER cuts them by a sample, so neighbours may share a few values.
        assert lo > hi - 60, files


def test_inserted_stats_need_every_added_file_to_have_its_statistics(tmp_path: Path) -> None:
    from pipelines.storage.parquet_files import TableFiles

    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    with_stats = {
        "path": "a.parquet",
        "dataChange": True,
        "stats": '{"numRecords": 2, "minValues": {"ts": "2024-01-01T00:00:00.250Z"}}',
    }
    (log / f"{0:020d}.json").write_text(json.dumps({"add": with_stats}) + "\n")
    (log / f"{1:020d}.json").write_text(json.dumps({"add": {"path": "b.parquet", "dataChange": True}}) + "\n")
    (log / f"{2:020d}.json").write_text(json.dumps({"cdc": {"path": "c.parquet"}}) + "\n")
    files = TableFiles(str(tmp_path))
    uri = str(tmp_path / "t")
    assert files.added_stats(uri, 0, 0, SCHEMA) == AddedStats(2, {"ts": T0 + timedelta(milliseconds=250)})
    assert files.added_stats(uri, 0, 1, SCHEMA) is None
    assert files.added_stats(uri, 2, 2, SCHEMA) is None


def test_greatest_is_read_from_the_statistics_of_the_run_s_buckets(store: TableStore, spark: SparkSession) -> None:
    schema = StructType(
        [StructField("bucket", LongType()), StructField("ts", TimestampType()), StructField("n", LongType())]
    )
    spec = TableSpec("test", "bucketed", schema, partition_by=("bucket",), description="bucketed contract table")
    store.ensure(spec)
    if isinstance(store, DeltaSparkStore):  # its statistics are not read without a Spark job
        assert store.greatest(spec, "ts") is None
        return

    def greatest(column: str, buckets: list[int] | None = None) -> object:
        bound = store.greatest(spec, column, buckets)
        assert bound is not None and bound.version == store.version(spec)
        return bound.value

    ms = timedelta(milliseconds=1)
    assert greatest("ts") is None and greatest("ts", [1]) is None  # no rows yet
    store.append(spec, spark.createDataFrame([(0, T0, 5), (1, T0 + timedelta(hours=2), 7)], schema))
    store.append(spec, spark.createDataFrame([(1, T0 + timedelta(hours=1), 9)], schema))
    assert greatest("ts") == T0 + timedelta(hours=2) + ms  # statistics keep milliseconds
    assert greatest("ts", []) == T0 + timedelta(hours=2) + ms  # no buckets named: all of them
    assert greatest("ts", [0]) == T0 + ms
    assert greatest("ts", [0, 1]) == T0 + timedelta(hours=2) + ms
    assert greatest("ts", [2]) is None  # nothing in that bucket
    assert greatest("n", [1]) == 9
    store.append(spec, spark.createDataFrame([(2, None, 1)], schema))  # a file whose ts are all null
    assert store.greatest(spec, "ts", [2]) is None  # no maximum to read: unknown, not "no rows"


def test_delete_history_stats_and_maintenance(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]))
    store.append(SPEC, rows(spark, [("b", 2, 2, T0), ("c", 2, 3, T0)]))
    store.delete(SPEC, "k = 'b'")
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 1, T0), ("c", 2, 3, T0)]))
    stats = store.stats(SPEC)
    assert (stats.key, stats.version, stats.rows) == ("test/things", 3, 2)
    assert stats.last_write is not None
    assert [h["version"] for h in store.history(SPEC)][:2] == [3, 2]
    store.optimize(SPEC)
    store.vacuum(SPEC, retention_hours=168)
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 1, T0), ("c", 2, 3, T0)]))


def test_concurrent_appends_all_land(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            store.append(SPEC, pa.table({"k": [f"w{i}-{j}" for j in range(5)], "part": [i % 2] * 5}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []  # blind appends never conflict, on either engine
    assertDataFrameEqual(
        store.read(SPEC), rows(spark, [(f"w{i}-{j}", i % 2, None, None) for i in range(6) for j in range(5)])
    )


def test_append_through_a_snapshot_conflicts_with_a_later_commit_of_the_same_app(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = delta_rs_store(spark, tmp_path)  # delta-spark checks the app id inside its own commit instead
    store.ensure(SPEC)
    snap = store.txn_snapshot(SPEC, ["kafka/g/t/0"])
    assert dict(snap.versions) == {"kafka/g/t/0": None}
    store.append(SPEC, rows(spark, [("a", 1, 1, T0)]), txns=[AppTxn("kafka/g/t/0", 10)])
    # Another app id committed since the snapshot does not conflict ...
    store.append(SPEC, rows(spark, [("b", 1, 1, T0)]), [AppTxn("kafka/g/t/1", 5)], read_version=snap.table_version)
    # ... the same one does: the check made at the snapshot no longer holds.
    with pytest.raises(CommitConflictError):
        store.append(SPEC, rows(spark, [("c", 1, 1, T0)]), [AppTxn("kafka/g/t/0", 20)], read_version=snap.table_version)
    assert store.txn_version(SPEC, "kafka/g/t/0") == 10
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 1, T0), ("b", 1, 1, T0)]))


def test_overwrite_replaces_every_row_and_records_the_txn(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 1, T0), ("b", 2, 2, T0)]))
    store.overwrite(SPEC, rows(spark, [("z", 3, 9, T0)]), txns=[AppTxn("state", 4)])
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("z", 3, 9, T0)]))
    assert store.txn_version(SPEC, "state") == 4


def test_the_newest_complete_checkpoint_is_the_one_read() -> None:
    from pipelines.storage.delta_log import newest_checkpoint

    def v(n: int) -> str:
        return f"{n:020d}"

    classic, v2 = f"{v(2)}.checkpoint.parquet", f"{v(8)}.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet"
    half = [f"{v(6)}.checkpoint.0000000001.0000000002.parquet"]  # a crash wrote 1 of 2 parts
    whole = [*half, f"{v(6)}.checkpoint.0000000002.0000000002.parquet"]
    assert newest_checkpoint([classic, *half], 7) == 2
    assert newest_checkpoint([classic, *whole], 7) == 6
    assert newest_checkpoint([classic, *whole, v2], 7) == 6  # not after the version asked about
    assert newest_checkpoint([classic, *whole, v2], 8) == 8
    assert newest_checkpoint([f"{v(3)}.json", "_last_checkpoint"], 3) is None


def test_merge_and_delete_take_a_column_as_delta_does(store: TableStore, spark: SparkSession) -> None:
    store.ensure(SPEC)
    store.append(SPEC, rows(spark, [("a", 1, 10, T0), ("b", 1, 20, T0), ("it's", 3, 7, T0)]))
    on = (F.col("t.k") == F.col("s.k")) & (F.col("t.part") == F.col("s.part")) & F.col("t.part").isin(1, 2)
    if is_remote():  # the analyzed plan stays on the server: SQL text only, said so
        with pytest.raises(InputError, match="over Spark Connect pass SQL text"):
            store.merge(SPEC, rows(spark, [("a", 1, 5, T0)]), on=on)
        return
    store.merge(SPEC, rows(spark, [("a", 1, 5, T0), ("z", 2, 1, T0)]), on=on, update={"n": "t.n + s.n"})
    store.delete(SPEC, (F.col("n") > F.lit(16)) & F.col("ts").isNotNull())
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 15, T0), ("z", 2, 1, T0), ("it's", 3, 7, T0)]))
    store.delete(SPEC, F.col("k") == F.lit("it's"))
    assertDataFrameEqual(store.read(SPEC), rows(spark, [("a", 1, 15, T0), ("z", 2, 1, T0)]))


def test_read_windows_reads_the_rows_of_those_windows_from_their_files_alone(
    store: TableStore, spark: SparkSession
) -> None:
    """Six hourly windows, each appended as its own file: the rows after 04:00 and those of two
    windows asked for by their starts come back, from the four files that hold them."""
    store.ensure(SPEC)
    for h in range(6):
        at = T0 + timedelta(hours=h)
        store.append(SPEC, rows(spark, [(f"k{h}", 1, h, at), (f"j{h}", 1, h, at + timedelta(minutes=30))]).coalesce(1))
    got = store.read_windows(
        SPEC, "ts", T0 + timedelta(hours=4), [T0 + timedelta(hours=1), T0 + timedelta(minutes=150)]
    )
    assert sorted(r["k"] for r in got.collect()) == ["j2", "j4", "j5", "k1", "k5"]
    everything = store.read_windows(SPEC, "ts", None, [])
    assert everything.count() == 0  # neither later than a bound nor one of the values
    if not is_remote():  # a classic session's plan says what it scanned
        from tests.infra.plans import files_scanned

        again = store.read_windows(SPEC, "ts", T0 + timedelta(hours=4), [T0 + timedelta(hours=1)])
        assert files_scanned(again) == 3  # 01:00, 04:00 and 05:00


def test_held_since_reads_the_files_the_horizon_keeps_into_the_driver_up_to_a_bound(
    store: TableStore, spark: SparkSession
) -> None:
    """Six hourly files of two rows: the rows from 03:30 on are read into the driver (``k`` and
    ``ts``, not the partition column) where the files kept hold at most the rows asked for, by the
    log's counts; over the bound, or on an engine that reads through Spark only, None."""
    store.ensure(SPEC)
    for h in range(6):
        at = T0 + timedelta(hours=h)
        store.append(SPEC, rows(spark, [(f"k{h}", 1, h, at), (f"j{h}", 1, h, at + timedelta(minutes=30))]).coalesce(1))
    since = T0 + timedelta(hours=3, minutes=30)
    held = store.held_since(SPEC, "ts", since, ["k", "ts", "part"], max_rows=6)
    if isinstance(store, DeltaSparkStore):
        assert held is None
        return
    assert held is not None and held.column_names == ["k", "ts"]
    got = sorted(zip(held["k"].to_pylist(), held["ts"].to_pylist(), strict=True))
    hours = [(3, 30), (4, 0), (4, 30), (5, 0), (5, 30)]
    want = sorted((f"{'j' if m else 'k'}{h}", T0 + timedelta(hours=h, minutes=m)) for h, m in hours)
    assert got == want
    assert store.held_since(SPEC, "ts", since, ["k"], max_rows=5) is None  # three files, six rows


def test_read_windows_takes_naive_times_as_local_time_as_pyspark_hands_them_out(
    store: TableStore, spark: SparkSession
) -> None:
    """A window start collected from Spark is a naive local time: in New York, 01:00 UTC is
    20:00 the evening before, and that is the window read."""
    import os
    import time

    store.ensure(SPEC)
    for h in range(3):
        store.append(SPEC, rows(spark, [(f"k{h}", 1, h, T0 + timedelta(hours=h))]).coalesce(1))
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        naive = (T0 + timedelta(hours=1)).astimezone().replace(tzinfo=None)
        assert naive == datetime(2023, 12, 31, 20, 0)
        got = store.read_windows(SPEC, "ts", None, [naive])
        assert [r["k"] for r in got.collect()] == ["k1"]
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


IDS = TableSpec(
    "silver",
    "ids",
    StructType([StructField("uuid", StringType()), StructField("n", LongType())]),
    bloom_filter=("uuid",),
)


def test_a_read_for_ids_skips_the_row_groups_their_bloom_filters_rule_out_before_and_after_compaction(
    store: TableStore, spark: SparkSession
) -> None:
    """Three files of 2,000 hashed ids each, every file spanning nearly the whole range (its min/max
    skip nothing): a read for an id of the second file hands on that file's rows alone, a read
    for an id no file holds none; after maintain's compaction into one file, the same."""
    store.ensure(IDS)
    for f in range(3):
        ids = spark.range(2_000).select(F.md5(F.format_string(f"{f}-%d", "id")).alias("uuid"), F.col("id").alias("n"))
        store.append(IDS, ids.coalesce(1))
    held, nobody = hashlib.md5(b"1-7").hexdigest(), "0" * 32  # Spark's md5 is of the UTF-8 bytes
    assert [r["n"] for r in store.read(IDS).where(F.col("uuid").isin([held, nobody])).collect()] == [7]
    if is_remote():  # only a classic session's plan says what it scanned
        return
    from tests.infra.plans import rows_scanned

    assert rows_scanned(store.read(IDS).where(F.col("uuid").isin([held]))) == 2_000
    assert rows_scanned(store.read(IDS).where(F.col("uuid").isin([nobody]))) == 0
    store.optimize(IDS)
    assert len(store.read(IDS).inputFiles()) == 1
    assert rows_scanned(store.read(IDS).where(F.col("uuid").isin([held]))) == 6_000
    assert rows_scanned(store.read(IDS).where(F.col("uuid").isin([nobody]))) == 0
