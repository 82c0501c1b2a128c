"""Which windows a backfill recounts, and the first it can: by hand, on the epoch-aligned windows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from gold.backfill import earliest_window, window_range

W = timedelta(seconds=30)


def test_the_range_holds_the_windows_that_start_in_it() -> None:
    r = window_range(datetime(2024, 6, 1, 0, 0, 10, tzinfo=UTC), datetime(2024, 6, 1, 0, 1, 30, tzinfo=UTC), W)
    # Windows start at :00, :30, 1:00, 1:30: of those, :30 and 1:00 start in [0:10, 1:30).
    assert (r.first, r.end, r.windows) == (datetime(2024, 6, 1, 0, 0, 30, tzinfo=UTC), r.first + 2 * W, 2)
    assert r.holds() == (
        "window_start >= '2024-06-01T00:00:30.000000Z' AND window_start < '2024-06-01T00:01:30.000000Z'"
    )
    # A time without a zone is UTC; one in another zone is the same instant.
    naive = window_range(datetime(2024, 6, 1, 0, 0, 10), datetime(2024, 6, 1, 0, 1, 30), W)
    plus_two = timezone(timedelta(hours=2))
    shifted = window_range(
        datetime(2024, 6, 1, 2, 0, 10, tzinfo=plus_two), datetime(2024, 6, 1, 2, 1, 30, tzinfo=plus_two), W
    )
    assert naive == shifted == r
    assert window_range(r.first + timedelta(seconds=1), r.first + timedelta(seconds=20), W).windows == 0


def test_the_earliest_window_is_that_of_the_earliest_event_in_utc_whatever_the_local_zone() -> None:
    event = datetime(2024, 6, 1, 0, 0, 42, tzinfo=UTC)
    assert earliest_window(event, W) == datetime(2024, 6, 1, 0, 0, 30, tzinfo=UTC)
    # As pyspark collects it: naive, in the local time zone.
    assert earliest_window(event.astimezone().replace(tzinfo=None), W) == datetime(2024, 6, 1, 0, 0, 30, tzinfo=UTC)
    assert earliest_window(None, W) is None
