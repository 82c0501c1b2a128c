"""Gold -> ClickHouse (embedded chdb): closed windows once, corrections, gate, pods, crashes."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from gold.export import exported_of
from pipelines.config.settings import load_settings
from pipelines.runtime import ingest, passes
from pipelines.runtime.eventlog import PIPELINE_EVENTS
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import EXPORT_OUTBOX, EXPORTS, GOLD_PARTIALS, GOLD_PROPERTY_VALUES
from pipelines.sinks import clickhouse
from pipelines.storage import AppTxn, TableSpec, TableStore, open_store
from tests.helpers import delta_rs_only  # noqa: F401  (the engine fixture: delta-rs here)

pytestmark = pytest.mark.integration


def event(i: int, second: int, team: int = 1, props: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "uuid": f"00000000-0000-4000-8000-{team:04d}{i:08d}",
        "event": "$pageview",
        "team_id": team,
        "distinct_id": f"u{i % 3}",
        "timestamp": f"2024-06-01T00:{second // 60:02d}:{second % 60:02d}Z",
        "properties": props if props is not None else {"browser": ["Firefox", "Chrome"][i % 2], "plan": "free"},
    }


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def make_ctx(spark: SparkSession, lake: Path, engine: str = "delta-rs", **gold: Any) -> Context:
    settings = load_settings(lake_root=str(lake), delta_engine=engine, gold={"window": "30s", "grace": "60s", **gold})
    return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)


def pipeline(ctx: Context, files: list[Path], drain: bool = True) -> None:
    ingest.ingest_files(ctx, "events", files)
    passes.silver_events(ctx)
    passes.gold_partials(ctx)
    passes.gold_merge(ctx)
    passes.export_property_values(ctx, drain=drain)


def clickhouse_state(ctx: Context) -> tuple[dict[tuple, int], int]:
    """(sum(count) per tuple and window, raw rows) as ClickHouse holds them."""
    with clickhouse.connect(ctx.settings) as client:
        sums = clickhouse.query_rows(
            client,
            "SELECT team_id, property_type, property_key, property_value, toUnixTimestamp(window_start), sum(count) "
            "FROM property_values GROUP BY ALL",
        )
        raw = clickhouse.query_rows(client, "SELECT count() FROM property_values")[0][0]
    return {tuple(r[:-1]): int(r[-1]) for r in sums}, int(raw)


def gold_state(ctx: Context) -> dict[tuple, int]:
    return {
        (
            r["team_id"],
            r["property_type"],
            r["property_key"],
            r["property_value"],
            int(r["window_start"].timestamp()),
        ): r["count"]
        for r in ctx.store.read(GOLD_PROPERTY_VALUES).collect()
    }


STREAM = [event(i, second=i * 3) for i in range(60)]  # 3 minutes of events, 6 windows of 30 s


class CleanRuns:
    """The clean run that crash cases compare against, run once per scenario and engine in this
    process: the cases of one scenario share its input, so they share its clean result."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.states: dict[tuple[str, str], tuple[dict[tuple, int], int]] = {}

    def state(
        self, spark: SparkSession, engine: str, scenario: str, run: Callable[[Context, Path], None]
    ) -> tuple[dict[tuple, int], int]:
        """ClickHouse's state after ``run(ctx, folder)`` on a fresh lake (``folder`` for its input files)."""
        key = (scenario, engine)
        if key not in self.states:
            folder = self.root / f"{scenario}-{engine}"
            folder.mkdir(parents=True)
            ctx = make_ctx(spark, folder / "lake", engine)
            run(ctx, folder)
            self.states[key] = clickhouse_state(ctx)
        return self.states[key]


@pytest.fixture(scope="session")
def clean_runs(tmp_path_factory: pytest.TempPathFactory) -> CleanRuns:
    return CleanRuns(tmp_path_factory.mktemp("clean-runs"))


def two_pods(folder: Path) -> list[Path]:
    """The stream split over two pods' files, in ``folder``."""
    return [write(folder / f"pod-{p}.jsonl", STREAM[p::2]) for p in range(2)]


def two_pods_run(ctx: Context, folder: Path) -> None:
    pipeline(ctx, two_pods(folder))


def two_pods_in_chunks_of_4(ctx: Context, folder: Path) -> None:
    ctx.settings.clickhouse.insert_chunk_rows = 4
    pipeline(ctx, two_pods(folder))


def late_round_files(folder: Path) -> tuple[Path, Path]:
    """Round 1 (every other event) and round 2 (the rest, late into the same windows), in ``folder``."""
    return write(folder / "first.jsonl", STREAM[::2]), write(folder / "late.jsonl", STREAM[1::2])


def late_round_run(ctx: Context, folder: Path) -> None:
    first, late = late_round_files(folder)
    pipeline(ctx, [first])
    pipeline(ctx, [late])
    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'export.clickhouse' AND status = 'ok'")
    assert [r["metrics"]["late_corrections"] for r in log.orderBy("started_at").collect()] == [0.0, 6.0]


def test_only_closed_windows_are_exported_once_and_sums_equal_gold(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path / "lake")
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)], drain=False)
    sums, raw = clickhouse_state(ctx)
    # Newest event 00:02:57, grace 60 s: windows ending by 00:01:57 are closed: 00:00:00 .. 00:01:00.
    assert sorted({k[-1] % 3600 for k in sums}) == [0, 30, 60]
    again = passes.export_property_values(ctx)
    assert again.status == "noop"
    passes.export_property_values(ctx, drain=True)
    sums, raw = clickhouse_state(ctx)
    gold = gold_state(ctx)
    assert sums == gold and raw == len(gold)  # one record per tuple and window, nothing late
    assert sum(sums.values()) == 60 * 2  # two properties per event


def test_late_counts_after_export_go_out_as_a_correction_row(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path / "lake")
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    before_sums, before_raw = clickhouse_state(ctx)
    late = [event(1000, second=5, props={"plan": "free"})]  # lands in the first, exported window
    pipeline(ctx, [write(tmp_path / "late.jsonl", late)])
    record = passes.export_property_values(ctx, drain=True)
    sums, raw = clickhouse_state(ctx)
    assert sums == gold_state(ctx)
    assert raw == before_raw + 1  # one correction row ...
    changed = {k: v for k, v in sums.items() if before_sums.get(k) != v}
    assert list(changed.values()) == [before_sums[next(iter(changed))] + 1]  # ... carrying the difference
    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'export.clickhouse' AND status = 'ok'").collect()
    assert any(r["metrics"].get("late_corrections") == 1.0 for r in log)
    assert record.status == "noop"


def nonzero(sums: dict[tuple, int]) -> dict[tuple, int]:
    """ClickHouse's sums less the tuples taken back to 0 (a SummingMergeTree drops them when it merges)."""
    return {k: v for k, v in sums.items() if v}


def test_tuples_that_leave_gold_after_export_are_taken_back_from_clickhouse(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A backfill may remove a tuple from windows already exported: the next batch sends its count
    taken back, so ClickHouse's sum is 0 for it, and equals gold for the rest."""
    ctx = make_ctx(spark, tmp_path / "lake")
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    before, before_raw = clickhouse_state(ctx)
    # The "plan" tuples of the first two windows (00:00:00, 00:00:30) leave gold: 10 events each.
    ctx.store.delete(GOLD_PROPERTY_VALUES, "property_key = 'plan' AND window_start < '2024-06-01 00:01:00'")
    passes.export_property_values(ctx, drain=True)
    sums, raw = clickhouse_state(ctx)
    gone = {k for k in before if k[2] == "plan" and k[-1] % 3600 < 60}
    assert len(gone) == 2 and all(before[k] == 10 for k in gone)
    assert {k: sums[k] for k in gone} == dict.fromkeys(gone, 0)
    assert nonzero(sums) == gold_state(ctx) == {k: v for k, v in before.items() if k not in gone}
    assert raw == before_raw + 2  # one row each, carrying -10
    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'export.clickhouse' AND status = 'ok'").orderBy("started_at")
    last = log.collect()[-1]["metrics"]
    assert (last["late_corrections"], last["count_sum"]) == (2.0, -20.0)


def test_singleton_gate_holds_back_counts_below_it(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path / "lake", min_export_count=2)
    events = [event(i, second=1, props={"k": f"v{i % 3}", "rare": f"r{i}"}) for i in range(6)]
    pipeline(ctx, [write(tmp_path / "a.jsonl", events)])
    sums, _ = clickhouse_state(ctx)
    assert {k[3] for k in sums} == {"v0", "v1", "v2"}  # each seen twice; the six rare values once
    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'export.clickhouse' AND status = 'ok'").first()
    assert log is not None and log["metrics"]["gated"] == 6.0
    # Exported counts are the fan-out tuples minus the gated ones.
    assert sum(sums.values()) == 6 and sum(gold_state(ctx).values()) == 6 + 6


def test_k_pods_give_the_same_clickhouse_content_as_one(spark: SparkSession, tmp_path: Path) -> None:
    stream = [event(i, second=i % 90, team=1 + i % 3) for i in range(240)]
    results = {}
    for pods in (1, 4):
        lake = tmp_path / f"pods{pods}"
        lake.mkdir()
        files = [write(lake / f"pod-{p}.jsonl", stream[p::pods]) for p in range(pods)]
        ctx = make_ctx(spark, lake / "lake")
        pipeline(ctx, files)
        partials = ctx.store.stats(GOLD_PARTIALS).rows
        results[pods] = (clickhouse_state(ctx), partials, len(gold_state(ctx)))
    (one_sums, one_raw), one_partials, gold_rows = results[1]
    (four_sums, four_raw), four_partials, _ = results[4]
    assert four_sums == one_sums and four_raw == one_raw == gold_rows
    # Stage 1 alone would have exported one row per pod and tuple-window: stage 2 removes that.
    assert four_partials > one_partials == gold_rows


class Crash(Exception):
    pass


def crash_on(
    monkeypatch: pytest.MonkeyPatch, target: Any, name: str | tuple[str, ...], when: Callable[..., bool], after: bool
) -> None:
    """Crash once at the first call of any of the methods ``name`` for which ``when`` holds."""
    names = (name,) if isinstance(name, str) else name
    reals = {n: getattr(target, n) for n in names}

    def wrapper(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if when(*args, **kwargs):
                if after:
                    real(*args, **kwargs)
                for n, r in reals.items():  # crash once
                    monkeypatch.setattr(target, n, r)
                raise Crash(f"killed {'after' if after else 'before'} {real.__name__}")
            return real(*args, **kwargs)

        return wrapped

    for n, real in reals.items():
        monkeypatch.setattr(target, n, wrapper(real))


def is_spec(spec: TableSpec) -> Callable[..., bool]:
    return lambda self, s, *a, **k: s == spec


Patch = Callable[[pytest.MonkeyPatch, type[TableStore]], None]
#: Where a batch's sending can stop: before ClickHouse has its rows, and before and after its record.
SENDING_CRASHES: list[tuple[str, Patch]] = [
    (
        "between the outbox and the insert",
        lambda m, _: crash_on(m, clickhouse, ("insert", "insert_files"), lambda *a, **k: True, False),
    ),
    (
        "between the insert and its Delta record",
        lambda m, store: crash_on(m, store, "append", is_spec(EXPORTS), False),
    ),
    (
        "after the Delta record",
        lambda m, store: crash_on(m, store, "append", is_spec(EXPORTS), True),
    ),
]


@pytest.mark.parametrize(
    ("what", "patch"),
    [
        *SENDING_CRASHES,
        (
            "in the merger before its commit",
            lambda m, store: crash_on(m, store, ("append", "merge"), is_spec(GOLD_PROPERTY_VALUES), False),
        ),
        (
            "in the merger after its commit",
            lambda m, store: crash_on(m, store, ("append", "merge"), is_spec(GOLD_PROPERTY_VALUES), True),
        ),
    ],
)
def test_a_crash_then_a_rerun_leaves_clickhouse_as_a_clean_run(
    spark: SparkSession,
    engine: str,
    clean_runs: CleanRuns,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    patch: Patch,
) -> None:
    files = two_pods(tmp_path)
    expected = clean_runs.state(spark, engine, "two-pods", two_pods_run)

    ctx = make_ctx(spark, tmp_path / "crashy", engine)
    patch(monkeypatch, type(ctx.store))
    with pytest.raises(Crash):
        pipeline(ctx, files)
    pipeline(ctx, files)  # the rerun: every step picks up where the crash left it
    assert clickhouse_state(ctx) == expected, what
    assert clickhouse_state(ctx)[0] == gold_state(ctx)


@pytest.mark.parametrize(
    ("what", "patch"),
    [
        (
            "before the outbox's commit",
            lambda m, store: crash_on(m, store, "append", is_spec(EXPORT_OUTBOX), False),
        ),
        *SENDING_CRASHES,
    ],
)
def test_a_crash_in_an_export_with_corrections_then_a_rerun_leaves_clickhouse_as_a_clean_run(
    spark: SparkSession,
    engine: str,
    clean_runs: CleanRuns,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    patch: Patch,
) -> None:
    # Round 1 exports every window (a drain) with Firefox and plan=free; round 2 brings late
    # events into the same windows: plan=free again (corrections of exported tuples) and Chrome
    # (tuples of those windows exported for the first time). The clean run also checks that round
    # 2 sent 6 corrections.
    first, late = late_round_files(tmp_path)
    expected = clean_runs.state(spark, engine, "late-round", late_round_run)

    ctx = make_ctx(spark, tmp_path / "crashy", engine)
    pipeline(ctx, [first])
    patch(monkeypatch, type(ctx.store))
    with pytest.raises(Crash):
        pipeline(ctx, [late])
    pipeline(ctx, [late])  # the rerun finishes the batch the crash left
    assert clickhouse_state(ctx) == expected, what
    assert clickhouse_state(ctx)[0] == gold_state(ctx)
    exported = {
        (r["property_key"], r["property_value"], r["window_start"]): r["exported_count"]
        for r in ctx.store.read(EXPORT_OUTBOX).transform(exported_of).collect()
    }
    # Each window: 5 events of round 1, 5 late ones (30 s windows, an event every 3 s).
    windows = sorted({w for _, _, w in exported})
    assert len(windows) == 6 and len(exported) == 18, what
    assert all(exported[("plan", "free", w)] == 10 for w in windows)
    assert all(exported[("browser", "Firefox", w)] == 5 and exported[("browser", "Chrome", w)] == 5 for w in windows)


@pytest.mark.parametrize(
    "mode", ["chunks to a server", "file order, from before", "sorted by key, from before", "tables by name"]
)
def test_a_crash_part_way_through_the_chunks_then_a_rerun_sends_each_row_once(
    spark: SparkSession,
    clean_runs: CleanRuns,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    mode: str,
) -> None:
    # Chunks of 4 rows: the crash comes after two chunks have reached ClickHouse, and the rerun
    # must cut the batch into the same chunks (ClickHouse drops those two by their tokens). The
    # embedded engine reads a batch's files whole; a server gets them in chunks (the embedded
    # engine taken for one here). A batch in the outbox from before (recorded under the files app
    # id, or the plain one) is resent as it was first sent: in file order, or sorted by key. Tables
    # by name (managed, as Unity Catalog makes them, on delta-spark) never read the outbox commit's
    # files from the log: each batch is sent sorted by key, and resent so.
    files = two_pods(tmp_path)
    expected = clean_runs.state(spark, "delta-rs", "two-pods-in-chunks-of-4", two_pods_in_chunks_of_4)
    monkeypatch.setattr(clickhouse, "embedded", lambda _: False)

    if mode == "tables by name":
        request.getfixturevalue("delta_spark")  # skips (or fails in CI) without the Delta jars
        schema = f"export_{tmp_path.name}".replace("-", "_")
        settings = load_settings(
            lake_root=str(tmp_path / "crashy"),
            delta_engine="delta-spark",
            catalog="spark_catalog",
            schema=schema,
            table_kind="managed",
            gold={"window": "30s", "grace": "60s"},
        )
        ctx = Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)
        request.addfinalizer(lambda: spark.sql(f"DROP SCHEMA IF EXISTS spark_catalog.{schema} CASCADE"))
    else:
        ctx = make_ctx(spark, tmp_path / "crashy")
    before = {"file order, from before": "#files", "sorted by key, from before": ""}.get(mode)
    ctx.settings.clickhouse.insert_chunk_rows = 4
    store_type = type(ctx.store)
    if before is not None:
        real_append = store_type.append

        def as_before(self: TableStore, spec: TableSpec, data: Any, txns: Any = (), *a: Any, **kw: Any) -> int:
            if spec == EXPORT_OUTBOX:
                txns = [AppTxn(t.app_id.removesuffix("#bulk") + before, t.version) for t in txns]
            return real_append(self, spec, data, txns, *a, **kw)

        monkeypatch.setattr(store_type, "append", as_before)
    inserts: list[str] = []
    real_insert = clickhouse.insert
    # A batch from before is one whose outbox record this run wrote as before, then stopped
    # ahead of any insert: the next run resends it as the earlier version sent it.
    allowed = [0, 2] if before is not None else [2]

    def insert(client: Any, table: str, data: Any, token: str, database: str = "default") -> None:
        if len(inserts) == allowed[0]:
            allowed.pop(0)
            if not allowed:
                monkeypatch.setattr(clickhouse, "insert", real_insert)
            raise Crash(f"killed after {len(inserts)} chunks")
        inserts.append(token)
        real_insert(client, table, data, token, database)

    monkeypatch.setattr(clickhouse, "insert", insert)
    for _ in allowed[:]:
        with pytest.raises(Crash):
            pipeline(ctx, files)
    order = {"chunks to a server": "b", "file order, from before": "f"}.get(mode, "c")
    assert [t.rsplit(":", 1)[1] for t in inserts] == [f"{order}0", f"{order}1"]
    pipeline(ctx, files)
    assert clickhouse_state(ctx) == expected
    assert clickhouse_state(ctx)[0] == gold_state(ctx)


def test_a_team_moved_to_another_bucket_mid_window_is_still_one_clickhouse_row_per_tuple_and_window(
    spark: SparkSession, tmp_path: Path
) -> None:
    def mapping(bucket: int) -> dict[str, Any]:
        path = tmp_path / f"to-{bucket}.yaml"
        path.write_text(json.dumps({"count": 4, "teams": {"1": bucket}}))  # JSON is YAML
        return {"count": 4, "mapping_file": str(path)}

    def ctx_in(bucket: int) -> Context:
        settings = load_settings(
            lake_root=str(tmp_path / "lake"), gold={"window": "30s", "grace": "60s"}, buckets=mapping(bucket)
        )
        return Context(settings=settings, spark=spark, store=open_store(settings, spark), say=lambda _: None)

    free = {"plan": "free"}
    w0 = int(datetime(2024, 6, 1, tzinfo=UTC).timestamp())
    # Four events in the first window while team 1 is in bucket 0: nothing closed yet.
    pipeline(ctx_in(0), [write(tmp_path / "a.jsonl", [event(i, second=2, props=free) for i in range(4)])], drain=False)
    # The mapping moves it to bucket 3; two more events in the same window, and one at 00:03:20
    # that closes it: the first export sends the window, both buckets' counts summed.
    moved = ctx_in(3)
    more = [event(10 + i, second=3, props=free) for i in range(2)] + [event(20, second=200, props=free)]
    pipeline(moved, [write(tmp_path / "b.jsonl", more)], drain=False)
    sums, raw = clickhouse_state(moved)
    assert (sums, raw) == ({(1, "event", "plan", "free", w0): 6}, 1)
    # A late event for the exported window, counted in bucket 3: one correction row of +1.
    pipeline(moved, [write(tmp_path / "c.jsonl", [event(30, second=4, props=free)])], drain=False)
    sums, raw = clickhouse_state(moved)
    assert (sums, raw) == ({(1, "event", "plan", "free", w0): 7}, 2)
    # Gold keeps a row per bucket that counted the window.
    gold = moved.store.read(GOLD_PROPERTY_VALUES).where(f"unix_seconds(window_start) = {w0}").collect()
    assert sorted((r["bucket"], r["count"]) for r in gold) == [(0, 4), (3, 3)]


def engine_of(client: Any, database: str = "default") -> str:
    sql = f"SELECT engine_full FROM system.tables WHERE database = '{database}' AND name = 'property_values'"
    return str(clickhouse.query_rows(client, sql)[0][0])


def test_rows_carry_last_seen_and_the_table_a_ttl_when_asked(spark: SparkSession, tmp_path: Path) -> None:
    ctx = make_ctx(spark, tmp_path / "lake")
    ctx.settings.clickhouse.ttl_days = 10_000  # 27 years: the 2024 events here must not expire (DateTime ends in 2106)
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    with clickhouse.connect(ctx.settings) as client:
        rows = clickhouse.query_rows(
            client, "SELECT DISTINCT toUnixTimestamp(window_start), toUnixTimestamp(last_seen) FROM property_values"
        )
        engine = engine_of(client)
    start = int(datetime(2024, 6, 1, tzinfo=UTC).timestamp())
    assert sorted(rows) == [(start + 30 * w, start + 30 * (w + 1)) for w in range(6)]  # drained: every window
    assert "TTL toDateTime(last_seen) + toIntervalDay(10000)" in engine


def test_a_table_from_before_last_seen_gets_the_column_and_a_ttl(tmp_path: Path) -> None:
    settings = load_settings(lake_root=str(tmp_path / "lake"))
    with clickhouse.connect(settings) as client:
        client.command(
            "CREATE TABLE property_values (team_id Int64, property_type LowCardinality(String), "
            "property_key String, property_value String, window_start DateTime64(3, 'UTC'), `count` Int64) "
            "ENGINE = SummingMergeTree(`count`) "
            "ORDER BY (team_id, property_type, property_key, property_value, window_start)"
        )
        client.command("INSERT INTO property_values VALUES (1, 'event', 'k', 'v', '2024-06-01 00:00:30', 4)")
        clickhouse.ensure_property_values(client)
        assert clickhouse.query_rows(client, "SELECT `count`, toString(last_seen) FROM property_values") == [
            (4, "2024-06-01 00:00:30.000")
        ]
        assert "TTL" not in engine_of(client)
        clickhouse.ensure_property_values(client, ttl_days=10_000)
        clickhouse.ensure_property_values(client, ttl_days=10_000)  # already there: left as it is
        assert "TTL toDateTime(last_seen) + toIntervalDay(10000)" in engine_of(client)


def test_validation_leaves_out_windows_the_ttl_may_have_expired(spark: SparkSession, tmp_path: Path) -> None:
    from pipelines import flows
    from pipelines.runtime.eventlog import RunRecord
    from pipelines.runtime.quality import validate_tables

    ctx = make_ctx(spark, tmp_path / "lake")
    ctx.settings.clickhouse.ttl_days = 30  # the 2024 events here are long past it
    pipeline(ctx, [write(tmp_path / "a.jsonl", STREAM)])
    with clickhouse.connect(ctx.settings) as client:
        client.command("OPTIMIZE TABLE property_values FINAL")  # a merge: the TTL deletes every row
        assert clickhouse.query_rows(client, "SELECT count() FROM property_values") == [(0,)]
    assert gold_state(ctx)  # while gold and the export state still hold them
    (result,) = validate_tables(ctx, RunRecord("validate"), ["clickhouse/property_values"], flows.table_checks())
    assert result.validation is not None and not result.validation.failed
    assert result.note and "clickhouse.ttl_days=30" in result.note


def test_top_values_per_key_keeps_the_largest_and_corrects_only_what_it_sent(
    spark: SparkSession, tmp_path: Path
) -> None:
    ctx = make_ctx(spark, tmp_path / "lake", top_values_per_key=2)
    values = ["A"] * 5 + ["B"] * 3 + ["C"] * 2 + ["D"]
    first = [event(i, second=i, props={"browser": v}) for i, v in enumerate(values)]
    first.append(event(20, second=20, props={"os": "L"}))
    pipeline(ctx, [write(tmp_path / "a.jsonl", first)])
    start = int(datetime(2024, 6, 1, tzinfo=UTC).timestamp())
    assert clickhouse_state(ctx)[0] == {
        (1, "event", "browser", "A", start): 5,
        (1, "event", "browser", "B", start): 3,
        (1, "event", "os", "L", start): 1,
    }
    log = ctx.store.read(PIPELINE_EVENTS).where("job = 'export.clickhouse' AND status = 'ok'").collect()
    assert [r["metrics"]["top_values_dropped"] for r in log] == [2]  # C and D

    # Late events in that window: B grows and is corrected; E is new with no place left for
    # browser, while os has one left for M.
    late = [event(30 + i, second=25, props={"browser": "E"}) for i in range(4)]
    late += [event(40, second=26, props={"browser": "B"}), event(41, second=27, props={"os": "M"})]
    pipeline(ctx, [write(tmp_path / "b.jsonl", late)])
    assert clickhouse_state(ctx)[0] == {
        (1, "event", "browser", "A", start): 5,
        (1, "event", "browser", "B", start): 4,
        (1, "event", "os", "L", start): 1,
        (1, "event", "os", "M", start): 1,
    }
    log = (
        ctx.store.read(PIPELINE_EVENTS)
        .where("job = 'export.clickhouse' AND status = 'ok'")
        .orderBy("started_at")
        .collect()
    )
    assert [r["metrics"]["top_values_dropped"] for r in log] == [2, 1]  # then E
