"""``medallion analyze dedup``: how much page-change dedup prunes, per window length and mode.

Runs the production dedup (:func:`silver.page_changes.dedup_run`, drained) over the same input for
every window length in tumbling and in staggered mode, and writes the figures as a table, a CSV and
a PNG line chart.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bronze.landing import valid
from bronze.page_changes import BRONZE_PAGE_CHANGES_COLUMNS, parse_page_changes
from pipelines.sources.files import file_digests, landing_rows
from silver.page_changes import EVENT_COLUMNS, LAST_EMITTED_SCHEMA, dedup_run

MODES = ("tumbling", "staggered")


@dataclass(frozen=True)
class DedupFigure:
    window_minutes: float
    mode: str
    input_events: int
    emitted: int
    stale: int

    @property
    def pruned(self) -> int:
        return self.input_events - self.emitted

    @property
    def pruned_percent(self) -> float:
        return 100.0 * self.pruned / self.input_events if self.input_events else 0.0


def page_changes_from_files(spark: SparkSession, paths: list[Path], max_bytes: int) -> tuple[DataFrame, int]:
    """Page changes parsed from files exactly as bronze would land them, and the count rejected."""
    landing = landing_rows(spark, file_digests(paths), datetime.now(UTC))
    parsed = landing.transform(parse_page_changes(max_bytes))
    good = valid(parsed, BRONZE_PAGE_CHANGES_COLUMNS)
    return good, parsed.count() - good.count()


def dedup_figures(events: DataFrame, windows_minutes: list[float]) -> list[DedupFigure]:
    spark = events.sparkSession
    source = events.select(*EVENT_COLUMNS).persist()
    n = source.count()
    empty = spark.createDataFrame([], LAST_EMITTED_SCHEMA)
    figures = []
    for minutes in windows_minutes:
        for mode in MODES:
            result = dedup_run(source, empty, mode, timedelta(minutes=minutes), None)
            emitted = result.emitted.count()
            stale = result.finalized.where("_stale").count()
            figures.append(DedupFigure(minutes, mode, n, emitted, stale))
    source.unpersist()
    return figures


def write_csv(figures: list[DedupFigure], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["window_minutes", "mode", "input_events", "emitted", "stale", "pruned", "pruned_percent"])
        for fig in figures:
            row = asdict(fig)
            writer.writerow([*row.values(), fig.pruned, f"{fig.pruned_percent:.2f}"])
    return path


def write_chart(figures: list[DedupFigure], path: Path, title: str) -> Path:
    from pipelines.app.plotting import pyplot

    plt = pyplot()

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for mode, marker in zip(MODES, ("o", "s"), strict=True):
        points = sorted((f.window_minutes, f.pruned_percent) for f in figures if f.mode == mode)
        ax.plot([x for x, _ in points], [y for _, y in points], marker=marker, label=mode)
    ax.set_xlabel("window length (minutes)")
    ax.set_ylabel("events pruned (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
