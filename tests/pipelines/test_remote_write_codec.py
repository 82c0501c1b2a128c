"""The remote-write codec: round trips, the wire format, and the "never a 5xx" guarantee on bad input."""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from operator import itemgetter

import cramjam
import pytest
from google.protobuf.internal import api_implementation
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sources import remote_write_pb2 as pb
from pipelines.sources.remote_write import (
    SERIES_SCHEMA,
    SNAPPY,
    ZSTD,
    BodyTooLarge,
    RemoteWriteError,
    UndecodableBody,
    UnsupportedEncoding,
    decode,
    decompress,
    inline_size,
    parse_write_request,
)
from pipelines.sources.remote_write_series import (
    Series,
    SeriesIds,
    encode,
    from_series,
    series_id,
    series_ids,
    to_series,
)

MB = 1 << 20
FUZZ = settings(max_examples=300, deadline=None)
ROUND_TRIP = settings(max_examples=150, deadline=None)

# Prometheus marks a series stale with this exact NaN (value.StaleNaN); receivers must not
# normalise it to the default NaN, or staleness is lost downstream.
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]

label_text = st.text(max_size=12)  # unicode, empty, and "__name__"-like strings alike
labels_strategy = st.lists(st.tuples(label_text, label_text), max_size=6)
sample_strategy = st.tuples(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True) | st.just(STALE_NAN),
)


@st.composite
def series_strategy(draw: st.DrawFn) -> Series:
    samples = draw(st.lists(sample_strategy, max_size=6))
    return Series(
        labels=tuple(draw(labels_strategy)),
        timestamps_ms=[ts for ts, _ in samples],
        values=[value for _, value in samples],
    )


def same_floats(left: Sequence[float], right: Sequence[float]) -> bool:
    """Element-wise equality where any NaN matches any NaN."""
    return len(left) == len(right) and all(
        math.isnan(b) if math.isnan(a) else a == b for a, b in zip(left, right, strict=True)
    )


def assert_same_series(decoded: Sequence[Series], sent: Sequence[Series]) -> None:
    assert len(decoded) == len(sent)
    for got, want in zip(decoded, sent, strict=True):
        assert got.labels == tuple(sorted(want.labels, key=itemgetter(0)))
        assert got.timestamps_ms == want.timestamps_ms
        assert same_floats(got.values, want.values), (got.values, want.values)


def decoded(body: bytes, encoding: str | None, max_decoded_bytes: int) -> list[Series]:
    return to_series(decode(body, encoding, max_decoded_bytes))


def snappy(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


UP = Series(labels=(("__name__", "up"), ("job", "node")), timestamps_ms=[1_000, 2_000], values=[1.0, 0.0])


# --- round trips ---------------------------------------------------------------------------------


@ROUND_TRIP
@given(series=st.lists(series_strategy(), max_size=5))
def test_snappy_round_trip_preserves_labels_timestamps_and_values(series: list[Series]) -> None:
    assert_same_series(decoded(encode(series, SNAPPY), SNAPPY, 16 * MB), series)


@ROUND_TRIP
@given(series=st.lists(series_strategy(), max_size=5))
def test_zstd_round_trip_preserves_labels_timestamps_and_values(series: list[Series]) -> None:
    assert_same_series(decoded(encode(series, ZSTD), ZSTD, 16 * MB), series)


@pytest.mark.skipif(
    api_implementation.Type() == "python",
    reason="the pure-Python protobuf backend canonicalises NaN payloads; upb and cpp keep them",
)
def test_nan_and_the_staleness_marker_survive_bit_for_bit() -> None:
    sent = Series((("__name__", "x"),), [1, 2, 3], [math.nan, STALE_NAN, -math.inf])
    (got,) = decoded(encode([sent]), SNAPPY, MB)
    assert math.isnan(got.values[0]) and math.isnan(got.values[1])
    assert struct.pack("<d", got.values[1]) == struct.pack("<d", STALE_NAN)
    assert got.values[2] == -math.inf


def test_labels_come_back_sorted_by_name() -> None:
    sent = Series((("zone", "a"), ("__name__", "up"), ("job", "node")), [1], [1.0])
    (got,) = decoded(encode([sent]), SNAPPY, MB)
    assert got.labels == (("__name__", "up"), ("job", "node"), ("zone", "a"))


def test_repeated_label_names_keep_their_received_order() -> None:
    sent = Series((("b", "2"), ("a", "z"), ("b", "1"), ("", "empty name")), [], [])
    (got,) = decoded(encode([sent]), SNAPPY, MB)
    assert got.labels == (("", "empty name"), ("a", "z"), ("b", "2"), ("b", "1"))


def test_series_without_a_metric_name_is_still_returned() -> None:
    sent = Series(labels=(("job", "node"),), timestamps_ms=[5], values=[2.5])
    assert decoded(encode([sent]), SNAPPY, MB) == [sent]


def test_empty_request_decodes_to_no_series() -> None:
    assert decoded(encode([], SNAPPY), SNAPPY, MB) == []
    assert decoded(encode([], ZSTD), ZSTD, MB) == []


def test_content_encoding_is_matched_case_insensitively_and_stripped() -> None:
    assert decoded(encode([UP], SNAPPY), " Snappy\t", MB) == [UP]
    assert decoded(encode([UP], ZSTD), "ZSTD ", MB) == [UP]


def test_hand_written_spec_bytes_decode_so_field_numbers_match_prompb() -> None:
    # Built byte by byte from the spec's field numbers, not with the generated code, so a drift of
    # remote_write.proto away from prompb cannot hide behind a symmetric encode/decode.
    def field(number: int, wire_type: int, payload: bytes) -> bytes:
        if wire_type == 2:  # length-delimited; every payload here is shorter than 128 bytes
            payload = bytes([len(payload)]) + payload
        return bytes([number << 3 | wire_type]) + payload

    label = field(1, 2, b"__name__") + field(2, 2, b"up")
    sample = field(1, 1, struct.pack("<d", 1.5)) + field(2, 0, b"\xe8\x07")  # timestamp 1000 as varint
    body = field(1, 2, field(1, 2, label) + field(2, 2, sample))
    assert to_series(parse_write_request(body)) == [Series((("__name__", "up"),), [1000], [1.5])]


def test_metadata_exemplars_and_native_histograms_are_skipped() -> None:
    exemplar = pb.Exemplar(labels=[pb.Label(name="trace_id", value="abc")], value=0.2, timestamp=7)
    request = pb.WriteRequest(
        timeseries=[
            pb.TimeSeries(
                labels=[pb.Label(name="__name__", value="rpc_seconds")],
                samples=[pb.Sample(value=3.0, timestamp=7)],
                exemplars=[exemplar],
                histograms=[
                    pb.Histogram(
                        count_int=3,
                        sum=0.6,
                        schema=3,
                        positive_spans=[pb.BucketSpan(offset=-2, length=2)],
                        positive_deltas=[1, 1],
                        timestamp=7,
                    )
                ],
            )
        ],
        metadata=[
            pb.MetricMetadata(
                type=pb.MetricMetadata.HISTOGRAM,
                metric_family_name="rpc_seconds",
                help="RPC latency",
                unit="seconds",
            )
        ],
    )
    assert decoded(snappy(request.SerializeToString()), SNAPPY, MB) == [
        Series((("__name__", "rpc_seconds"),), [7], [3.0])
    ]


# --- series_id -----------------------------------------------------------------------------------


@given(labels=st.lists(st.tuples(label_text, label_text), max_size=8), data=st.data())
@settings(max_examples=200, deadline=None)
def test_series_id_is_independent_of_label_order(labels: list[tuple[str, str]], data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(labels))
    assert series_id(shuffled) == series_id(labels)
    assert -(2**63) <= series_id(labels) < 2**63


def test_series_id_is_pinned_across_processes_and_versions() -> None:
    # These literals pin the hash (BLAKE2b-64 of name 0xFF value 0xFE..., signed big-endian). Ids are
    # stored in the lakehouse, so if this test fails the change breaks every existing table: do not
    # update the numbers, restore the function.
    assert series_id([("__name__", "up"), ("job", "node")]) == -8416610789007386287
    assert series_id([]) == -1970711489451281740
    unicode_labels = [("ключ", "värde 🌍"), ("__name__", "http_requests_total")]
    assert series_id(unicode_labels) == -2923118524067484384


def test_series_id_tells_apart_label_sets_that_concatenate_alike() -> None:
    assert series_id([("ab", "c")]) != series_id([("a", "bc")])
    assert series_id([("a", "")]) != series_id([("", "a")])
    assert series_id([("a", "b")]) != series_id([("a", "b"), ("", "")])


# --- rejections and their HTTP statuses ----------------------------------------------------------


def test_each_error_carries_the_http_status_to_answer() -> None:
    assert (UnsupportedEncoding.status, BodyTooLarge.status, UndecodableBody.status) == (415, 413, 400)
    for error in (UnsupportedEncoding, BodyTooLarge, UndecodableBody):
        assert issubclass(error, RemoteWriteError) and issubclass(error, ValueError)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "snappy-framed", "snappy, gzip", "x-snappy"])
def test_unknown_encoding_is_unsupported_media_type(encoding: str) -> None:
    with pytest.raises(UnsupportedEncoding) as caught:
        decode(encode([UP]), encoding, MB)
    assert caught.value.status == 415


@pytest.mark.parametrize("encoding", [None, "", "  ", "identity"])
def test_missing_or_identity_encoding_is_unsupported_because_snappy_is_mandatory(
    encoding: str | None,
) -> None:
    raw = pb.WriteRequest().SerializeToString()
    with pytest.raises(UnsupportedEncoding) as caught:
        decode(raw, encoding, MB)
    assert caught.value.status == 415


def test_truncated_snappy_is_a_bad_request() -> None:
    body = encode([UP] * 20, SNAPPY)
    for cut in (len(body) - 1, len(body) // 2, 1, 0):
        with pytest.raises(UndecodableBody) as caught:
            decode(body[:cut], SNAPPY, MB)
        assert caught.value.status == 400


def test_snappy_length_header_longer_than_five_bytes_is_a_bad_request() -> None:
    with pytest.raises(UndecodableBody):
        decompress(b"\x80\x80\x80\x80\x80\x01", SNAPPY, MB)


def test_valid_snappy_wrapping_garbage_protobuf_is_a_bad_request() -> None:
    # Field 1 (timeseries) claims 16 bytes but only 3 follow.
    with pytest.raises(UndecodableBody) as caught:
        decode(snappy(b"\x0a\x10abc"), SNAPPY, MB)
    assert caught.value.status == 400


def test_invalid_utf8_in_a_label_is_a_bad_request() -> None:
    label = b"\x0a\x01\xff"  # name = one byte that is not UTF-8
    timeseries = b"\x0a" + bytes([len(label) + 2]) + b"\x0a" + bytes([len(label)]) + label
    with pytest.raises(UndecodableBody):
        decode(snappy(timeseries), SNAPPY, MB)


def test_zstd_bomb_with_declared_size_is_rejected_as_too_large() -> None:
    bomb = bytes(cramjam.zstd.compress(bytes(50 * MB)))
    assert len(bomb) < 10_000
    with pytest.raises(BodyTooLarge) as caught:
        decode(bomb, ZSTD, MB)
    assert caught.value.status == 413


def test_zstd_bomb_without_declared_size_is_rejected_as_too_large() -> None:
    # A streaming encoder does not know the size up front and leaves it out of the frame header,
    # so only the bounded output buffer can stop this one.
    compressor = cramjam.zstd.Compressor()
    compressor.compress(bytes(50 * MB))
    bomb = bytes(compressor.finish())
    with pytest.raises(BodyTooLarge) as caught:
        decode(bomb, ZSTD, MB)
    assert caught.value.status == 413


@pytest.mark.parametrize("streaming", [False, True])
def test_zstd_limit_is_inclusive(streaming: bool) -> None:
    def compress(raw: bytes) -> bytes:
        if not streaming:
            return bytes(cramjam.zstd.compress(raw))
        compressor = cramjam.zstd.Compressor()
        compressor.compress(raw)
        return bytes(compressor.finish())

    payload = b"\x01" * 1000
    assert decompress(compress(payload), ZSTD, 1000) == payload
    with pytest.raises(BodyTooLarge):
        decompress(compress(payload), ZSTD, 999)
    assert decompress(compress(b""), ZSTD, 0) == b""


def test_corrupt_zstd_is_a_bad_request() -> None:
    body = encode([UP] * 20, ZSTD)
    for corrupt in (body[:-3], body[:4], b"", b"not zstd at all", body[:10] + b"\x00" * 20):
        with pytest.raises(UndecodableBody):
            decode(corrupt, ZSTD, MB)


def test_snappy_header_declaring_a_huge_length_is_rejected_as_too_large() -> None:
    # 0xFFFFFFFF as a uvarint, followed by a few bytes that could never expand to that.
    with pytest.raises(BodyTooLarge) as caught:
        decode(b"\xff\xff\xff\xff\x0f" + b"\x00" * 8, SNAPPY, 64 * MB)
    assert caught.value.status == 413


def test_snappy_limit_is_inclusive() -> None:
    payload = b"\x07" * 1000
    assert decompress(snappy(payload), SNAPPY, 1000) == payload
    with pytest.raises(BodyTooLarge):
        decompress(snappy(payload), SNAPPY, 999)


def test_encode_refuses_an_unknown_encoding_and_mismatched_samples() -> None:
    with pytest.raises(UnsupportedEncoding):
        encode([UP], "gzip")
    with pytest.raises(ValueError):
        encode([Series((("a", "b"),), [1, 2], [1.0])])


# --- fuzzing: whatever the bytes, the answer is a list or a RemoteWriteError ---------------------

ENCODINGS = st.sampled_from(["snappy", "zstd", "gzip", None, "SNAPPY"])


def decode_or_reject(body: bytes, encoding: str | None, max_decoded_bytes: int = MB) -> list[Series] | None:
    """Run decode; a RemoteWriteError is an accepted answer, any other exception fails the test."""
    try:
        result = decode(body, encoding, max_decoded_bytes)
    except RemoteWriteError as exc:
        assert exc.status in (400, 413, 415)
        return None
    assert result.schema == SERIES_SCHEMA
    return to_series(result)


@FUZZ
@given(body=st.binary(max_size=512), encoding=ENCODINGS)
def test_arbitrary_bytes_never_raise_anything_but_remote_write_errors(
    body: bytes,
    encoding: str | None,
) -> None:
    decode_or_reject(body, encoding)


@FUZZ
@given(raw=st.binary(max_size=512), encoding=st.sampled_from([SNAPPY, ZSTD]))
def test_valid_compression_around_arbitrary_bytes_never_escapes_the_protobuf_parser(
    raw: bytes,
    encoding: str,
) -> None:
    body = snappy(raw) if encoding == SNAPPY else bytes(cramjam.zstd.compress(raw))
    decode_or_reject(body, encoding)


@FUZZ
@given(
    series=st.lists(series_strategy(), min_size=1, max_size=3),
    encoding=st.sampled_from([SNAPPY, ZSTD]),
    data=st.data(),
)
def test_mutated_valid_bodies_never_raise_anything_but_remote_write_errors(
    series: list[Series], encoding: str, data: st.DataObject
) -> None:
    body = bytearray(encode(series, encoding))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
        body[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(body)))
    decode_or_reject(bytes(body[:cut]), encoding, max_decoded_bytes=data.draw(st.sampled_from([64, MB])))


@FUZZ
@given(raw=st.binary(max_size=512))
def test_parse_write_request_on_arbitrary_bytes_returns_series_or_undecodable(raw: bytes) -> None:
    try:
        result = parse_write_request(raw)
    except UndecodableBody:
        return
    assert result.schema == SERIES_SCHEMA


# --- the columnar parser against protobuf's own (upb) --------------------------------------------


def upb_series(raw: bytes) -> list[Series] | None:
    """The request as protobuf's upb parser reads it, labels sorted stably by name; None if it refuses."""
    request = pb.WriteRequest()
    try:
        request.ParseFromString(raw)
    except Exception:
        return None
    return [
        Series(
            tuple(sorted(((label.name, label.value) for label in ts.labels), key=itemgetter(0))),
            [sample.timestamp for sample in ts.samples],
            [sample.value for sample in ts.samples],
        )
        for ts in request.timeseries
    ]


@FUZZ
@given(series=st.lists(series_strategy(), max_size=4), data=st.data())
def test_the_columnar_parser_reads_what_upb_reads(series: list[Series], data: st.DataObject) -> None:
    """On valid requests, and on mutated ones both parsers accept, the two give the same series."""
    raw = bytearray(bytes(cramjam.snappy.decompress_raw(encode(series))))
    if raw and data.draw(st.booleans()):
        for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
            raw[data.draw(st.integers(min_value=0, max_value=len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    expected = upb_series(bytes(raw))
    try:
        got = to_series(parse_write_request(bytes(raw)))
    except UndecodableBody:
        assert expected is None or raw != bytearray(bytes(cramjam.snappy.decompress_raw(encode(series))))
        return
    if expected is not None:
        assert len(got) == len(expected)
        for mine, theirs in zip(got, expected, strict=True):
            assert (mine.labels, mine.timestamps_ms) == (theirs.labels, theirs.timestamps_ms)
            assert [struct.pack("<d", v) for v in mine.values] == [struct.pack("<d", v) for v in theirs.values]


def test_series_ids_of_many_label_sets_match_each_set_alone() -> None:
    sets = [
        (("__name__", "up"), ("job", "node")),
        (("job", "node"), ("__name__", "up")),
        (),
        (("a", "2"), ("a", "1")),
        (("a", "1"), ("a", "2")),
        (("é", "ß"), ("a", "")),
    ]
    ids = series_ids(from_series([Series(labels, [], []) for labels in sets]).column("labels").combine_chunks())
    assert ids.to_pylist() == [series_id(labels) for labels in sets]
    assert ids[0] == ids[1] and ids[3] == ids[4] and len(set(ids.to_pylist())) == 4


def test_a_body_s_size_for_the_event_loop_is_what_snappy_declares_and_unknown_otherwise() -> None:
    raw = b"x" * 70_000
    assert inline_size(bytes(cramjam.snappy.compress_raw(raw)), " Snappy ") == 70_000
    assert inline_size(bytes(cramjam.zstd.compress(raw)), "zstd") == math.inf  # may lie
    assert inline_size(b"\xff\xff\xff\xff\xff\xff", "snappy") == math.inf  # malformed: decoded on a worker
    assert inline_size(b"", None) == math.inf


def blake2b_model(labels: tuple[tuple[str, str], ...]) -> int:
    """The id as its docstring defines it, written out independently: BLAKE2b-64 of
    ``name 0xFF value 0xFE`` per label in (name, value) order, a signed big-endian int64."""
    key = b"".join(n.encode() + b"\xff" + v.encode() + b"\xfe" for n, v in sorted(labels))
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big", signed=True)


@given(
    batches=st.lists(
        st.lists(st.lists(st.tuples(label_text, label_text), max_size=4).map(tuple), max_size=6), min_size=1, max_size=4
    ),
    max_bytes=st.integers(min_value=100, max_value=1_000),
)
@settings(max_examples=150, deadline=None)
def test_series_ids_remembered_by_a_receiver_are_the_ids_of_their_label_sets(
    batches: list[list[tuple[tuple[str, str], ...]]], max_bytes: int
) -> None:
    # One cache over several batches (as a receiver's flusher keeps it), small enough to start over.
    remembered = SeriesIds(max_bytes=max_bytes)
    for sets in batches:
        labels = from_series([Series(labels, [], []) for labels in sets]).column("labels").combine_chunks()
        assert remembered(labels).to_pylist() == [blake2b_model(labels) for labels in sets]
        assert remembered.held_bytes <= max_bytes


def test_series_ids_remembered_stay_within_their_bytes_and_skip_long_label_sets() -> None:
    remembered = SeriesIds(max_bytes=10_000)
    sets = [(("__name__", "m"), ("i", str(i))) for i in range(500)]  # about 140 bytes each
    long = (("__name__", "m"), ("v", "x" * 4000))
    labels = from_series([Series(s, [], []) for s in [*sets, long]]).column("labels").combine_chunks()
    for _ in range(2):
        assert remembered(labels).to_pylist() == [blake2b_model(s) for s in [*sets, long]]
        assert 0 < remembered.held_bytes <= 10_000


def test_series_ids_remembered_tell_apart_sets_whose_keys_could_run_together() -> None:
    sets = [
        (),
        (("", ""),),
        (("", ""), ("", "")),
        (("a", "b"),),
        (("a", "b"), ("c", "d")),
        (("c", "d"), ("a", "b")),  # the same set in another order: another key, the same id
        (("a\u00fe", "b"),),  # þ is U+00FE: its UTF-8 bytes are not the separator
        (("a", "\u00feb"),),
    ]
    remembered = SeriesIds()
    for _ in range(2):  # hashed, then remembered
        labels = from_series([Series(labels, [], []) for labels in sets]).column("labels").combine_chunks()
        assert remembered(labels).to_pylist() == [blake2b_model(labels) for labels in sets]
