"""Product events parsed where they arrive: Kafka message values -> bronze event rows in Arrow,
without a Spark job, for the messages whose outcome is certain.

:func:`bronze.events.parse_events` (Spark) defines what a bronze event is. This parser accepts a
message only when it can be sure Spark would accept it with the same fields, and *defers* every other
message to that parser, so every quarantine reason still comes from one place. It accepts:

- UTF-8 text starting with ``{`` holding one JSON object, with no key twice in any object, no
  ``NaN``/``Infinity``, no integer of more than 18 digits, no number that overflows a double and
  no escaped surrogate (``\\ud83d``: Spark reads a lone one otherwise than Python);
- ``uuid``, ``event`` (non-empty), ``distinct_id`` and ``timestamp`` strings and an integer
  ``team_id``; a ``uuid`` matching :data:`bronze.events.UUID_PATTERN` in full; a ``timestamp`` of
  the form ``YYYY-MM-DDTHH:MM:SS[.ffffff](Z|+HH:MM|-HH:MM)`` that is a real time;
- ``properties`` and ``person_properties`` absent, null, an object, or a string holding an object.

Each event is parsed once, by the stdlib's C scanner. Its properties are kept in the message
(``raw``), which gold reads them from (:mod:`gold.property_values`).
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

#: The columns this parser fills, in bronze order (the landing columns come from the input).
_FILLED = ("uuid", "event", "team_id", "distinct_id", "timestamp", "raw")
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


class Defer(Exception):
    """The message is left to the Spark parser."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise Defer("a key twice")
    return obj


def _int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise Defer("a long integer")
    return int(text)


def _fraction(text: str) -> float:
    if len(text) > _MAX_NUMBER_CHARS:
        raise Defer("a long number")
    value = float(text)
    if math.isinf(value):
        raise Defer("a number out of range")
    return value


def _constant(text: str) -> Any:
    raise Defer(f"{text} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_int, parse_float=_fraction, parse_constant=_constant)
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


def _object_field(members: dict[str, Any], key: str) -> dict[str, Any] | None:
    """An object field (None when absent or null), given as an object or as a string holding one."""
    value = members.get(key)
    if value is None or type(value) is dict:
        return value
    if type(value) is str and value[:1] == "{":
        try:
            inner = _DECODER.decode(value)
        except (ValueError, RecursionError) as exc:
            raise Defer("not JSON") from exc
        if type(inner) is dict:
            return inner
    raise Defer(f"{key} is not an object")


def _event(value: bytes | None, max_bytes: int) -> tuple[Any, ...]:
    """A message's fields, or :class:`Defer`."""
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
        members = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError too
        raise Defer("not JSON") from exc
    uuid, event, team, distinct = (members.get(k) for k in ("uuid", "event", "team_id", "distinct_id"))
    if type(uuid) is not str or _UUID.match(uuid) is None:
        raise Defer("uuid")
    if type(event) is not str or not event or type(distinct) is not str or type(team) is not int:
        raise Defer("fields")
    timestamp = _time(members.get("timestamp"))
    for field in ("properties", "person_properties"):
        _object_field(members, field)
    return uuid, _text(event), team, _text(distinct), timestamp, text


@dataclass(frozen=True)
class ParsedValues:
    """Rows of the accepted messages (EVENT_VALUE_SCHEMA) and the positions of the accepted and
    the deferred ones in the input."""

    rows: pa.Table
    accepted: list[int]
    deferred: list[int]


def parse_event_values(values: Sequence[bytes | None], max_bytes: int) -> ParsedValues:
    """Message values -> bronze event rows for the messages the Spark parser would accept alike;
    the others' positions in ``deferred``."""
    accepted: list[int] = []
    deferred: list[int] = []
    fields: list[list[Any]] = [[] for _ in range(6)]  # uuid, event, team_id, distinct_id, timestamp, raw
    for i, value in enumerate(values):
        try:
            row = _event(value, max_bytes)
        except Defer:
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
        pa.array(raw, pa.string()),
    ]
    return ParsedValues(pa.Table.from_arrays(arrays, schema=EVENT_VALUE_SCHEMA), accepted, deferred)
