"""The runtime: flow types, the runners (incremental, export, ingest), the event log, quality gates, the tables."""
