from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from pipelines.demo.data import PAGE_CHANGE_FILES


def test_analyze_dedup_on_the_fixtures_reproduces_the_worked_example(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    args = ["analyze", "dedup", "--windows", "5,60", "--out", str(tmp_path / "out")]
    for path in PAGE_CHANGE_FILES:
        args += ["--file", str(path)]
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", "--lake-root", str(tmp_path / "lake"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with (tmp_path / "out" / "dedup.csv").open() as f:
        rows = {(float(r["window_minutes"]), r["mode"]): r for r in csv.DictReader(f)}
    # W = 5 min: tumbling 13 in, 12 out; staggered 13 in, 11 out (the worked example).
    assert (rows[(5.0, "tumbling")]["input_events"], rows[(5.0, "tumbling")]["pruned"]) == ("13", "1")
    assert (rows[(5.0, "staggered")]["input_events"], rows[(5.0, "staggered")]["pruned"]) == ("13", "2")
    # An hour: page 330275's first six events share one window; its survivors hold no delete (the
    # undelete at 15:37:46 outlives both deletes of revision 686140), so only that undelete is emitted,
    # then the visibility change alone: 7 events -> 2 rows.
    assert rows[(60.0, "staggered")]["pruned"] == "5"
    png = (tmp_path / "out" / "dedup.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "staggered %" in done.stdout
