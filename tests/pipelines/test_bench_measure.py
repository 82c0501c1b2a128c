"""The bench's machine-load sampler: how busy the CPUs were over a stage's timed window."""

from __future__ import annotations

import os
import time

from pipelines.dev.bench.measure import MachineLoad, cpu_jiffies, machine_busy


def test_the_busy_share_comes_from_the_first_and_last_samples_inside_the_window() -> None:
    load = MachineLoad()
    # (time, busy ticks, all ticks): 2 CPUs, 100 ticks a second each
    load.samples = [(9.0, 0, 0), (10.0, 100, 200), (11.0, 250, 400), (12.0, 450, 600), (13.0, 450, 800)]
    assert load.busy(10.0, 12.0) == 350 / 400
    assert load.busy(9.5, 12.5) == 350 / 400  # samples outside the window are not used
    assert load.busy(12.5, 14.0) is None  # one sample inside says nothing
    assert (
        machine_busy([0.5, None, 0.875, 0.75]) == f"; the machine's {os.cpu_count()} CPUs 75% busy meanwhile (median)"
    )
    assert machine_busy([None]) == ""


def test_a_busy_loop_shows_in_the_machine_load() -> None:
    assert cpu_jiffies() is not None  # Linux: /proc/stat
    with MachineLoad(interval=0.05) as load:
        start = time.time()
        while time.time() < start + 0.6:
            pass
        end = time.time()
    share = load.busy(start, end)
    assert share is not None and 1 / (os.cpu_count() or 1) * 0.5 < share <= 1.0, share
