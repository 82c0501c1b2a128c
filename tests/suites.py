"""A child pytest over some test modules, for modes one process cannot mix with the default one
(a Spark Connect session, tables by catalog name)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_child_suite(
    env: Mapping[str, str], suites: Sequence[str], report: Path, *args: str, timeout: float = 2400
) -> dict[str, int]:
    """Run ``suites`` in a child pytest with ``env`` added; assert it passed with nothing skipped
    (real parts required), and return its counts."""
    out = subprocess.run(
        # ``-n 0``: the child runs its tests itself, no workers of its own beside the parent's.
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *args,
            *suites,
        ],
        cwd=REPO,
        env={**os.environ, "MEDALLION_TEST_REQUIRE_REAL": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts
    return counts
