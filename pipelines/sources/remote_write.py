"""Decoding layer of the Prometheus / VictoriaMetrics remote-write receiver.

A remote-write request is a protobuf ``prometheus.WriteRequest`` (Prometheus Remote-Write 1.0,
see ``remote_write.proto``), compressed with snappy's *block* format by Prometheus or with zstd by
VictoriaMetrics' vmagent. This module turns such a body into Arrow columns (:data:`SERIES_SCHEMA`,
what the receiver lands); :mod:`pipelines.sources.remote_write_series` holds the other direction
(Series values into a body, what a sender sends) and a label set's stable id.

It is deliberately pure (no I/O and no state; its parsers are built once, in
:mod:`pipelines.sources.remote_write_parsers`) and bounded, so the HTTP server can map every
outcome to a response without ever answering 5xx on bad input:

* every rejection is a :class:`RemoteWriteError` whose ``status`` is the HTTP status to answer
  (415 unsupported ``Content-Encoding``, 413 decoded body too large, 400 undecodable body), and
  nothing else escapes for any input bytes;
* the decoded size is bounded by ``max_decoded_bytes`` *before* memory is committed to it, so a
  small compressed "zip bomb" cannot make the receiver allocate the gigabytes it expands to.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.sources.remote_write_parsers import request_parser, shape_parser

__all__ = [
    "SERIES_SCHEMA",
    "SNAPPY",
    "ZSTD",
    "BodyTooLarge",
    "Limits",
    "OutOfRange",
    "RemoteWriteError",
    "UndecodableBody",
    "UnsupportedEncoding",
    "check_shape",
    "check_values",
    "decode",
    "decompress",
    "inline_size",
    "parse_write_request",
    "relist",
]

SNAPPY = "snappy"
ZSTD = "zstd"


class RemoteWriteError(ValueError):
    """A request the receiver must refuse; ``status`` is the HTTP status to answer with."""

    status: int = 400


class UnsupportedEncoding(RemoteWriteError):
    status = 415


class BodyTooLarge(RemoteWriteError):
    status = 413


class UndecodableBody(RemoteWriteError):
    status = 400


class OutOfRange(RemoteWriteError):
    """A sample whose timestamp lies outside :attr:`Limits.min_timestamp_ms` .. ``max_timestamp_ms``."""

    status = 400


#: The latest instant a microsecond (and a nanosecond) timestamp in int64 holds:
#: 2262-04-11T23:47:16.854Z, in milliseconds. Multiplying a later millisecond value by 1,000 could
#: still fit in int64, but nanosecond readers (pandas, Arrow's default) could not hold it.
MAX_TIMESTAMP_MS = (2**63 - 1) // 1_000_000


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may hold; anything over a limit is refused whole, never truncated.

    The decoded size is bounded by :func:`decompress` (its ``max_decoded_bytes``). The defaults
    are VictoriaMetrics' where it has one (``-maxLabelsPerTimeseries``, ``-maxLabelNameLen``,
    ``-maxLabelValueLen``); Prometheus' receiver sets none. Series and samples per request have
    no default in either: 100,000 series and 1,000,000 samples are 10x and 100x what vmagent
    (``-remoteWrite.maxRowsPerBlock``) and Prometheus (``max_samples_per_send``) send by default.
    Timestamps default to 1970-01-01 .. 2262-04-11, the range a nanosecond timestamp holds.
    """

    max_series: int = 100_000
    max_samples: int = 1_000_000
    max_labels_per_series: int = 30
    max_label_name_bytes: int = 256
    max_label_value_bytes: int = 4096
    min_timestamp_ms: int = 0
    max_timestamp_ms: int = MAX_TIMESTAMP_MS


#: A decoded request, one row per series: its labels, sorted by name (labels sharing a name keep
#: the order they were received in), then its samples in the order received. Values keep NaN as
#: received, payload bits included, because Prometheus marks staleness with one particular NaN.
SERIES_SCHEMA = pa.schema(
    [
        ("labels", pa.list_(pa.struct([("name", pa.string()), ("value", pa.string())]))),
        ("timestamps_ms", pa.list_(pa.int64())),
        ("values", pa.list_(pa.float64())),
    ]
)


def decompress(body: bytes, encoding: str | None, max_decoded_bytes: int) -> bytes:
    """Undo the ``Content-Encoding`` of a remote-write body, refusing to grow past ``max_decoded_bytes``.

    ``encoding`` is the raw header value; it is matched case-insensitively after stripping.
    Remote-write 1.0 makes snappy mandatory, so a missing, empty or ``identity`` encoding is
    refused like any unknown one rather than guessed at.
    """
    normalized = (encoding or "").strip().lower()
    if normalized == SNAPPY:
        return _snappy_block_decompress(body, max_decoded_bytes)
    if normalized == ZSTD:
        return _zstd_decompress(body, max_decoded_bytes)
    if not normalized:
        raise UnsupportedEncoding("remote write requires Content-Encoding: snappy (or zstd); none given")
    raise UnsupportedEncoding(f"unsupported Content-Encoding {encoding!r}; expected snappy or zstd")


def parse_write_request(raw: bytes) -> pa.Table:
    """Parse an uncompressed ``WriteRequest`` into columns, one row per series (:data:`SERIES_SCHEMA`).

    ptars reads the protobuf wire format straight into Arrow builders in Rust, so no Python
    object is made per series or sample. It reads only what is returned (each series' labels and
    samples): exemplars, native histograms and metadata are skipped as unknown fields, their
    framing checked but not their contents. Labels are then sorted by name within each series,
    stably, in Arrow.
    """
    labels, timestamps, values = _parse(raw)
    return _series_table(labels, timestamps, values)


def _parse(raw: bytes) -> tuple[pa.ListArray, pa.ListArray, pa.ListArray]:
    """A request's labels, timestamps and values, one list of each per series, as received."""
    try:
        batch = request_parser().list_to_record_batch([raw])
    # ptars raises ValueError for malformed bytes and invalid UTF-8 in a string field; a panic in
    # its Rust code would surface as pyo3's PanicException, which is not an Exception subclass.
    except BaseException as exc:
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise UndecodableBody(f"body is not a prometheus.WriteRequest: {exc}") from exc
    series = _items(batch.column(0))  # one message: the request's timeseries, in order
    labels, samples = series.field("labels"), series.field("samples")
    pairs, points = _items(labels), _items(samples)
    return (
        pa.ListArray.from_arrays(_offsets(labels), _label_items(pairs.field("name"), pairs.field("value"))),
        pa.ListArray.from_arrays(_offsets(samples), points.field("timestamp")),
        pa.ListArray.from_arrays(_offsets(samples), points.field("value")),
    )


def _items(lists: pa.ListArray) -> pa.Array:
    """Every item of ``lists`` in order, for lists without nulls (protobuf's repeated fields, as
    ptars builds them): its values array as is where the lists cover exactly that, without the
    copy or the Python of ``flatten``; ``flatten`` of a slice otherwise."""
    offsets = lists.offsets
    if lists.offset == 0 and lists.null_count == 0 and offsets[0].as_py() == 0:
        values = lists.values
        if offsets[-1].as_py() == len(values):
            return values
    return lists.flatten()


def _offsets(lists: pa.ListArray) -> pa.Array:
    """``lists``' offsets, rebased to start at 0."""
    offsets = lists.offsets
    return pc.subtract(offsets, offsets[0]) if offsets[0].as_py() else offsets


def _label_items(names: pa.Array, values: pa.Array) -> pa.StructArray:
    return pa.StructArray.from_arrays([names, values], fields=list(SERIES_SCHEMA.field("labels").type.value_type))


def _series_table(labels: pa.ListArray, timestamps: pa.ListArray, values: pa.ListArray) -> pa.Table:
    """The decoded columns, labels sorted by name within each series (Arrow's sort is stable)."""
    pairs = labels.values
    names = pairs.field("name")
    if not _sorted_within(labels, names):  # senders are asked to sort; most do
        order = pc.sort_indices(
            pa.table({"series": pc.list_parent_indices(labels), "name": names}),
            sort_keys=[("series", "ascending"), ("name", "ascending")],
        )
        labels = pa.ListArray.from_arrays(labels.offsets, pairs.take(order))
    return pa.Table.from_arrays([labels, timestamps, values], schema=SERIES_SCHEMA)


def _sorted_within(labels: pa.ListArray, names: pa.Array) -> bool:
    """Whether each series' label names are in ascending order already (``labels``' offsets
    start at 0 and ``names`` are its items): any name less than the one before it must start
    a series."""
    if len(names) < 2:
        return True
    descending = pc.less(names[1:], names[:-1]).to_numpy(zero_copy_only=False)
    starts = labels.offsets.to_numpy()[1:-1]
    descending[starts[(starts > 0) & (starts < len(names))] - 1] = False
    return not descending.any()


def decode(body: bytes, encoding: str | None, max_decoded_bytes: int, limits: Limits | None = None) -> pa.Table:
    """Decompress and parse a remote-write body; the only exceptions are :class:`RemoteWriteError`.

    With ``limits``, the request's shape is checked before it is parsed (:func:`check_shape`: no
    parse allocates for more series, labels or samples than the limits allow) and its labels and
    timestamps after (:func:`check_values`), before its labels are sorted.
    """
    raw = decompress(body, encoding, max_decoded_bytes)
    if limits is not None:
        check_shape(raw, limits)
    labels, timestamps, values = _parse(raw)
    if limits is not None:
        _check_values(labels, timestamps, limits)
    return _series_table(labels, timestamps, values)


# Every series, label and sample of a WriteRequest starts with a tag byte of 0x0a (field 1, length
# delimited: a series, a label, a label's name) or 0x12 (field 2: a sample, a label's value), so
# these bytes bound how many entries a body can make the parser allocate. Under this bound a body
# is parsed straight away (ordinary requests hold a few thousand); over it, its shape is counted
# first, which costs about 12 bytes per entry instead of the full parse's 45.
_SHAPE_CHECK_ABOVE_ENTRIES = 200_000


def check_shape(raw: bytes, limits: Limits) -> None:
    """Refuse (413) an uncompressed request with more series, samples, or labels per series than
    ``limits`` allow, without parsing it into memory first."""
    # Each entry takes at least two bytes (its tag and its length), so a body of up to 400 KB needs
    # no count: the usual one, of a few thousand samples, is not scanned twice.
    if len(raw) // 2 <= _SHAPE_CHECK_ABOVE_ENTRIES:
        return
    if raw.count(b"\x0a") + raw.count(b"\x12") <= _SHAPE_CHECK_ABOVE_ENTRIES:
        return
    try:
        batch = shape_parser().list_to_record_batch([raw])
    except BaseException as exc:  # as in _parse
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise UndecodableBody(f"body is not a prometheus.WriteRequest: {exc}") from exc
    series = batch.column(0).flatten()
    _check_counts(series.field("labels"), series.field("samples"), limits)


def _check_counts(labels: pa.ListArray, samples: pa.ListArray, limits: Limits) -> None:
    """413 for more series, samples, or labels in a series, than ``limits`` allow; ``labels`` and
    ``samples`` hold one list per series."""
    if len(labels) > limits.max_series:
        raise BodyTooLarge(f"request holds {len(labels)} series; the limit is {limits.max_series}")
    count = pc.sum(pc.list_value_length(samples)).as_py() or 0
    if count > limits.max_samples:
        raise BodyTooLarge(f"request holds {count} samples; the limit is {limits.max_samples}")
    most = pc.max(pc.list_value_length(labels)).as_py() or 0
    if most > limits.max_labels_per_series:
        raise BodyTooLarge(f"a series has {most} labels; the limit is {limits.max_labels_per_series}")


def check_values(series: pa.Table, limits: Limits) -> None:
    """Refuse a parsed request (:data:`SERIES_SCHEMA`) whose labels exceed ``limits`` (413) or whose
    timestamps fall outside them (400, naming the range)."""
    _check_values(series.column("labels").combine_chunks(), series.column("timestamps_ms").combine_chunks(), limits)


def _check_values(labels: pa.ListArray, timestamps_by_series: pa.ListArray, limits: Limits) -> None:
    _check_counts(labels, timestamps_by_series, limits)
    pairs = labels.flatten()
    for what, strings, limit in (
        ("name", pairs.field("name"), limits.max_label_name_bytes),
        ("value", pairs.field("value"), limits.max_label_value_bytes),
    ):
        longest = pc.max(pc.binary_length(strings)).as_py() or 0
        if longest > limit:
            raise BodyTooLarge(f"a label {what} is {longest} bytes long; the limit is {limit} bytes")
    timestamps = timestamps_by_series.flatten()
    if len(timestamps):
        low, high = (v.as_py() for v in pc.min_max(timestamps).values())
        if low < limits.min_timestamp_ms or high > limits.max_timestamp_ms:
            bad = low if low < limits.min_timestamp_ms else high
            raise OutOfRange(
                f"sample timestamp {bad} ms is outside the accepted range {limits.min_timestamp_ms} .. "
                f"{limits.max_timestamp_ms} ms ({_iso(limits.min_timestamp_ms)} .. {_iso(limits.max_timestamp_ms)})"
            )


def _iso(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    return f"{np.datetime64(seconds, 's')}.{millis:03d}Z"


def relist(lists: pa.ListArray, flat: pa.Array) -> pa.ListArray:
    """``flat`` (as many items as ``lists`` holds, in order) cut into the lists ``lists`` has."""
    if lists.null_count == 0:  # protobuf's repeated fields, always: its offsets, rebased to 0
        return pa.ListArray.from_arrays(_offsets(lists), flat)
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


# The snappy block format starts with the decoded length as a little-endian base-128 varint;
# the format caps that length at 2**32 - 1, i.e. at most five bytes.
_SNAPPY_MAX_HEADER_BYTES = 5


def _snappy_block_decompress(body: bytes, max_decoded_bytes: int) -> bytes:
    declared = _snappy_declared_length(body)
    if declared > max_decoded_bytes:
        raise BodyTooLarge(f"snappy body declares {declared} decoded bytes; the limit is {max_decoded_bytes}")
    try:
        # decompress_raw allocates exactly the declared length, which is bounded above, and fails
        # if the data does not decode to exactly that many bytes.
        return bytes(cramjam.snappy.decompress_raw(body))
    # cramjam documents no exception contract; whatever it raises, the bytes were the problem.
    except Exception as exc:
        raise UndecodableBody(f"body is not valid snappy block-format data: {exc}") from exc


def inline_size(body: bytes, encoding: str | None) -> float:
    """What a body will decode to, where its encoding binds it: a snappy body's declared length
    (decoding fails unless it is exact); infinity for anything else (a zstd frame's declared size
    is optional and may lie) and for a malformed header (the decoder will say why)."""
    if (encoding or "").strip().lower() != SNAPPY:
        return math.inf
    try:
        return _snappy_declared_length(body)
    except UndecodableBody:
        return math.inf


def _snappy_declared_length(body: bytes) -> int:
    length = 0
    for index, byte in enumerate(body[:_SNAPPY_MAX_HEADER_BYTES]):
        length |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            return length
    if len(body) < _SNAPPY_MAX_HEADER_BYTES:
        raise UndecodableBody("snappy body is truncated inside its length header")
    raise UndecodableBody("snappy length header is longer than five bytes")


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Message of Rust's io::ErrorKind::WriteZero, which cramjam reports when the output buffer is full.
_ZSTD_OUTPUT_FULL = "failed to write whole buffer"


def _zstd_decompress(body: bytes, max_decoded_bytes: int) -> bytes:
    declared = _zstd_declared_content_size(body)
    if declared is not None and declared > max_decoded_bytes:
        raise BodyTooLarge(f"zstd frame declares {declared} decoded bytes; the limit is {max_decoded_bytes}")
    # The declared size is optional (streaming encoders omit it), covers one frame only and may lie,
    # so the real bound is the output buffer: one byte more than allowed, to tell "exactly at the
    # limit" from "over it". An anonymous mmap is zero-filled lazily by the kernel, so only the
    # pages actually written cost memory, unlike bytearray(n), which memsets all n bytes up front.
    capacity = max(max_decoded_bytes, 0) + 1
    with mmap.mmap(-1, capacity) as out:
        try:
            written = cramjam.zstd.decompress_into(body, out)
        except Exception as exc:
            if _ZSTD_OUTPUT_FULL in str(exc):
                raise BodyTooLarge(f"zstd body decodes to more than {max_decoded_bytes} bytes") from exc
            raise UndecodableBody(f"body is not valid zstd data: {exc}") from exc
        if written > max_decoded_bytes:
            raise BodyTooLarge(f"zstd body decodes to more than {max_decoded_bytes} bytes")
        with memoryview(out) as view:
            return bytes(view[:written])


def _zstd_declared_content_size(body: bytes) -> int | None:
    """Frame_Content_Size of the first zstd frame (RFC 8878, 3.1.1.1), if it declares one."""
    if len(body) < 5 or body[:4] != _ZSTD_MAGIC:
        return None
    descriptor = body[4]
    single_segment = descriptor & 0x20
    size_flag = descriptor >> 6
    field_size = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if field_size == 0:
        return None
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03]
    field = body[start : start + field_size]
    if len(field) < field_size:
        return None  # truncated header: let the decoder report it as corrupt
    size = int.from_bytes(field, "little")
    # A two-byte field stores the size minus 256, so sizes 256..65791 fit in it.
    return size + 256 if field_size == 2 else size
