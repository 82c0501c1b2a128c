"""Remote-write series -> bronze sample rows, in Arrow: what the receiver's write-ahead log holds
per request, and the rows its flusher appends to bronze/samples."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from bronze.samples import BRONZE_SAMPLES_SCHEMA
from pipelines.sources import remote_write as codec
from pipelines.sources.remote_write_series import series_ids
from pipelines.storage.conform import conform

SAMPLES_ARROW = to_arrow_schema(BRONZE_SAMPLES_SCHEMA, timezone="UTC")

#: What the write-ahead log holds per request: the decoded series (:data:`codec.SERIES_SCHEMA`)
#: and, per series, the request's arrival time, source and batch id. Labels are kept once per
#: series rather than once per sample, and the flusher builds sample rows for many requests at once.
WAL_SERIES_SCHEMA = (
    codec.SERIES_SCHEMA.append(pa.field("ingest_time", pa.timestamp("us", tz="UTC")))
    .append(pa.field("source", pa.string()))
    .append(pa.field("batch_id", pa.string()))
)


def request_series(series: pa.Table, source: str, batch_id: str, now: datetime) -> pa.Table:
    """One request's decoded series tagged with where and when they came from (:data:`WAL_SERIES_SCHEMA`)."""
    count = series.num_rows
    return pa.table(
        [
            *series.columns,
            pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), count),
            pa.repeat(pa.scalar(source, pa.string()), count),
            pa.repeat(pa.scalar(batch_id, pa.string()), count),
        ],
        schema=WAL_SERIES_SCHEMA,
    )


def sample_count(series: pa.Table) -> int:
    """Samples held by decoded series (the rows they become): what their lists' offsets span
    (the flusher counts every segment it reads, so this is kept to a few scalar reads)."""
    count = 0
    for lists in series.column("timestamps_ms").chunks:
        if lists.null_count:  # a null list's offsets may span values it does not hold
            count += pc.sum(pc.list_value_length(lists)).as_py() or 0
        elif len(lists):
            count += lists.offsets[-1].as_py() - lists.offsets[0].as_py()
    return count


def samples_of(series: pa.Table, ids: Callable[[pa.ListArray], pa.Int64Array] = series_ids) -> pa.Table:
    """Tagged series (:data:`WAL_SERIES_SCHEMA`, any number of requests) -> one row per sample in
    the bronze/samples layout; ``ids`` gives the series' ids (:func:`series_ids`, or a receiver's
    :class:`~pipelines.sources.remote_write_series.SeriesIds`, which remembers them).

    Per-series columns (name, labels, id, tags) are computed once per series and repeated per
    sample with Arrow's ``take``; nothing is built per sample in Python.
    """
    labels = series.column("labels").combine_chunks()
    names, values = labels.flatten().flatten()
    # A series' metric name is its last ``__name__`` label, as a dict of its labels would keep it.
    named = pc.equal(names, "__name__").to_numpy(zero_copy_only=False)
    owner = pc.list_parent_indices(labels).to_numpy()[named]
    last = np.flatnonzero(np.append(owner[1:] != owner[:-1], True)) if owner.size else owner
    position = np.full(len(series), -1, np.int64)
    position[owner[last]] = np.flatnonzero(named)[last]
    per_series = pa.table(
        {
            "metric_name": values.take(pa.array(position, mask=position < 0)),
            "labels": pa.MapArray.from_arrays(pc.subtract(labels.offsets, labels.offsets[0]), names, values),
            "series_id": ids(labels),
            "ingest_time": series.column("ingest_time").combine_chunks(),
            "source": series.column("source").combine_chunks(),
            "batch_id": series.column("batch_id").combine_chunks(),
        }
    )
    timestamps = series.column("timestamps_ms").combine_chunks()
    table = per_series.take(pc.list_parent_indices(timestamps))
    table = table.append_column("timestamp", pc.multiply(timestamps.flatten(), 1000).cast(pa.timestamp("us", tz="UTC")))
    table = table.append_column("value", series.column("values").combine_chunks().flatten())
    return conform(table, SAMPLES_ARROW)


def samples_table(series: pa.Table, source: str, batch_id: str, now: datetime) -> pa.Table:
    """Decoded series (:data:`codec.SERIES_SCHEMA`) of one request -> its rows in bronze/samples."""
    return samples_of(request_series(series, source, batch_id, now))
