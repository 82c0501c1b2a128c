"""The jobs: each wires read -> transform -> write for one step, exactly once.

Bronze lands files and Kafka messages; silver buckets events and deduplicates page changes; gold
fans events out into partial counts (stage 1), merges them (stage 2) and exports count differences
to ClickHouse; metrics turn samples into panes and closed windows; counters keep tiered totals and
their milestones. One module per layer or kind; the logic they wire lives in bronze/, silver/ and
gold/, and what the layers are configured with is built in ``pipelines.layer_config``.
"""

from __future__ import annotations

from pipelines.jobs.bronze import KINDS, Landed, ingest_files, ingest_kafka, parse_landing, topic_kinds
from pipelines.jobs.counters import counter_milestones, export_counters, gold_counter_partials, gold_counters
from pipelines.jobs.export import export_property_values
from pipelines.jobs.gold import gold_merge, gold_partials, gold_property_values
from pipelines.jobs.metrics import gold_metric_windows, silver_metric_panes
from pipelines.jobs.silver import silver_events, silver_page_changes
from pipelines.layer_config import bucket_mapping, counter_registry, fanout_rules

__all__ = [
    "KINDS",
    "Landed",
    "bucket_mapping",
    "counter_milestones",
    "counter_registry",
    "export_counters",
    "export_property_values",
    "fanout_rules",
    "gold_counter_partials",
    "gold_counters",
    "gold_merge",
    "gold_metric_windows",
    "gold_partials",
    "gold_property_values",
    "ingest_files",
    "ingest_kafka",
    "parse_landing",
    "silver_events",
    "silver_metric_panes",
    "silver_page_changes",
    "topic_kinds",
]
