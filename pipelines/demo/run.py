"""``medallion demo``: the whole pipeline on one machine, no services, real and synthetic data.

Lands the shipped PostHog and MediaWiki fixtures, a few malformed records (to show quarantine)
and a seeded synthetic stream into bronze; runs silver, gold and the ClickHouse export on the
embedded engine; precomputes metric windows over remote-write samples (``demo_metrics``); prints
what came out. Every step is idempotent, so a second run changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import flows
from pipelines.demo import data as fixtures
from pipelines.demo import synthetic
from pipelines.demo.counters import counters_summary, prepare_counters
from pipelines.demo.metric_windows import metrics_summary, prepare_metrics
from pipelines.flows import flow_names
from pipelines.runtime import ingest, passes
from pipelines.runtime.eventlog import PIPELINE_EVENTS, totals
from pipelines.runtime.runner import Context
from pipelines.runtime.tables import (
    BRONZE_EVENTS,
    BRONZE_PAGE_CHANGES,
    BRONZE_QUARANTINE,
    GOLD_PARTIALS,
    GOLD_PROPERTY_VALUES,
    SILVER_EVENTS,
    SILVER_PAGE_CHANGES,
)
from pipelines.sinks import clickhouse

#: Records that must land in quarantine, one per kind of problem.
MALFORMED_EVENTS = (
    b'{"uuid": "not json"',
    b'{"uuid": "0190a0c2-1111-7000-8000-000000000001", "event": "$pageview", "distinct_id": "d1",'
    b' "timestamp": "2024-06-01T00:00:00Z", "properties": {}}',
    b'{"uuid": "0190a0c2-1111-7000-8000-000000000002", "event": "$pageview", "team_id": "two",'
    b' "distinct_id": "d1", "timestamp": "2024-06-01T00:00:00Z", "properties": {}}',
    b'{"uuid": "0190a0c2-1111-7000-8000-000000000003", "event": "$pageview", "team_id": 2,'
    b' "distinct_id": "d1", "timestamp": "yesterday", "properties": {}}',
    b"[1, 2, 3]",
)


@dataclass(frozen=True)
class DemoSize:
    events: int = 200_000
    page_changes: int = 60_000
    event_batches: int = 8
    page_change_batches: int = 4


def landing_files(lake_root: Path, size: DemoSize) -> dict[str, list[Path]]:
    """Write (or reuse, byte-identical) every input file of the demo under ``<lake>/_landing``."""
    landing = lake_root / "_landing"
    fixture_events = fixtures.write_posthog_events(landing / "fixtures" / "posthog-events.jsonl")
    malformed = landing / "fixtures" / "malformed-events.jsonl"
    malformed.parent.mkdir(parents=True, exist_ok=True)
    malformed.write_bytes(b"\n".join(MALFORMED_EVENTS) + b"\n")
    events = synthetic.write_jsonl_batches(
        synthetic.generate_events(synthetic.EventsSpec(events=size.events)),
        landing / "synthetic",
        "events",
        size.event_batches,
        interleave=True,  # batches stand for pods consuming one stream at once
    )
    changes = synthetic.write_jsonl_batches(
        synthetic.generate_page_changes(synthetic.PageChangesSpec(changes=size.page_changes)),
        landing / "synthetic",
        "page-changes",
        size.page_change_batches,
    )
    return {
        "events": [fixture_events, malformed, *events],
        "page_changes": [*fixtures.PAGE_CHANGE_FILES, *changes],
    }


def run_demo(ctx: Context, size: DemoSize) -> dict[str, Any]:
    """Run every step; return the figures the summary prints."""
    lake = Path(ctx.settings.lake_root)
    ctx.say("writing input files (fixtures, malformed records, synthetic stream)")
    files = landing_files(lake, size)
    for kind, paths in files.items():
        ctx.say(f"bronze: landing {len(paths)} {kind} file(s)")
        ingest.ingest_files(ctx, kind, paths)
    metrics_config = prepare_metrics(ctx)
    counters_registry = prepare_counters(ctx)
    # Every flow `medallion run all` runs, drained: the demo is a backfill, so every window closes.
    for _ in passes.run_pass(ctx, flows.resolve("all"), drain=True):
        pass
    return {
        **summary(ctx),
        "metrics": metrics_summary(ctx, metrics_config),
        "counters": counters_summary(ctx, counters_registry),
    }


def summary(ctx: Context) -> dict[str, Any]:
    """Rows per table, page-change dedup and ClickHouse records per input event."""
    store = ctx.store
    specs = (
        BRONZE_EVENTS,
        BRONZE_PAGE_CHANGES,
        BRONZE_QUARANTINE,
        SILVER_EVENTS,
        SILVER_PAGE_CHANGES,
        GOLD_PARTIALS,
        GOLD_PROPERTY_VALUES,
    )
    rows = {s.key: store.stats(s).rows for s in specs}
    gold_sum = _scalar(ctx, store.read(GOLD_PROPERTY_VALUES).selectExpr("coalesce(sum(count), 0)"))
    with clickhouse.connect(ctx.settings) as client:
        clickhouse.ensure_property_values(client, ctx.settings.clickhouse.database)
        db = ctx.settings.clickhouse.database
        ch_rows, ch_sum = clickhouse.query_rows(
            client, f"SELECT count(), coalesce(sum(`count`), 0) FROM {db}.{clickhouse.PROPERTY_VALUES_TABLE}"
        )[0]
        ch_tuples = clickhouse.query_rows(
            client,
            f"SELECT count() FROM (SELECT 1 FROM {db}.{clickhouse.PROPERTY_VALUES_TABLE} "
            "GROUP BY team_id, property_type, property_key, property_value, window_start)",
        )[0][0]
    exports = store.read(PIPELINE_EVENTS).where("job = 'export.clickhouse' AND status = 'ok'").collect()
    corrections = int(sum((r["metrics"] or {}).get("late_corrections", 0) for r in exports))
    gated = int(exports[-1]["metrics"].get("gated", 0)) if exports else 0
    repeats = totals(store, "duplicates_dropped")  # dropped by event identity, per silver flow
    events_in = rows[BRONZE_EVENTS.key]
    changes_in = rows[BRONZE_PAGE_CHANGES.key]
    changes_out = rows[SILVER_PAGE_CHANGES.key]
    return {
        "tables": rows,
        "clickhouse_rows": int(ch_rows),
        "clickhouse_tuple_windows": int(ch_tuples),
        "clickhouse_count_sum": int(ch_sum),
        "gold_count_sum": int(gold_sum),
        "tuples_fanned_out": int(gold_sum),
        "late_corrections": corrections,
        "gated": gated,
        "page_changes_in": changes_in,
        "page_changes_out": changes_out,
        "page_changes_deduplicated": changes_in - changes_out,
        "event_repeats_dropped": repeats.get(flow_names.SILVER_EVENTS, 0),
        "page_change_repeats_dropped": repeats.get(flow_names.SILVER_PAGE_CHANGES, 0),
        "dedup_percent": round(100.0 * (changes_in - changes_out) / changes_in, 2) if changes_in else 0.0,
        "records_per_event_single_stage": round(rows[GOLD_PARTIALS.key] / events_in, 3) if events_in else 0.0,
        "records_per_event_two_stage": round(ch_tuples / events_in, 3) if events_in else 0.0,
        "lake_root": ctx.settings.lake_root,
        "clickhouse": ctx.settings.clickhouse.dsn,
    }


def _scalar(ctx: Context, df: Any) -> Any:
    row = df.first()
    return row[0] if row else None
