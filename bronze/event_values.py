"""Product events parsed where they arrive: Kafka message values -> bronze event rows in Arrow,
without a Spark job, for the messages whose outcome is certain.

:func:`bronze.events.parse_events` (Spark) defines what a bronze event is. This parser accepts a
message only when it can be sure Spark would accept it with the same fields and the same property
documents, and *defers* every other message to that parser, so every quarantine reason still comes
from one place. It accepts:

- UTF-8 text starting with ``{`` holding one JSON object, with no key twice in any object, no
  ``NaN``/``Infinity``, no integer of more than 18 digits, no number that overflows a double and
  no escaped surrogate (``\\ud83d``: Spark reads a lone one otherwise than Python);
- ``uuid``, ``event`` (non-empty), ``distinct_id`` and ``timestamp`` strings and an integer
  ``team_id``; a ``uuid`` matching :data:`bronze.events.UUID_PATTERN` in full; a ``timestamp`` of
  the form ``YYYY-MM-DDTHH:MM:SS[.ffffff](Z|+HH:MM|-HH:MM)`` that is a real time;
- ``properties`` and ``person_properties`` absent, null, an object, or a string holding an object;
- in serde_json's notation, no negative zero (Spark reads its sign from the message's text);
  inside a nested value (an object or array a property holds), no number with an exponent or with
  more digits than a decimal holds (Spark writes those as Java writes a double).

Each event is parsed once, by the stdlib's C scanner; its property documents
(:mod:`bronze.properties`) are built from that parse, their numbers in their canonical text
(:mod:`bronze.number_text`), their nested values as the compact JSON Spark writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from bronze.events import BRONZE_EVENTS_SCHEMA, UUID_PATTERN
from bronze.number_text import JAVASCRIPT, SERDE_JSON, fractional_text
from bronze.properties import ARRAY, BOOLEAN, DOCUMENT_COLUMNS, INTEGER, NULL, NUMBER, OBJECT, STRING

#: The columns this parser fills, in bronze order (the landing columns come from the input).
_FILLED = ("uuid", "event", "team_id", "distinct_id", "timestamp", *DOCUMENT_COLUMNS, "raw")
EVENT_VALUE_SCHEMA = pa.schema([to_arrow_schema(BRONZE_EVENTS_SCHEMA, timezone="UTC").field(c) for c in _FILLED])

_UUID = re.compile(UUID_PATTERN.rstrip("$") + r"\Z")
# [0-9], not \d: \d also matches other scripts' digits, which Spark does not read as digits.
_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
    r"(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))\Z"
)
_MAX_INT_DIGITS = 18  # any integer of up to 18 digits is a long, whatever its sign
_MAX_NUMBER_CHARS = 100  # Spark's JSON reader refuses numbers over 1,000 characters; far from it
#: A ``\u`` escape of a UTF-16 surrogate: a lone one reads as U+FFFD in Spark and not at all in
#: Arrow, so such a message is left to Spark (a pair, as an emoji is escaped, goes there too).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")
#: A decimal Spark's VARIANT holds (precision and scale up to 38): a fraction without exponent.
_DECIMAL = re.compile(r"-?([0-9]+)\.([0-9]+)\Z")
_MAX_DECIMAL_DIGITS = 38


class Defer(Exception):
    """The message is left to the Spark parser."""


class _Fraction:
    """A number written with a fraction or an exponent: its double, and the text it was written as.
    Not a ``float``: the stdlib's encoder then refuses it, which :func:`_nested_json` relies on."""

    __slots__ = ("token", "value")

    def __init__(self, token: str, value: float) -> None:
        self.token, self.value = token, value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise Defer("a key twice")
    return obj


def _int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise Defer("a long integer")
    return int(text)


def _int_serde(text: str) -> int:
    if text == "-0":
        raise Defer("a negative zero")
    return _int(text)


def _fraction(text: str) -> _Fraction:
    if len(text) > _MAX_NUMBER_CHARS:
        raise Defer("a long number")
    value = float(text)
    if math.isinf(value):
        raise Defer("a number out of range")
    return _Fraction(text, value)


def _fraction_serde(text: str) -> _Fraction:
    value = _fraction(text)
    if value.value == 0 and text.startswith("-"):
        raise Defer("a negative zero")
    return value


def _constant(text: str) -> Any:
    raise Defer(f"{text} is not JSON")


_DECODERS = {
    JAVASCRIPT: json.JSONDecoder(
        object_pairs_hook=_object, parse_int=_int, parse_float=_fraction, parse_constant=_constant
    ),
    SERDE_JSON: json.JSONDecoder(
        object_pairs_hook=_object, parse_int=_int_serde, parse_float=_fraction_serde, parse_constant=_constant
    ),
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _text(value: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate from a \\u escape
            raise Defer("not UTF-8") from exc
    return value


def _time(value: Any) -> int:
    """Microseconds since the epoch of an ISO-8601 time of the accepted form."""
    if type(value) is not str:
        raise Defer("timestamp")
    m = _TIME.match(value)
    if m is None:
        raise Defer("timestamp")
    y, mo, d, h, mi, s, frac, z, sign, oh, om = m.groups()
    try:
        tz = UTC if z else timezone((-1 if sign == "-" else 1) * timedelta(hours=int(oh), minutes=int(om)))
        local = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), int((frac or "").ljust(6, "0")), tz)
        return (local - _EPOCH) // _US
    except (ValueError, OverflowError) as exc:
        raise Defer("not a time") from exc


def _object_field(members: dict[str, Any], key: str, decoder: json.JSONDecoder) -> dict[str, Any] | None:
    """An object field (None when absent or null), given as an object or as a string holding one."""
    value = members.get(key)
    if value is None or type(value) is dict:
        return value
    if type(value) is str and value[:1] == "{":
        try:
            inner = decoder.decode(value)
        except (ValueError, RecursionError) as exc:
            raise Defer("not JSON") from exc
        if type(inner) is dict:
            return inner
    raise Defer(f"{key} is not an object")


# -- the documents ----------------------------------------------------------------------------------
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def _json_string(s: str) -> str:
    """A string as Spark's VARIANT writes it in JSON (Jackson's escapes, ``\\u00XX`` in capitals)."""
    if _NEEDS_ESCAPE.search(s) is None:
        return f'"{s}"'
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m[0]) or f"\\u{ord(m[0]):04X}", s) + '"'


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _decimal_json(token: str) -> str:
    """A fraction written without exponent as Spark's VARIANT writes the decimal it holds: its
    digits without trailing zeros (``1.50`` is ``1.5``, ``877.0`` is ``877``, ``-0.0`` is ``0``)."""
    m = _DECIMAL.match(token)
    if m is None:
        raise Defer("a nested number Spark holds as a double")
    whole, fraction = m.groups()
    if len(fraction) > _MAX_DECIMAL_DIGITS or len((whole + fraction).lstrip("0")) > _MAX_DECIMAL_DIGITS:
        raise Defer("a nested number Spark holds as a double")
    fraction = fraction.rstrip("0")
    digits = whole.lstrip("0") or "0"
    if digits == "0" and not fraction:
        return "0"
    sign = "-" if token.startswith("-") else ""
    return f"{sign}{digits}.{fraction}" if fraction else sign + digits


_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode
#: A character at or above the first surrogate: code-point order and UTF-16 order may then differ.
_PAST_BMP_ORDER = re.compile("[\ud800-\U0010ffff]")


def _nested_json(value: Any) -> str:
    """A nested value as Spark writes the VARIANT it parses to: compact, keys in UTF-16 order.

    The stdlib's C encoder writes it where its text is the same: no fraction inside (a
    :class:`_Fraction` it refuses), no escape in ``\\u`` form (Jackson writes its hex in capitals)
    and no character whose code point orders otherwise than its UTF-16 units; else it is written
    here."""
    try:
        text = _compact(value)
    except TypeError:
        return _written(value)
    if "\\u" in text or (not text.isascii() and _PAST_BMP_ORDER.search(text)):
        return _written(value)
    return text


def _written(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _json_string(value)
    if kind is dict:
        items = sorted(value.items(), key=lambda kv: _utf16(kv[0]))
        return "{" + ",".join(f"{_json_string(k)}:{_written(v)}" for k, v in items) + "}"
    if kind is list:
        return "[" + ",".join(_written(v) for v in value) + "]"
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if kind is int:
        return str(value)
    return _decimal_json(value.token)


_KINDS = {str: STRING, int: INTEGER, bool: BOOLEAN, _Fraction: NUMBER, type(None): NULL, dict: OBJECT, list: ARRAY}


class _Documents:
    """One document column being built: a map per row (or null), its entries in flat lists."""

    def __init__(self, notation: str) -> None:
        self.notation = notation
        self.offsets: list[int] = [0]
        self.nulls: list[bool] = []
        self.keys: list[str] = []
        self.kinds: list[str] = []
        self.texts: list[str | None] = []

    def add(self, obj: dict[str, Any] | None) -> None:
        if obj is None:
            self.nulls.append(True)
            self.offsets.append(self.offsets[-1])
            return
        values = obj.values()
        # Comprehensions over the values, which are mostly strings: the entries' kinds, then texts.
        self.kinds.extend([_KINDS[type(v)] for v in values])
        self.texts.extend([v if type(v) is str else str(v) if type(v) is int else self._text(v) for v in values])
        self.keys.extend(obj)
        self.nulls.append(False)
        self.offsets.append(len(self.keys))

    def _text(self, value: Any) -> str | None:
        kind = type(value)
        if kind is bool:
            return "true" if value else "false"
        if kind is _Fraction:
            return fractional_text(value.value, self.notation)
        if value is None:
            return None
        return _nested_json(value)

    def keep(self, rows: int) -> None:
        """Forget what was added after the first ``rows`` rows (a message deferred after all)."""
        del self.nulls[rows:], self.offsets[rows + 1 :]
        end = self.offsets[-1]
        del self.keys[end:], self.kinds[end:], self.texts[end:]

    def array(self, type_: pa.DataType) -> pa.Array:
        entries = pa.StructArray.from_arrays(
            [pa.array(self.kinds, pa.string()), pa.array(self.texts, pa.string())], names=["kind", "text"]
        )
        mask = pa.array(self.nulls, pa.bool_()) if any(self.nulls) else None
        out = pa.MapArray.from_arrays(
            pa.array(self.offsets, pa.int32()), pa.array(self.keys, pa.string()), entries, mask=mask
        )
        return out.cast(type_)


def _event(value: bytes | None, max_bytes: int, decoder: json.JSONDecoder) -> tuple[tuple[Any, ...], list[Any]]:
    """A message's fields and its five objects (the documents' sources, in DOCUMENT_COLUMNS order)."""
    if value is None or len(value) > max_bytes:
        raise Defer("size")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Defer("not UTF-8") from exc
    if text[:1] != "{":
        raise Defer("not an object")
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None:
        raise Defer("an escaped surrogate")
    try:
        members = decoder.decode(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError too
        raise Defer("not JSON") from exc
    uuid, event, team, distinct = (members.get(k) for k in ("uuid", "event", "team_id", "distinct_id"))
    if type(uuid) is not str or _UUID.match(uuid) is None:
        raise Defer("uuid")
    if type(event) is not str or not event or type(distinct) is not str or type(team) is not int:
        raise Defer("fields")
    timestamp = _time(members.get("timestamp"))
    properties = _object_field(members, "properties", decoder)
    props = {} if properties is None else properties
    objects = [
        props,
        _object_field(members, "person_properties", decoder),
        *(v if type(v := props.get(k)) is dict else None for k in ("$set", "$set_once", "$group_set")),
    ]
    return (uuid, _text(event), team, _text(distinct), timestamp, text), objects


@dataclass(frozen=True)
class ParsedValues:
    """Rows of the accepted messages (EVENT_VALUE_SCHEMA) and the positions of the accepted and
    the deferred ones in the input."""

    rows: pa.Table
    accepted: list[int]
    deferred: list[int]


def parse_event_values(values: Sequence[bytes | None], max_bytes: int, notation: str = JAVASCRIPT) -> ParsedValues:
    """Message values -> bronze event rows for the messages the Spark parser would accept alike
    (property documents with numbers in ``notation``); the others' positions in ``deferred``."""
    decoder = _DECODERS[notation]
    accepted: list[int] = []
    deferred: list[int] = []
    fields: list[list[Any]] = [[] for _ in range(6)]  # uuid, event, team_id, distinct_id, timestamp, raw
    documents = [_Documents(notation) for _ in DOCUMENT_COLUMNS]
    for i, value in enumerate(values):
        try:
            row, objects = _event(value, max_bytes, decoder)
            for doc, obj in zip(documents, objects, strict=True):
                doc.add(obj)
        except Defer:
            for doc in documents:
                doc.keep(len(accepted))
            deferred.append(i)
            continue
        accepted.append(i)
        for column, item in zip(fields, row, strict=True):
            column.append(item)
    uuid, event, team, distinct, timestamp, raw = fields
    arrays = [
        pa.array(uuid, pa.string()),
        pa.array(event, pa.string()),
        pa.array(team, pa.int64()),
        pa.array(distinct, pa.string()),
        pa.array(timestamp, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        *(doc.array(EVENT_VALUE_SCHEMA.field(c).type) for doc, c in zip(documents, DOCUMENT_COLUMNS, strict=True)),
        pa.array(raw, pa.string()),
    ]
    return ParsedValues(pa.Table.from_arrays(arrays, schema=EVENT_VALUE_SCHEMA), accepted, deferred)
