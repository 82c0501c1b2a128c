"""Product events parsed where they arrive: Kafka message values -> bronze event rows in Arrow,
without a Spark job, for the messages whose outcome is certain.

:func:`bronze.events.parse_events` (Spark) defines what a bronze event is. This parser accepts a
message only when it can be sure Spark would accept it with the same fields, and *defers* every
other message to that parser, so every quarantine reason still comes from one place. It accepts:

- UTF-8 text starting with ``{`` holding one JSON object, with no key twice in any object, no
  ``NaN``/``Infinity``, no integer of more than 18 digits and no number that overflows a double;
- ``uuid``, ``event`` (non-empty), ``distinct_id`` and ``timestamp`` strings and an integer
  ``team_id``; a ``uuid`` matching :data:`bronze.events.UUID_PATTERN` in full; a ``timestamp`` of
  the form ``YYYY-MM-DDTHH:MM:SS[.ffffff](Z|+HH:MM|-HH:MM)`` that is a real time;
- ``properties`` and ``person_properties`` absent, null, an object, or a string holding an object.

The object fields keep their original JSON text (``properties`` is ``{}`` when absent). Spark
renders them again from the parsed value (keys sorted, numbers in its own notation); both texts
parse to the same value, which is what every later layer reads.
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

from bronze.events import UUID_PATTERN

#: The columns this parser fills, in bronze order (the landing columns come from the input).
EVENT_VALUE_SCHEMA = pa.schema(
    [
        ("uuid", pa.string()),
        ("event", pa.string()),
        ("team_id", pa.int64()),
        ("distinct_id", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("properties", pa.string()),
        ("person_properties", pa.string()),
        ("raw", pa.string()),
    ]
)

_UUID = re.compile(UUID_PATTERN.rstrip("$") + r"\Z")
# [0-9], not \d: \d also matches other scripts' digits, which Spark does not read as digits.
_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
    r"(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))\Z"
)
_WS = re.compile(r"[ \t\n\r]*")
_BLANK = frozenset(" \t\n\r")
_MAX_INT_DIGITS = 18  # any integer of up to 18 digits is a long, whatever its sign
_MAX_NUMBER_CHARS = 100  # Spark's JSON reader refuses numbers over 1,000 characters; far from it


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


def _float(text: str) -> float:
    if len(text) > _MAX_NUMBER_CHARS:
        raise Defer("a long number")
    value = float(text)
    if math.isinf(value):
        raise Defer("a number out of range")
    return value


def _constant(text: str) -> Any:
    raise Defer(f"{text} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_int, parse_float=_float, parse_constant=_constant)
#: (value, end) of the JSON value at a position, with the hooks above: the stdlib's C scanner.
_scan: Any = json.scanner.make_scanner(_DECODER)  # type: ignore[attr-defined]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _top_level(text: str) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """The top-level object's members and where each value's text is: a walk with the stdlib's C
    scanner, which parses every value once. Whitespace is skipped only where there is some
    (compact JSON has none)."""
    members: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    ws: Any = _WS.match  # [ \t\n\r]* always matches
    try:
        i = 1
        if text[i] in _BLANK:
            i = ws(text, i).end()
        if text[i] != "}":
            while True:
                if text[i] != '"':
                    raise Defer("not a key")
                key, i = _scan(text, i)
                if text[i] in _BLANK:
                    i = ws(text, i).end()
                if text[i] != ":":
                    raise Defer("no colon")
                start = i + 1
                if text[start] in _BLANK:
                    start = ws(text, start).end()
                value, i = _scan(text, start)
                if key in members:
                    raise Defer("a key twice")
                members[key] = value
                spans[key] = (start, i)
                c = text[i]
                if c in _BLANK:
                    i = ws(text, i).end()
                    c = text[i]
                if c == ",":
                    i += 1
                    if text[i] in _BLANK:
                        i = ws(text, i).end()
                elif c == "}":
                    break
                else:
                    raise Defer("no comma")
        if i + 1 != len(text) and ws(text, i + 1).end() != len(text):
            raise Defer("text after the object")
    except (StopIteration, IndexError, ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError too
        raise Defer("not JSON") from exc
    return members, spans


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


def _object_text(members: dict[str, Any], spans: dict[str, tuple[int, int]], text: str, key: str) -> str | None:
    """An object field's JSON text (None when absent or null), from an object or a string holding one."""
    value = members.get(key)
    if value is None:
        return None
    if type(value) is dict:
        start, end = spans[key]
        return text[start:end]
    if type(value) is str and value[:1] == "{":
        try:
            inner = _DECODER.decode(value)
        except (ValueError, RecursionError) as exc:
            raise Defer("not JSON") from exc
        if type(inner) is dict:
            return _text(value)
    raise Defer(f"{key} is not an object")


def _event(value: bytes | None, max_bytes: int) -> tuple[Any, ...]:
    if value is None or len(value) > max_bytes:
        raise Defer("size")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Defer("not UTF-8") from exc
    if text[:1] != "{":
        raise Defer("not an object")
    members, spans = _top_level(text)
    uuid, event, team, distinct = (members.get(k) for k in ("uuid", "event", "team_id", "distinct_id"))
    if type(uuid) is not str or _UUID.match(uuid) is None:
        raise Defer("uuid")
    if type(event) is not str or not event or type(distinct) is not str or type(team) is not int:
        raise Defer("fields")
    timestamp = _time(members.get("timestamp"))
    properties = _object_text(members, spans, text, "properties")
    person = _object_text(members, spans, text, "person_properties")
    return (uuid, _text(event), team, _text(distinct), timestamp, properties or "{}", person, text)


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
    columns: list[list[Any]] = [[] for _ in EVENT_VALUE_SCHEMA]
    for i, value in enumerate(values):
        try:
            row = _event(value, max_bytes)
        except Defer:
            deferred.append(i)
            continue
        accepted.append(i)
        for column, item in zip(columns, row, strict=True):
            column.append(item)
    arrays = [
        pa.array(c, pa.int64()).cast(f.type) if f.name == "timestamp" else pa.array(c, f.type)
        for c, f in zip(columns, EVENT_VALUE_SCHEMA, strict=True)
    ]
    rows = pa.Table.from_arrays(arrays, schema=EVENT_VALUE_SCHEMA)
    return ParsedValues(rows, accepted, deferred)
