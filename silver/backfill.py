"""Backfills of silver events: the events of a range made again from bronze under the rules in force
(a changed deduplication horizon, a changed bucket mapping).

What a backfill reads, writes and in which order is the edge's
(:mod:`pipelines.runtime.backfill_silver`); this module says which rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from silver.buckets import BucketMapping, assign_buckets
from silver.dedup import first_copies, mark_repeats, recent_identities
from silver.events import to_silver_events

#: The order a backfill takes bronze's rows in to find an event's first copy: when each landed,
#: then where (bronze read as a table has no commit version, by which a run orders its batch).
LANDED_ORDER = ("ingest_time", "source_file", "partition", "offset", "raw")
#: What tells one silver row from another in a backfill's figures: the event, and the bronze
#: batch and bucket it is held under.
ROW_KEY = ("team_id", "uuid", "event_time", "batch_id", "bucket")


def events_again(
    mapping: BucketMapping, horizon: timedelta, held: DataFrame | None
) -> Callable[[DataFrame], DataFrame]:
    """Bronze's event rows of a range -> its silver events under ``mapping`` and ``horizon`` (0:
    every copy kept): each event once, its first copy in :data:`LANDED_ORDER`, and none that
    silver holds from before the range within the horizon (``held``: silver's rows of the horizon
    before the range, which the backfill leaves as they are; None: none).

    Copies of one event share its event time (a sender resends the event as it was), so all of
    them fall in the range or none does."""

    def transform(rows: DataFrame) -> DataFrame:
        out = rows.transform(assign_buckets(mapping))
        if horizon:
            seen = recent_identities(held) if held is not None else None
            out = first_copies(out.transform(mark_repeats(seen, horizon, time="timestamp", order=LANDED_ORDER)))
        return out.transform(to_silver_events(mapping))

    return transform


def replaced_rows(key: Sequence[str], unit: str) -> Callable[[DataFrame], DataFrame]:
    """A table's change feed of a backfill's replace -> one row: the rows (told apart by ``key``)
    it removed, added and wrote again as they were (``<unit>_removed``, ``_added``, ``_unchanged``)."""

    def transform(changes: DataFrame) -> DataFrame:
        kind = F.col("_change_type")
        per_row = changes.groupBy(*key).agg(
            F.count_if(kind == "delete").alias("before"), F.count_if(kind == "insert").alias("after")
        )
        b, a = F.col("before"), F.col("after")

        def n(amount: Column) -> Column:
            return F.coalesce(F.sum(amount), F.lit(0)).cast("long")

        return per_row.agg(
            n(F.greatest(b - a, F.lit(0))).alias(f"{unit}_removed"),
            n(F.greatest(a - b, F.lit(0))).alias(f"{unit}_added"),
            n(F.least(a, b)).alias(f"{unit}_unchanged"),
        )

    return transform
