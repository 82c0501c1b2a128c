"""One suite builder per table. Each returns the checks a batch must pass before it is written
(and that ``medallion validate`` runs over the whole table).

Uniqueness of stage-1 partials, gold rows and export batches is checked on whole tables only: each
batch comes out of a GROUP BY on exactly those keys, so checking it per batch would cost a shuffle
of every batch (a quarter of the demo's run time) to confirm what the plan guarantees, while the
tables, where a broken MERGE or a double write would show, are checked by ``medallion validate``.

Default policies follow who is at fault: bad input rows in bronze are dropped to the quarantine;
a broken invariant further down (a bucket out of range, a duplicate gold row, counts not conserved)
is a bug in the pipeline, so the run fails and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from bronze.page_changes import PAGE_CHANGE_KINDS
from expectations.core import (
    Check,
    Suite,
    at_least_column,
    between,
    figures_equal,
    in_set,
    no_rows,
    not_in_set,
    not_null,
    sum_equals,
    unique,
)
from gold.export import EXPORT_DATASET, EXPORT_KEY
from gold.property_values import GOLD_KEY, PROPERTY_TYPES, WINDOW_START
from silver.page_changes import KEY

OFFSETS = ("topic", "partition", "offset")
CLICKHOUSE = EXPORT_DATASET


def bronze_events() -> Suite:
    return Suite(
        "bronze/events",
        (
            *(not_null(c) for c in ("uuid", "event", "team_id", "distinct_id", "timestamp")),
            between("team_id", low=1, name="team_id_positive"),
            unique(OFFSETS, "offsets_unique"),
        ),
    )


def bronze_page_changes() -> Suite:
    return Suite(
        "bronze/page_changes",
        (
            *(not_null(c) for c in ("wiki_id", "page_id", "rev_id", "event_time", "page_change_kind")),
            in_set("page_change_kind", PAGE_CHANGE_KINDS),
            between("rev_id", low=1, name="rev_id_positive", policy="warn"),
            unique(OFFSETS, "offsets_unique"),
        ),
    )


def _repeated_identities(horizon_us: int) -> str:
    """Silver events whose identity an earlier row holds within ``horizon_us`` of event time."""
    return f"""
SELECT * FROM (
  SELECT *, LAG(event_time) OVER (PARTITION BY team_id, uuid ORDER BY event_time) AS _prev FROM {{batch}}
) WHERE _prev IS NOT NULL AND unix_micros(event_time) - unix_micros(_prev) <= {int(horizon_us)}
"""


def silver_events(bucket_count: int, dedup_horizon_us: int = 0) -> Suite:
    """``dedup_horizon_us`` (silver.dedup_horizon; 0: off) adds the check that no identity is held
    twice within it, on the whole table: each batch is deduplicated against silver as it is written."""
    identity = (
        no_rows(
            "identity_unique_within_horizon",
            _repeated_identities(dedup_horizon_us),
            "one event per (team_id, uuid) within silver.dedup_horizon of event time",
        )
        if dedup_horizon_us
        else None
    )
    return Suite(
        "silver/events",
        (
            *(not_null(c, policy="fail") for c in ("uuid", "team_id", "event_time", "bucket")),
            between("bucket", low=0, high=bucket_count - 1, policy="fail", name="bucket_in_range"),
            *([replace(identity, scope="table")] if identity is not None else []),
        ),
    )


_OUT_OF_ORDER = f"""
SELECT * FROM (
  SELECT *, LAG(rev_id) OVER w AS _prev_rev, LAG(event_time) OVER w AS _prev_time FROM {{batch}}
  WINDOW w AS (PARTITION BY {", ".join(KEY)} ORDER BY {WINDOW_START}, rev_id, event_time)
) WHERE _prev_rev > rev_id OR (_prev_rev = rev_id AND _prev_time >= event_time)
"""


def silver_page_changes() -> Suite:
    return Suite(
        "silver/page_changes",
        (
            *(not_null(c, policy="fail") for c in (*KEY, "rev_id", "event_time", WINDOW_START)),
            between("merged_count", low=1, policy="fail", name="merged_count_positive"),
            in_set("action", ("delete", "update"), policy="fail"),
            no_rows(
                "increasing_per_key",
                _OUT_OF_ORDER,
                "per (wiki_id, page_id), (rev_id, event_time) strictly increases from window to window",
            ),
        ),
    )


def _tuple_checks() -> tuple[Check, ...]:
    return (
        *(not_null(c, policy="fail") for c in ("team_id", "property_type", "property_key", WINDOW_START)),
        in_set("property_type", PROPERTY_TYPES, policy="fail"),
        between("count", low=1, policy="fail", name="count_positive"),
    )


def gold_partials(tuples: int | None = None) -> Suite:
    """Stage-1 partials; with ``tuples`` (the batch's counted fan-out) the sums must match it."""
    conserved = () if tuples is None else (sum_equals("count", tuples, "count_sum_equals_tuples", "fanned-out tuples"),)
    return Suite(
        "gold/property_value_partials",
        (
            *_tuple_checks(),
            unique((*GOLD_KEY, "batch_id"), "one_row_per_tuple_window_batch", scope="table"),
            *conserved,
        ),
    )


def gold_property_values(with_fanout: bool = False) -> Suite:
    """Gold rows; the figures checks compare it with the partials (and the silver fan-out)."""
    fanout = (
        (
            figures_equal(
                "partial_count_sum",
                "fanout_tuples",
                "partials_equal_fanout",
                "sum of partial counts == tuples fanned out from the silver events processed",
            ),
        )
        if with_fanout
        else ()
    )
    return Suite(
        "gold/property_values",
        (
            *_tuple_checks(),
            unique(GOLD_KEY, "one_row_per_tuple_window", scope="table"),
            at_least_column("last_seen", "first_seen", policy="fail"),
            figures_equal(
                "gold_count_sum",
                "partial_count_sum",
                "gold_equals_partials",
                "sum of gold counts == sum of partial counts",
            ),
            *fanout,
        ),
    )


def clickhouse_export() -> Suite:
    """An export batch (the outbox rows sent to ClickHouse) and, as a table, ClickHouse itself."""
    return Suite(
        CLICKHOUSE,
        (
            *(not_null(c, policy="fail") for c in ("team_id", "property_type", "property_key", WINDOW_START)),
            # A batch sends changes: a first count, a late count's difference, or a count taken
            # back where a backfill removed the tuple (negative); never no change, and never to a
            # total below 0. ClickHouse's rows (summed, FINAL) are positive counts.
            replace(not_in_set("count", [0], policy="fail", name="count_changes"), scope="batch"),
            replace(between("total", low=0, policy="fail", name="total_not_negative"), scope="batch"),
            replace(between("count", low=1, policy="fail", name="count_positive"), scope="table"),
            unique(EXPORT_KEY, "one_row_per_tuple_window", scope="table"),
            figures_equal(
                "clickhouse_count_sum",
                "exported_count_sum",
                "clickhouse_equals_exported",
                "sum of counts in ClickHouse == sum of gold counts recorded as exported",
            ),
            figures_equal(
                "clickhouse_rows",
                "exported_rows",
                "clickhouse_rows_equal_exported",
                "one ClickHouse row per exported (tuple, window)",
            ),
        ),
    )


#: ``layer/name`` -> builder with default arguments: what ``medallion validate`` can check.
SUITES: dict[str, Callable[..., Suite]] = {
    "bronze/events": bronze_events,
    "bronze/page_changes": bronze_page_changes,
    "silver/events": silver_events,
    "silver/page_changes": silver_page_changes,
    "gold/property_value_partials": gold_partials,
    "gold/property_values": gold_property_values,
    CLICKHOUSE: clickhouse_export,
}
