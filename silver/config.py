"""What the layers are configured with: the metric aggregation model and the pieces config models share.

The layers take plain values and small models like these, never the pipeline's settings:
``pipelines.settings`` nests :class:`AggregationSettings` and builds the others, and reports a
:class:`ConfigError` as a SettingsError with the same lines. Gold and the suites import from here
(a layer may import the one below it). Nothing here imports Spark, so loading settings stays quick.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from silver.selectors import parse_selector


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


def named(items: Sequence[N], name: str, missing: str, error: type[ConfigError] = ConfigError) -> N:
    """The item called ``name``, else ``error`` from ``missing`` (with {name} and {known})."""
    for item in items:
        if item.name == name:
            return item
    known = ", ".join(i.name for i in items) or "none configured"
    raise error([missing.format(name=name, known=known)])


# -- metric aggregations (silver.metric_panes, gold.metric_windows) ---------------------------------
ACCUMULATORS = ("sum", "count", "min", "max", "increase", "quantiles", "distinct", "frequency")
KEYED_SKETCHES = ("distinct", "frequency")


class AggregationSettings(ConfigModel):
    """One precomputed metric aggregation: which samples, how they are keyed, windowed and summarised."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$", description="identifier used by medallion query")
    selector: str = Field(description='metric name with optional matchers: node_cpu_seconds_total{mode!="idle"}')
    window: Duration = Field(default=timedelta(minutes=1), description="window size")
    slide: Duration | None = Field(default=None, description="pane size; unset = window (tumbling)")
    accumulators: StrList = Field(default_factory=lambda: ["sum", "count", "min", "max"])
    grouping_labels: StrList | None = Field(
        default=None, description="labels kept in the output key (unset: every label not rolled up)"
    )
    rollup_labels: StrList = Field(default_factory=list, description="labels dropped at ingest")
    aggregated_labels: StrList = Field(
        default_factory=list, description="labels whose values the distinct / frequency sketches count"
    )
    allowed_lateness: Duration = timedelta(minutes=1)
    late: Literal["drop", "forward"] = "drop"
    raw: bool = Field(default=False, description="store every sample as a point window, without aggregation")
    kll_k: int = Field(default=200, ge=8, le=65535, description="KLL sketch size (rank error ~1.33% at 200)")
    hll_lg_k: int = Field(default=12, ge=4, le=21, description="HLL log2 of buckets (error ~1.6% at 12)")
    cms_eps: float = Field(default=0.001, gt=0, lt=1, description="count-min relative error")
    cms_confidence: float = Field(default=0.99, gt=0, lt=1)
    top_candidates: int = Field(default=20, ge=1, le=10_000, description="values per pane kept for top-N")

    @field_validator("selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        return str(parse_selector(v))

    @field_validator("accumulators")
    @classmethod
    def _accumulators(cls, v: list[str]) -> list[str]:
        unknown = [a for a in v if a not in ACCUMULATORS]
        if unknown:
            raise ValueError(f"unknown accumulator(s) {unknown}: choose from {', '.join(ACCUMULATORS)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _shape(self) -> AggregationSettings:
        positive(self.window, "window")
        slide = self.slide or self.window
        positive(slide, "slide")
        if self.allowed_lateness < timedelta(0):
            raise ValueError("allowed_lateness must not be negative")
        ratio = self.window / slide
        if slide > self.window or abs(ratio - round(ratio)) > 1e-9:
            raise ValueError(f"window {self.window} must be a whole multiple of slide {slide}")
        if round(ratio) > 1440:
            raise ValueError(f"window/slide = {round(ratio)} panes per window; keep it at most 1440")
        self.slide = slide
        grouped = set(self.grouping_labels or ())
        for what, labels in (("rollup_labels", self.rollup_labels), ("aggregated_labels", self.aggregated_labels)):
            both = grouped & set(labels)
            if both:
                raise ValueError(f"label(s) {sorted(both)} are both in grouping_labels and {what}")
        if "__name__" in grouped:
            raise ValueError("grouping_labels must not hold __name__: the aggregation is for one metric")
        keyed = [a for a in self.accumulators if a in KEYED_SKETCHES]
        if keyed and not self.aggregated_labels:
            raise ValueError(f"{', '.join(keyed)} count label values: set aggregated_labels")
        if self.late == "forward" and "increase" in self.accumulators:
            raise ValueError(
                "late: forward cannot be used with increase (a late sample changes the deltas of its "
                "neighbours, which are already counted); use late: drop or a larger allowed_lateness"
            )
        if not self.raw and not self.accumulators:
            raise ValueError("accumulators must not be empty")
        return self
