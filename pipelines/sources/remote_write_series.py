"""Remote-write series as Python values, and what a sender sends: :class:`Series`, the decoded
columns (:data:`~pipelines.sources.remote_write.SERIES_SCHEMA`) as Series and back, the compressed
body a client would send for them (:func:`encode`), and the stable id of a label set
(:func:`series_ids`). Decoding a body is :mod:`pipelines.sources.remote_write`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.sources import remote_write_pb2 as pb
from pipelines.sources.remote_write import SERIES_SCHEMA, SNAPPY, ZSTD, UnsupportedEncoding, relist

__all__ = [
    "Series",
    "SeriesIds",
    "encode",
    "from_series",
    "series_id",
    "series_ids",
    "to_series",
]


@dataclass(frozen=True, slots=True)
class Series:
    """One time series of a request.

    Decoded, ``labels`` are sorted by name; labels sharing a name (invalid, but not ours to drop)
    keep the order they were received in. ``timestamps_ms[i]`` and ``values[i]`` form one sample,
    in the order received. Encoding keeps NaN payload bits with protobuf's upb (default) and cpp
    backends; the pure-Python backend turns every NaN into the canonical one.
    """

    labels: tuple[tuple[str, str], ...]
    timestamps_ms: list[int]
    values: list[float]


def to_series(table: pa.Table) -> list[Series]:
    """The rows of a decoded request as :class:`Series` values (for tests and small requests)."""
    return [
        Series(tuple((label["name"], label["value"]) for label in labels), timestamps, values)
        for labels, timestamps, values in zip(*(table.column(c).to_pylist() for c in SERIES_SCHEMA.names), strict=True)
    ]


def from_series(series: Iterable[Series]) -> pa.Table:
    """:class:`Series` values as the decoded columns, labels in the order held (demo data, tests)."""
    rows = list(series)
    return pa.table(
        {
            "labels": [[{"name": n, "value": v} for n, v in s.labels] for s in rows],
            "timestamps_ms": [s.timestamps_ms for s in rows],
            "values": [s.values for s in rows],
        },
        schema=SERIES_SCHEMA,
    )


def encode(series: Iterable[Series], encoding: str = SNAPPY) -> bytes:
    """Build the compressed body a remote-write client would send for ``series``.

    Labels are written in the order they are held; a :class:`Series` from
    :func:`~pipelines.sources.remote_write.decode` already has them sorted as the spec asks of senders.
    """
    normalized = encoding.strip().lower()
    if normalized not in (SNAPPY, ZSTD):
        raise UnsupportedEncoding(f"cannot encode with {encoding!r}; expected snappy or zstd")
    request = pb.WriteRequest()
    # add() builds in place; constructing messages from keyword arguments copies each one into
    # its parent again and is about 2.5x slower.
    add_series = request.timeseries.add
    for s in series:
        message = add_series()
        add_label = message.labels.add
        for label_name, label_value in s.labels:
            add_label(name=label_name, value=label_value)
        add_sample = message.samples.add
        for timestamp, value in zip(s.timestamps_ms, s.values, strict=True):
            add_sample(value=value, timestamp=timestamp)
    raw = request.SerializeToString()
    if normalized == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(raw))
    # Level 3 is zstd's own default; cramjam's default of 11 costs several times the CPU for a
    # few percent on this kind of payload.
    return bytes(cramjam.zstd.compress(raw, level=3))


def series_id(labels: Sequence[tuple[str, str]]) -> int:
    """Stable signed 64-bit id of one label set; see :func:`series_ids`."""
    table = from_series([Series(tuple(labels), [], [])])
    return int(series_ids(table.column("labels").combine_chunks())[0].as_py())


def series_ids(labels: pa.ListArray) -> pa.Int64Array:
    """Stable signed 64-bit id of each label set, e.g. for partitioning and joins in the lakehouse.

    The id is the BLAKE2b-64 digest of ``name 0xFF value 0xFE`` for each label (UTF-8), taken in
    ``(name, value)`` order, read as a signed big-endian int64 (Spark's ``LongType``). It is
    independent of the order the labels are given in and depends only on the label strings, never
    on the process (unlike ``hash()``, which is salted per process), the platform or this
    library's version; the tests pin known values so a change to it cannot go unnoticed. 0xFF and
    0xFE never occur in UTF-8, so distinct label sets cannot collide by re-splitting the same
    bytes. Sorting by value as well as name keeps the id order-independent even for the invalid
    case of a repeated label name.

    The keys are built in Arrow; the digest is taken in Python once per distinct label set, so a
    batch of many requests from the same targets (the usual case: every scrape sends the same
    series again) hashes each series once.
    """
    names, values = (a.cast(pa.binary()) for a in labels.flatten().flatten())
    order = pc.sort_indices(
        pa.table({"set": pc.list_parent_indices(labels), "name": names, "value": values}),
        sort_keys=[("set", "ascending"), ("name", "ascending"), ("value", "ascending")],
    )
    pairs = pc.binary_join_element_wise(names.take(order), values.take(order), b"\xff")
    pieces = pc.binary_join_element_wise(pairs, pa.nulls(len(pairs), pa.binary()).fill_null(b""), b"\xfe")
    keys = pc.binary_join(relist(labels, pieces), b"").dictionary_encode()
    digests = b"".join(hashlib.blake2b(key, digest_size=8).digest() for key in keys.dictionary.to_pylist())
    distinct = np.frombuffer(digests, dtype=">i8").astype(np.int64)
    return pa.array(distinct[keys.indices.to_numpy(zero_copy_only=False)], pa.int64())


class SeriesIds:
    """:func:`series_ids` for a receiver, which sees the same series again every scrape: the ids of
    label sets it has seen come from memory, and only new ones are hashed.

    A label set is looked up by a key that is cheap to build in Arrow (its label count, then its
    names, then its values, in the order held), not by the digest's canonical bytes, which take a
    sort and a join per label. Two sets with different keys may still be one set (the same labels
    held in another order); each is then hashed the canonical way and gets the same id. Distinct
    sets never share a key: the names and values are UTF-8 (the decoder checks), so they hold
    neither separator, and the count says where the names end.

    Memory is bounded in bytes, whatever the labels: the keys held add up to at most ``max_bytes``
    (a 4-label set takes about 170 bytes with the dict's own cost, a 15-label one about 650), a
    key over :data:`MAX_KEY_BYTES` is never kept, and when the next keys would not fit the memory
    starts over. Not thread-safe: the receiver's flusher owns one.
    """

    #: A label set whose key is longer is hashed every time rather than kept.
    MAX_KEY_BYTES = 1024
    #: What the dict costs per entry beyond its key's bytes (the entry, the bytes and int objects).
    ENTRY_OVERHEAD = 120

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0
        self._ids: dict[bytes, int] = {}

    def __call__(self, labels: pa.ListArray) -> pa.Int64Array:
        keys = _lookup_keys(labels).to_pylist()
        known = self._ids
        found = list(map(known.get, keys))
        new = [i for i, id_ in enumerate(found) if id_ is None]
        if not new:
            return pa.array(found, pa.int64())
        ids = series_ids(labels.take(pa.array(new, pa.int64()))).to_pylist()
        for i, id_ in zip(new, ids, strict=True):
            found[i] = id_
            key = keys[i]
            size = len(key) + self.ENTRY_OVERHEAD
            if len(key) > self.MAX_KEY_BYTES or key in known:
                continue
            if self.held_bytes + size > self.max_bytes:
                known.clear()
                self.held_bytes = 0
                if size > self.max_bytes:
                    continue
            known[key] = id_
            self.held_bytes += size
        return pa.array(found, pa.int64())


def _lookup_keys(labels: pa.ListArray) -> pa.BinaryArray:
    """Per label set, ``<count> 0xFF <names joined by 0xFE> 0xFF <values joined by 0xFE>``."""
    names, values = (a.cast(pa.binary()) for a in labels.flatten().flatten())
    count = pc.cast(pc.list_value_length(labels).fill_null(0), pa.string()).cast(pa.binary())
    return pc.binary_join_element_wise(
        count, pc.binary_join(relist(labels, names), b"\xfe"), pc.binary_join(relist(labels, values), b"\xfe"), b"\xff"
    )
