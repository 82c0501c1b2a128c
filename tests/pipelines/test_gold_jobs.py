"""Gold's two stages run back to back: each writes in one pass, nothing cached; stage 2 reads back
the partials stage 1 committed; gold is the same whichever pass its partials came in."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.config.settings import Settings
from pipelines.config.spark import session_confs
from pipelines.runtime import ingest, passes
from pipelines.runtime.flow_types import FlowRecord
from pipelines.runtime.incremental import _from_least
from pipelines.runtime.progress import Increment
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import GOLD_PARTIALS, GOLD_PROPERTY_VALUES
from pipelines.storage import open_store
from tests.pipelines.test_jobs import write_events


@pytest.fixture
def ctx(spark: SparkSession, engine_settings: Callable[..., Settings], tmp_path: Path) -> Context:
    settings = engine_settings(tmp_path / "lake")
    return Context(settings=settings, spark=spark, store=open_store(settings, spark))


def gold_counts(ctx: Context) -> list[tuple[int, str, str, int]]:
    rows = ctx.store.read(GOLD_PROPERTY_VALUES).select("team_id", "property_key", "property_value", "count")
    return sorted(tuple(r) for r in rows.collect())


def test_each_stage_writes_in_one_pass_and_stage_two_reads_back_what_stage_one_committed(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest.ingest_files(ctx, "events", [write_events(tmp_path / "a.jsonl", 1, 10)])
    passes.silver_events(ctx)
    read, cached = Increment.read, []
    monkeypatch.setattr(FlowRecord, "cache", lambda self, df: cached.append(df) or df.persist())
    reads: list[str] = []

    def recorded(self: Increment, store: object) -> object:
        reads.append(self.source.key)
        return read(self, store)  # type: ignore[arg-type]

    monkeypatch.setattr(Increment, "read", recorded)
    partials, merged = passes.gold_property_values(ctx)
    assert (partials.status, merged.status) == ("ok", "ok")
    assert reads == ["silver/events", "gold/property_value_partials"]
    # A first load is appended in one pass on delta-rs (no cache); Delta on Spark MERGEs it, from a cache.
    assert len(cached) == (0 if ctx.settings.delta_engine == "delta-rs" else 1)
    # 10 events, $browser alternating Firefox / Chrome and n alternating 0 / 1, in one window.
    assert gold_counts(ctx) == [
        (1, "$browser", "Chrome", 5),
        (1, "$browser", "Firefox", 5),
        (1, "n", "0", 5),
        (1, "n", "1", 5),
    ]
    assert ctx.store.read(GOLD_PARTIALS).count() == 4
    assert (partials.metrics["input_events"], partials.metrics["tuples"], partials.metrics["partial_rows"]) == (
        10,
        20,
        4,
    )
    assert merged.metrics["partial_rows"] == 4 and merged.metrics["merged_rows"] == 4


def test_stage_two_reads_the_table_when_more_than_stage_ones_write_is_pending(ctx: Context, tmp_path: Path) -> None:
    ingest.ingest_files(ctx, "events", [write_events(tmp_path / "a.jsonl", 1, 10)])
    passes.silver_events(ctx)
    passes.gold_partials(ctx)  # another pod's stage 1, not merged yet
    ingest.ingest_files(ctx, "events", [write_events(tmp_path / "b.jsonl", 1, 4, start=10)])
    passes.silver_events(ctx)
    _, merged = passes.gold_property_values(ctx)
    assert merged.metrics["partial_rows"] == 8
    assert gold_counts(ctx) == [
        (1, "$browser", "Chrome", 7),
        (1, "$browser", "Firefox", 7),
        (1, "n", "0", 7),
        (1, "n", "1", 7),
    ]
    assert passes.gold_merge(ctx).status == "noop"


def test_stage_two_appends_windows_gold_does_not_hold_and_merges_the_ones_it_holds(
    ctx: Context, tmp_path: Path
) -> None:
    """A window is in the MERGE key: a source whose windows all start after gold's newest is
    appended (delta-rs reads that from the log's statistics), one with a window gold holds is
    MERGEd. The counts are the same either way."""

    def land(name: str, minute: int, n: int, start: int) -> None:
        path = write_events(tmp_path / name, 1, n, start=start)
        path.write_text(path.read_text().replace("T00:00:", f"T00:{minute:02d}:"))
        ingest.ingest_files(ctx, "events", [path])
        passes.silver_events(ctx)
        passes.gold_property_values(ctx)

    land("a.jsonl", 0, 10, 0)  # gold is empty: appended
    land("b.jsonl", 1, 4, 10)  # a later window only: appended
    land("c.jsonl", 1, 2, 14)  # the window gold now holds: MERGEd
    rows = ctx.store.read(GOLD_PROPERTY_VALUES).select("window_start", "property_key", "property_value", "count")
    counts = sorted(
        (r["window_start"].minute, r["property_key"], r["property_value"], r["count"]) for r in rows.collect()
    )
    assert counts == [
        (0, "$browser", "Chrome", 5),
        (0, "$browser", "Firefox", 5),
        (0, "n", "0", 5),
        (0, "n", "1", 5),
        (1, "$browser", "Chrome", 3),
        (1, "$browser", "Firefox", 3),
        (1, "n", "0", 3),
        (1, "n", "1", 3),
    ]
    commits = [h["operation"] for h in sorted(ctx.store.history(GOLD_PROPERTY_VALUES), key=lambda h: h["version"])]
    if ctx.settings.delta_engine == "delta-rs":
        assert commits[-3:] == ["WRITE", "WRITE", "MERGE"]
    else:  # no statistics read without a Spark job there: every source is MERGEd, as before
        assert commits[-3:] == ["MERGE", "MERGE", "MERGE"]


def test_the_merge_bound_on_gold_windows_is_an_instant_whatever_the_sessions_time_zone(spark: SparkSession) -> None:
    """Stage 2's MERGE condition carries the source's least window as a bound on gold's; a cluster's
    session may read time in another zone than UTC, and must read the same instant."""
    least = datetime(2024, 6, 1, 0, 0, 30, 500, tzinfo=UTC)
    on = _from_least("t.k = s.k", "window_start", least)
    assert on.startswith("(t.k = s.k) AND t.window_start >= TIMESTAMP ")
    bound = on.split(" >= ", 1)[1]
    with session_confs(spark, {"spark.sql.session.timeZone": "America/Los_Angeles"}):
        micros = spark.sql(f"SELECT unix_micros({bound})").first()[0]  # type: ignore[index]
    assert micros == int(least.timestamp()) * 1_000_000 + 500
    # A year before 1000 is written with four digits, as both engines' parsers read it.
    assert _from_least("t.k = s.k", "w", datetime(999, 1, 2, tzinfo=UTC)).endswith(
        "TIMESTAMP '0999-01-02T00:00:00.000000Z'"
    )
