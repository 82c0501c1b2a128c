"""Prometheus-style series selectors: ``node_cpu_seconds_total{mode!="idle",cpu=~"0|1"}``.

The four matchers are Prometheus's (``=``, ``!=``, ``=~``, ``!~``); regexes are anchored at both
ends, as in Prometheus, and a label a series lacks has the value ``""``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_SELECTOR = re.compile(rf"^\s*(?P<name>{_NAME})?\s*(?:\{{(?P<body>.*)\}})?\s*$", re.DOTALL)
_MATCHER = re.compile(rf'\s*(?P<label>{_LABEL})\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def sql(self, labels: str = "labels", name: str = "metric_name") -> str:
        """A Spark SQL predicate over the map column ``labels`` (``__name__`` is column ``name``)."""
        col = (
            f"coalesce({name}, '')" if self.label == "__name__" else f"coalesce({labels}['{_sql_str(self.label)}'], '')"
        )
        value = _sql_str(self.value if self.op in ("=", "!=") else f"^(?:{self.value})$")
        return {
            "=": f"{col} = '{value}'",
            "!=": f"{col} != '{value}'",
            "=~": f"{col} RLIKE '{value}'",
            "!~": f"NOT ({col} RLIKE '{value}')",
        }[self.op]


@dataclass(frozen=True)
class Selector:
    metric: str | None  # None when __name__ is matched by a regex or inequality
    matchers: tuple[Matcher, ...] = ()

    def sql(self, name: str = "metric_name", labels: str = "labels") -> str:
        by_name = [f"{name} = '{_sql_str(self.metric)}'"] if self.metric else []
        return " AND ".join([*by_name, *(m.sql(labels, name) for m in self.matchers)])

    def __str__(self) -> str:
        inner = ",".join(f'{m.label}{m.op}"{m.value}"' for m in self.matchers)
        return (self.metric or "") + (f"{{{inner}}}" if inner else "")


def _sql_str(s: str) -> str:
    return s.replace("\\", "\\\\").replace("'", "\\'")


def parse_selector(text: str) -> Selector:
    """Parse a selector or raise ``ValueError`` saying what is wrong with it."""
    m = _SELECTOR.match(text or "")
    if not m:
        raise ValueError(f'{text!r} is not a selector: use metric_name or metric_name{{label="value",...}}')
    matchers: list[Matcher] = []
    body = (m.group("body") or "").strip()
    pos = 0
    while pos < len(body):
        mm = _MATCHER.match(body, pos)
        if not mm:
            raise ValueError(f'{text!r}: cannot read a matcher at {body[pos:]!r} (use label="v", !=, =~ or !~)')
        value = re.sub(r"\\(.)", r"\1", mm.group("value"))
        if mm.group("op") in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"{text!r}: bad regex {value!r} for {mm.group('label')}: {exc}") from None
        matchers.append(Matcher(mm.group("label"), mm.group("op"), value))
        pos = mm.end()
    name = m.group("name")
    for matcher in list(matchers):
        if matcher.label == "__name__" and matcher.op == "=":
            if name and name != matcher.value:
                raise ValueError(f"{text!r}: two metric names")
            name = matcher.value
            matchers.remove(matcher)
    if not name and not any(m.label == "__name__" for m in matchers):
        raise ValueError(f"{text!r}: a selector needs a metric name or a __name__ matcher")
    return Selector(name, tuple(matchers))
