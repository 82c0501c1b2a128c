from __future__ import annotations

from datetime import UTC, datetime, timedelta

from silver.config import AggregationSettings
from silver.metric_panes import PaneClock, pane_clock, progress_row

T = datetime(2024, 6, 1, 12, tzinfo=UTC)
AGG = AggregationSettings(
    name="cpu",
    selector="up",
    window=timedelta(minutes=5),
    slide=timedelta(minutes=1),
    allowed_lateness=timedelta(seconds=30),
)


def test_before_any_sample_no_pane_is_final() -> None:
    assert pane_clock(AGG, None, None, drain=False) == PaneClock(None, None, None, None, None)


def test_the_watermark_trails_the_largest_sample_by_the_allowed_lateness() -> None:
    clock = pane_clock(AGG, T, T + timedelta(minutes=2), drain=False)
    later = T + timedelta(minutes=2)
    assert clock == PaneClock(
        max_seen=later,
        previous=T - timedelta(seconds=30),
        watermark=later - timedelta(seconds=30),
        closes=later - timedelta(seconds=30),
        recorded=later,
    )


def test_a_batch_of_older_samples_never_moves_the_clock_back() -> None:
    clock = pane_clock(AGG, T, T - timedelta(hours=1), drain=False)
    assert (clock.max_seen, clock.recorded) == (T, T)


def test_a_drain_closes_every_window_and_records_a_clock_that_makes_their_samples_late() -> None:
    clock = pane_clock(AGG, T, None, drain=True)
    assert clock.watermark == T - timedelta(seconds=30)
    assert clock.closes == T + timedelta(minutes=5)
    assert clock.recorded == T + timedelta(minutes=5, seconds=30)


def test_only_late_samples_of_a_dropping_aggregation_add_to_its_dropped_count() -> None:
    clock = pane_clock(AGG, T, None, drain=False)
    assert progress_row(AGG, clock, 3, 2) == {"kind": "progress", "aggregation": "cpu", "max_seen": T, "dropped": 5}
    forward = AggregationSettings(name="cpu", selector="up", late="forward")
    assert progress_row(forward, clock, None, 2)["dropped"] == 0
