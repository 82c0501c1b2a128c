"""What the metric layers are configured with: the aggregation model.

The layers take plain values and small models like this, never the pipeline's settings:
``pipelines.config.settings`` nests :class:`AggregationSettings`, and reports a ConfigError as a
SettingsError with the same lines. The config types it is built from are in
:mod:`bronze.primitives`. Nothing here imports Spark, so loading settings stays quick.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator

from bronze.primitives import ConfigModel, Duration, StrList, positive
from silver.selectors import parse_selector

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
