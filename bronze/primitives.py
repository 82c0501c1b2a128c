"""The primitives every layer shares, written once: config types, window arithmetic, JSON number
types and the quarantine row.

Bronze is the layer every other builds on, so they live here; silver, gold, the expectation suites
and the edge (``pipelines``) import them. Importing this module does not import Spark, so loading
settings stays quick.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic_settings import NoDecode

if TYPE_CHECKING:
    from pyspark.sql import Column


# -- config types -----------------------------------------------------------------------------------
class ConfigError(ValueError):
    """Config given to a layer cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> Any:
    """Accept ``30s``, ``5m``, ``1.5h``, ``250ms``, plain seconds, or ISO-8601 (``PT5M``)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[(m.group(2) or "s").lower()])
        if value.strip().upper().startswith("P"):
            return value.strip()  # pydantic parses ISO-8601 durations
        raise ValueError(f"invalid duration {value!r}: use e.g. 30s, 5m, 1h or PT5M")
    return value


def _split_list(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in re.split(r"[,\n]", text) if part.strip()]
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
# NoDecode: a list read from one environment variable is "a,b" as often as JSON; _split_list reads both.
StrList = Annotated[list[str], NoDecode, BeforeValidator(_split_list)]


def positive(d: timedelta, name: str) -> timedelta:
    if d <= timedelta(0):
        raise ValueError(f"{name} must be positive")
    return d


def non_negative(d: timedelta, name: str) -> timedelta:
    if d < timedelta(0):
        raise ValueError(f"{name} must not be negative")
    return d


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class Named(Protocol):
    name: str


N = TypeVar("N", bound=Named)


def unique_names(items: list[N], what: str) -> list[N]:
    """``items`` unless two share a name (a ValueError naming them, for a validator)."""
    names = [i.name for i in items]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{what} name(s) used twice: {twice}")
    return items


def named(items: Sequence[N], name: str, missing: str, error: Callable[[list[str]], Exception] = ConfigError) -> N:
    """The item called ``name``, else ``error`` from ``missing`` (with {name} and {known})."""
    for item in items:
        if item.name == name:
            return item
    known = ", ".join(i.name for i in items) or "none configured"
    raise error([missing.format(name=name, known=known)])


# -- window arithmetic ------------------------------------------------------------------------------
def micros(d: timedelta) -> int:
    """A duration in whole microseconds (Spark's timestamp unit), exactly."""
    return d // timedelta(microseconds=1)


def plus(ts: Column, d: timedelta) -> Column:
    """``ts`` moved by ``d``."""
    from pyspark.sql import functions as F

    return ts + F.expr(f"INTERVAL '{micros(d)}' MICROSECOND")


def window_start(ts: Column, width: timedelta) -> Column:
    """Start of the tumbling window of ``width`` holding ``ts``, windows aligned to the epoch."""
    from pyspark.sql import functions as F

    w = micros(width)
    t = F.unix_micros(ts)
    return F.timestamp_micros(t - F.pmod(t, F.lit(w)))


# -- JSON numbers -----------------------------------------------------------------------------------
#: Variant type names of a JSON integer, a number written without fraction or exponent (what
#: ``schema_of_variant`` says for one; Spark holds ``1.0`` as DECIMAL(1,0), which is not one).
INTEGER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")


# -- the quarantine row -----------------------------------------------------------------------------
#: The quarantine row's leading columns, before the landing columns it keeps.
QUARANTINE_HEAD = ("kind", "raw", "reason", "expectation")
#: A row a ``drop`` expectation removed is quarantined with the reason ``expectation <name> failed``.
DROPPED_REASON = ("expectation ", " failed")


def quarantine_row(
    kind: Any, raw: Any, reason: Any, expectation: Any, landing: Mapping[str, Any], landing_columns: Sequence[str]
) -> dict[str, Any]:
    """A quarantine row's columns in order, from Spark columns or Arrow arrays alike: what was
    refused (``raw``), why, by which expectation (none for a parse failure), and where it came from."""
    return {
        **dict(zip(QUARANTINE_HEAD, (kind, raw, reason, expectation), strict=True)),
        **{c: landing[c] for c in landing_columns},
    }
