"""Property-based tests of page-change dedup: the Spark rules against an independent reference
model, conservation, strict order, and incremental runs (with restarts) equal to one run."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from pipelines.config.settings import load_settings
from pipelines.runtime import passes
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import BRONZE_PAGE_CHANGES, SILVER_PAGE_CHANGES
from pipelines.storage import open_store
from silver.page_changes import LAST_EMITTED_SCHEMA, dedup_run

T0 = datetime(2024, 1, 1, tzinfo=UTC)
W = 300  # seconds
KINDS = ["create", "edit", "edit", "delete", "delete", "undelete", "visibility_change", "move"]
Event = tuple[str, int, int, int, str]  # wiki, page, rev, second, kind

events_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.integers(1, 3),
        st.integers(1, 6),
        st.integers(0, 1500),
        st.sampled_from(KINDS),
    ),
    min_size=1,
    max_size=40,
).flatmap(
    # Duplicates: resend some events exactly.
    lambda evs: st.lists(st.sampled_from(evs), max_size=10).map(lambda dups: evs + dups)
)


def reference(events: list[Event], mode: str, width: int = W) -> tuple[list[tuple], int]:
    """Rules 0-4, written out plainly per key: the model the Spark code must agree with."""
    by_key: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for e in events:
        by_key[(e[0], e[1])].append(e)
    out, stale = [], 0
    for key, evs in by_key.items():
        times = sorted({e[3] for e in evs})
        opens: list[int] = []
        if mode == "staggered":
            for t in times:
                if not opens or t >= opens[-1] + width:
                    opens.append(t)
        window_of = {t: (max(o for o in opens if o <= t) if mode == "staggered" else t - t % width) for t in times}
        windows: dict[int, list[Event]] = defaultdict(list)
        for e in evs:
            windows[window_of[e[3]]].append(e)
        last: tuple[int, int] | None = None
        for start in sorted(windows):
            group = windows[start]
            live = [e for e in group if last is None or (e[2], e[3]) > last]
            stale += len(group) - len(live)
            if not live:
                continue
            best: dict[int, Event] = {}
            counts: dict[int, int] = defaultdict(int)
            for e in live:
                counts[e[2]] += 1
                cur = best.get(e[2])
                if cur is None or (e[3], e[4] == "delete") > (cur[3], cur[4] == "delete"):
                    best[e[2]] = e
            survivors = sorted(best.values(), key=lambda e: (e[2], e[3]))
            deletes = [s for s in survivors if s[4] == "delete"]
            if not deletes:
                out.append((*key, survivors[-1][2], survivors[-1][3], survivors[-1][4], start, len(live)))
            else:
                d = deletes[-1]
                upto = sum(counts[s[2]] for s in survivors if (s[2], s[3]) <= (d[2], d[3]))
                out.append((*key, d[2], d[3], d[4], start, upto))
                if (survivors[-1][2], survivors[-1][3]) > (d[2], d[3]):
                    s = survivors[-1]
                    out.append((*key, s[2], s[3], s[4], start, len(live) - upto))
            last = max([p for p in [last] if p is not None] + [(e[2], e[3]) for e in group])
    return sorted(out), stale


def frame(spark: SparkSession, events: list[Event]):  # type: ignore[no-untyped-def]
    rows = [(w, p, r, T0 + timedelta(seconds=s), k, None, "{}") for w, p, r, s, k in events]
    return spark.createDataFrame(
        rows,
        "wiki_id string, page_id long, rev_id long, event_time timestamp, page_change_kind string, meta_id string, raw string",
    )


def _seconds(ts: datetime) -> int:
    # collect() gives naive datetimes in the session time zone (UTC).
    return int((ts.replace(tzinfo=UTC) - T0).total_seconds())


def as_tuples(rows) -> list[tuple]:  # type: ignore[no-untyped-def]
    return sorted(
        (
            r["wiki_id"],
            r["page_id"],
            r["rev_id"],
            _seconds(r["event_time"]),
            r["page_change_kind"],
            _seconds(r["window_start"]),
            r["merged_count"],
        )
        for r in rows
    )


@pytest.mark.parametrize("mode", ["staggered", "tumbling"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events_strategy)
def test_spark_rules_agree_with_the_reference_model(spark: SparkSession, mode: str, events: list[Event]) -> None:
    empty = spark.createDataFrame([], LAST_EMITTED_SCHEMA)
    result = dedup_run(frame(spark, events), empty, mode, timedelta(seconds=W), None)
    got = as_tuples(result.emitted.collect())
    expected, stale = reference(events, mode)
    assert got == expected
    assert result.finalized.where("_stale").count() == stale
    # Conservation: emitted rows stand for every non-stale event.
    assert sum(r[-1] for r in got) + stale == len(events)
    # Strictly increasing per key in emission (window) order.
    per_key: dict[tuple, list] = defaultdict(list)
    for w, p, rev, t, _, _start, _ in sorted(got, key=lambda r: (r[0], r[1], r[5], r[2], r[3])):
        per_key[(w, p)].append((rev, t))
    assert all(a < b for seq in per_key.values() for a, b in itertools.pairwise(seq))


def bronze_rows(events: list[Event], offset: int) -> pa.Table:
    n = len(events)
    return pa.table(
        {
            "wiki_id": [e[0] for e in events],
            "page_id": pa.array([e[1] for e in events], pa.int64()),
            "rev_id": pa.array([e[2] for e in events], pa.int64()),
            "page_change_kind": [e[4] for e in events],
            "event_time": pa.array([T0 + timedelta(seconds=e[3]) for e in events], pa.timestamp("us", tz="UTC")),
            "raw": ["{}"] * n,
            "offset": pa.array(range(offset, offset + n), pa.int64()),
        }
    )


def run_incrementally(
    spark: SparkSession, lake: Path, chunks: list[list[Event]], mode: str, lateness: int, engine: str = "delta-rs"
) -> list[tuple]:
    settings_ = load_settings(
        lake_root=str(lake),
        delta_engine=engine,
        page_changes={"mode": mode, "window": f"{W}s", "allowed_lateness": f"{lateness}s"},
    )
    offset = 0
    for chunk in chunks:
        # A fresh store and context per run: every run starts from what Delta holds, like a restart.
        ctx = Context(settings=settings_, spark=spark, store=open_store(settings_, spark), say=lambda _: None)
        ctx.store.ensure(BRONZE_PAGE_CHANGES)
        if chunk:
            ctx.store.append(BRONZE_PAGE_CHANGES, bronze_rows(chunk, offset))
            offset += len(chunk)
        passes.silver_page_changes(ctx)
    ctx = Context(settings=settings_, spark=spark, store=open_store(settings_, spark), say=lambda _: None)
    passes.silver_page_changes(ctx, drain=True)
    return as_tuples(ctx.store.read(SILVER_PAGE_CHANGES).collect())


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[list[Event], list[list[Event]], int]:
    """A stream in arrival order that never goes below the watermark of earlier runs, cut into runs.

    Arrival is ordered by event time plus a delay of at most the allowed lateness, which keeps every
    event at or above (max event time of earlier runs) - lateness wherever the runs are cut.
    """
    events = draw(events_strategy)
    lateness = draw(st.sampled_from([0, 60, 240]))
    delays = draw(st.lists(st.integers(0, lateness), min_size=len(events), max_size=len(events)))
    ordered = [
        e
        for _, _, e in sorted(
            zip([e[3] + d for e, d in zip(events, delays, strict=True)], range(len(events)), events, strict=True)
        )
    ]
    cuts = sorted(draw(st.lists(st.integers(0, len(ordered)), max_size=4)))
    bounds = [0, *cuts, len(ordered)]
    return ordered, [ordered[a:b] for a, b in itertools.pairwise(bounds)], lateness


@pytest.mark.parametrize("mode", ["staggered", "tumbling"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=arrivals())
def test_many_incremental_runs_with_restarts_equal_one_run(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, mode: str, stream: tuple
) -> None:
    # On the default engine: restarts and exactly-once on delta-spark are covered by the job and
    # crash tests; 12 generated streams of Delta commits on the JVM would multiply CI's time.
    ordered, chunks, lateness = stream
    one = run_incrementally(spark, tmp_path_factory.mktemp("one"), [ordered], mode, lateness)
    many = run_incrementally(spark, tmp_path_factory.mktemp("many"), chunks, mode, lateness)
    assert many == one
    assert one == reference(ordered, mode)[0]
