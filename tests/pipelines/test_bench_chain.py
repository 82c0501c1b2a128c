"""`medallion bench --size XS --only chain`: the event path warm and cold, beside the peers it is
held to, in one short run.

Starts a JVM of its own and the cold chain's fresh processes, once for the module (about four
minutes on 2 cores). Timings are never asserted; what is checked is that every figure the speed
issue is judged by is there, with its peer, from the same run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines.dev.bench.workloads import SIZES
from tests.demo_lake import DEMO_GROUP
from tests.pipelines.test_bench import PNG, SPARK_STAGES, checked_peer

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group(DEMO_GROUP)]

#: The event path's Spark stages and their sum, each held to its plain-Spark peer.
EVENT_STAGES = SPARK_STAGES[:6]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-chain") / "XS-chain"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", "bench", "--size", "XS", "--only", "chain", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,  # a hang guard, not a timing
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shutil.rmtree(out / "spark-events", ignore_errors=True)  # read by the bench already
    return out, json.loads((out / "bench.json").read_text())


def test_the_event_path_warm_and_cold_with_every_peer(chain: tuple[Path, dict[str, Any]]) -> None:
    out, result = chain
    assert result["only"] == "chain" and result["repeats"] == 1
    stages = {s["stage"]: s for s in result["stages"]}
    table = (out / "bench.md").read_text()
    assert "# medallion bench, size XS, chain stages only" in table
    for name in EVENT_STAGES:
        peer = checked_peer(stages, table, name, "plain Spark")
        assert stages[name]["units"] == peer["units"], name
        if name != "end to end (events)":
            assert "(the same hash of every row)" in peer["note"], (name, peer["note"])
    checked_peer(stages, table, "gold (stage 1 + 2)", "ClickHouse fan-out + GROUP BY")
    cold = stages["cold chain (events)"]
    assert cold["units"] == [SIZES["XS"].events]
    assert {p["label"] for p in cold["peers"]} == {"warm", "plain Spark"}
    assert stages["plain Spark: cold chain (events)"]["runs"] == cold["runs"] == 1
    # Only the event path: none of the whole bench's other stages or extras.
    assert not [s for s in stages if s.startswith(("Kafka", "remote write", "samples", "gates off"))]
    assert (out / "bench.png").read_bytes().startswith(PNG)


def test_each_spark_stage_has_its_jobs_from_sparks_event_log(chain: tuple[Path, dict[str, Any]]) -> None:
    _, result = chain
    jobs = result["spark_jobs"]
    assert jobs is not None
    for stage in EVENT_STAGES[:5]:
        for name in (stage, f"plain Spark: {stage}"):
            assert jobs[name]["jobs"] >= 1 and 0 < jobs[name]["job_seconds"] <= jobs[name]["seconds"], name
