"""Every flow's name, typed once. A flow's name is its identity: its app ids (its progress on its
targets) derive from it, so a name typed twice and renamed once would reset that progress
silently. The registry (:mod:`pipelines.flows`) declares each flow under its name from here, and
code that looks up a flow's progress (an export reading what stage 2 merged, ``medallion
buckets``) names it from here too."""

INGEST_KAFKA = "ingest.kafka"
INGEST_FILE_EVENTS = "ingest_file.events"
INGEST_FILE_PAGE_CHANGES = "ingest_file.page_changes"
INGEST_REMOTE_WRITE = "ingest.remote_write"
SILVER_EVENTS = "silver.events"
SILVER_PAGE_CHANGES = "silver.page_changes"
GOLD_PARTIALS = "gold.partials"
GOLD_MERGE = "gold.merge"
EXPORT_CLICKHOUSE = "export.clickhouse"
SILVER_METRIC_PANES = "silver.metric_panes"
GOLD_METRIC_WINDOWS = "gold.metric_windows"
GOLD_COUNTER_PARTIALS = "gold.counter_partials"
GOLD_COUNTERS = "gold.counters"
GOLD_COUNTER_MILESTONES = "gold.counter_milestones"
EXPORT_COUNTERS = "export.counters"


def ingest_file(kind: str) -> str:
    """The flow that lands files of ``kind`` (``events``, ``page_changes``)."""
    return f"ingest_file.{kind}"
