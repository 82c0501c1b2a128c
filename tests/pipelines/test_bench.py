"""`medallion bench --size XS` as a smoke test: every stage runs, figures are produced and the
invariants hold. XS is S's code at a tenth of its data (the stages, peers and extras are the same
calls), so what the test proves does not depend on the size; S's data only made it longer.

Timings are never asserted (they are measured by the harness, not by tests). The bench runs in its
own process, as users run it: chdb holds one data path per process, and the bench's ClickHouse must
not be the one the export tests open later in this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines.dev.bench.workloads import SAMPLES_PER_REQUEST_SERIES, SIZES, STEADY_ROUNDS, STEADY_SERIES
from tests.demo_lake import DEMO_GROUP
from tests.infra.apt import ensure_apt_packages
from tests.infra.common import require_or_skip

# The bench holds several GB (its peers, Kafka, a Spark session of its own): it runs in the
# worker that runs the other memory-heavy tests, one after another (tests/demo_lake.py).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group(DEMO_GROUP)]

PNG = b"\x89PNG\r\n\x1a\n"
#: Stages whose work runs in Spark: each is compared with its plain-Spark peer, which writes its rows.
SPARK_STAGES = (
    "files -> bronze (events)",
    "silver page changes",
    "silver events",
    "gold (stage 1 + 2)",
    "export to ClickHouse",
    "end to end (events)",
    "Kafka -> bronze (Tansu), PostHog fixture events",
    "samples -> metric windows (tumbling 1m)",
    "samples -> metric windows (sliding 1m, 6 panes)",
)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    reason = ensure_apt_packages("victoria-metrics", "prometheus")  # the remote-write peers
    if reason is not None:
        require_or_skip(f"the remote-write peers are unavailable: {reason}")
    cwd = tmp_path_factory.mktemp("bench")
    out = cwd / "bench-results" / "XS"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(  # from another folder, with the default (relative) output folder
        [sys.executable, "-m", "pipelines.app.cli", "bench", "--size", "XS", "--repeats", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=1800,  # a hang guard, not a timing: the bench with its peers on 2 shared cores
    )
    (cwd / "bench.log").write_text(done.stderr)  # its steps, with the seconds since it started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Spark's event log of the run (~0.35 GB at XS): the bench has read it.
    shutil.rmtree(out / "spark-events", ignore_errors=True)
    return out, json.loads((out / "bench.json").read_text()), done.stdout


def test_writes_the_table_the_json_and_the_charts(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, stdout = bench
    assert (out / "bench.png").read_bytes()[:8] == PNG
    assert not (out / "scaling.png").exists(), "scaling needs two sizes; XS has one"
    table = (out / "bench.md").read_text()
    assert "| stage | median /s |" in table and "## Records per event" in table
    assert "| stage | median /s |" in stdout, "the table is printed as well"
    assert not (out / "work").exists(), "the generated data and lakes are removed"
    assert result["size"] == "XS" and result["machine"]["cpus"] >= 1


def test_every_stage_has_a_figure_or_says_why_not(bench: tuple[Path, dict[str, Any], str]) -> None:
    _, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    expected = {
        "files -> bronze (events)",
        "silver page changes",
        "silver events",
        "gold (stage 1 + 2)",
        "export to ClickHouse",
        "end to end (events)",
        "peer: ClickHouse fan-out + GROUP BY",
        "peer: Spark dropDuplicatesWithinWatermark",
        "Kafka -> bronze (Tansu), PostHog fixture events",
        "Kafka -> bronze (Tansu), 4 KB properties",
        "peer: kafka-python consumer (poll and discard), PostHog fixture events",
        "peer: kafka-python consumer (poll and discard), 4 KB properties",
        "Kafka -> bronze, 1 ingest process (steady state)",
        "Kafka -> bronze, 2 ingest processes (steady state)",
        "remote write: decode only",
        "peer: remote write read and discard",
        "remote write -> bronze",
        "remote write -> bronze, serve (fsync per request)",
        "remote write -> bronze, serve (fsync every 1 s)",
        "remote write -> bronze, serve (fsync every 1 s, 2 processes)",
        "peer: VictoriaMetrics (remote write)",
        "peer: Prometheus (remote write)",
        "samples -> metric windows (tumbling 1m)",
        "samples -> metric windows (sliding 1m, 6 panes)",
        "cold: files -> bronze (events)",
        "cold: run all --once --drain",
        "cold chain (events)",
    }
    assert expected <= stages.keys()
    for name, s in stages.items():
        if s["runs"] == 0:
            assert s["note"] and s["note"].startswith("skipped"), name
            continue
        assert s["runs"] == 1 and s["median_per_s"] > 0 and s["min_per_s"] <= s["max_per_s"], name
        if "end to end" not in name:  # a sum of stages, not a run of its own
            assert s["peak_rss_mb"]["driver"] > 0 and s["peak_rss_mb"]["jvm"] > 0, name
    peers = {name: {p["label"]: p["stage"] for p in s["peers"]} for name, s in stages.items()}
    assert peers["silver page changes"]["Spark dropDuplicatesWithinWatermark"] == (
        "peer: Spark dropDuplicatesWithinWatermark"
    )
    assert peers["gold (stage 1 + 2)"]["ClickHouse fan-out + GROUP BY"] == "peer: ClickHouse fan-out + GROUP BY"
    assert peers["Kafka -> bronze, 2 ingest processes (steady state)"] == {
        "1 process": "Kafka -> bronze, 1 ingest process (steady state)"
    }
    assert peers["remote write -> bronze"] == {
        "decode only": "remote write: decode only",
        "read and discard": "peer: remote write read and discard",
    }
    assert peers["remote write -> bronze, serve (fsync every 1 s, 2 processes)"] == {
        "1 process": "remote write -> bronze, serve (fsync every 1 s)"
    }
    for fsync in ("fsync per request", "fsync every 1 s"):
        assert peers[f"remote write -> bronze, serve ({fsync})"] == {
            "VictoriaMetrics": "peer: VictoriaMetrics (remote write)",
            "Prometheus": "peer: Prometheus (remote write)",
        }


def test_the_cold_chain_is_two_fresh_processes_read_against_the_warm_chain(
    bench: tuple[Path, dict[str, Any], str],
) -> None:
    _, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    ingest, run, chain = (
        stages[name]
        for name in ("cold: files -> bronze (events)", "cold: run all --once --drain", "cold chain (events)")
    )
    assert chain["units"] == ingest["units"] == run["units"] == [SIZES["XS"].events]
    assert chain["seconds"] == [
        pytest.approx(a + b, abs=0.002) for a, b in zip(ingest["seconds"], run["seconds"], strict=True)
    ]
    assert {p["label"]: p["stage"] for p in chain["peers"]} == {
        "warm": "end to end (events)",
        "plain Spark": "plain Spark: cold chain (events)",  # one fresh process running the peers
    }
    peer = stages["plain Spark: cold chain (events)"]
    assert peer["units"] == chain["units"] and len(peer["seconds"]) == len(chain["seconds"])
    assert {p["label"]: p["stage"] for p in ingest["peers"]} == {"warm": "files -> bronze (events)"}
    assert all(p["ratio"] > 0 for p in chain["peers"] + ingest["peers"])


def test_the_remote_write_peers_ran_timed_by_their_own_counters(bench: tuple[Path, dict[str, Any], str]) -> None:
    _, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    steady = STEADY_SERIES["XS"] * SAMPLES_PER_REQUEST_SERIES * (STEADY_ROUNDS - 1)  # the timed rounds
    for name, counter, promise in (
        ("peer: VictoriaMetrics (remote write)", "`vm_rows_added_to_storage_total`", "2xx: in memory"),
        (
            "peer: Prometheus (remote write)",
            "`prometheus_tsdb_head_samples_appended_total`",
            "2xx: in the head block and its WAL",
        ),
        (
            "remote write -> bronze, serve (fsync per request)",
            "`medallion_remote_write_rows_flushed_total`",
            "2xx: each request's log segment",
        ),
        (
            "remote write -> bronze, serve (fsync every 1 s)",
            "`medallion_remote_write_rows_flushed_total`",
            "the log fsynced every 1 s",
        ),
        (
            "remote write -> bronze, serve (fsync every 1 s, 2 processes)",
            "`medallion_remote_write_rows_flushed_total`",
            "the log fsynced every 1 s",
        ),
    ):
        stage = stages[name]
        assert stage["runs"] == 1 and stage["units"] == [steady], (name, stage["note"])
        note = stage["note"]
        assert f"time until {counter}" in note and promise in note, note
        cpu = re.search(r"CPU per 400,000 samples (\d+\.\d\d) s", note)
        assert cpu and float(cpu.group(1)) > 0, note


def test_kafka_is_measured_at_two_sizes_beside_a_bare_consumer(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    table = (out / "bench.md").read_text()
    for kind in ("PostHog fixture events", "4 KB properties"):
        name = f"Kafka -> bronze (Tansu), {kind}"
        if stages[name]["runs"] == 0:
            continue  # skipped, and said why (no Tansu)
        peer = checked_peer(stages, table, name, "kafka-python consumer")
        assert peer["units"] == stages[name]["units"] == [float(SIZES["XS"].kafka_messages)], name
        for s in (stages[name], peer):
            assert " MB/s median (" in s["note"] and " B/message" in s["note"], s["note"]
    small, large = (
        float(stages[f"Kafka -> bronze (Tansu), {k}"]["note"].split(" B/message")[0].split(", ")[-1].replace(",", ""))
        for k in ("PostHog fixture events", "4 KB properties")
    )
    assert 1_000 < small < 3_000 and 4_096 < large < 6_000, (small, large)


def test_two_ingest_processes_are_measured_beside_one(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    name = "Kafka -> bronze, 2 ingest processes (steady state)"
    if stages[name]["runs"] == 0:
        return  # skipped, and said why (no Tansu)
    checked_peer(stages, (out / "bench.md").read_text(), name, "1 process")
    # XS produces 30,000 messages (M and L at least 60,000): three flushes of 5,000 for each of
    # two processes, so both still land over a window that leaves each one's first flush out.
    for s in (stages[name], stages["Kafka -> bronze, 1 ingest process (steady state)"]):
        assert "30,000 PostHog fixture events" in s["note"] and "4 partitions" in s["note"], s["note"]
        assert 0 < s["units"][0] < 30_000, s["units"]  # the first flush of each process is left out


def checked_peer(stages: dict[str, Any], table: str, name: str, label: str) -> dict[str, Any]:
    """The one peer of stage ``name`` called ``label``, its ratio checked against the two medians
    and shown in the stage's row of the table."""
    s = stages[name]
    (p,) = [p for p in s["peers"] if p["label"] == label]
    peer = stages[p["stage"]]
    assert peer["runs"] == s["runs"] and peer["unit"] == s["unit"], (name, label)
    assert p["ratio"] == pytest.approx(s["median_per_s"] / peer["median_per_s"]), (name, label)
    row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    assert f"{p['ratio']:.2f}x of {label}" in row, row
    return peer


def test_every_spark_stage_has_a_plain_spark_ratio(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    table = (out / "bench.md").read_text()
    for name in SPARK_STAGES:
        if stages[name]["runs"] == 0:  # skipped (no Tansu), and so is its peer
            assert f"plain Spark: {name}" not in stages, name
            continue
        peer = checked_peer(stages, table, name, "plain Spark")
        assert peer["units"] == stages[name]["units"], name
        if name != "end to end (events)":  # the peer did the stage's work: its rows, by their hash
            assert "the stage's rows in" in peer["note"], (name, peer["note"])
    gold = {p["label"] for p in stages["gold (stage 1 + 2)"]["peers"]}
    assert gold == {"plain Spark", "ClickHouse fan-out + GROUP BY", "gates off"}, "the ClickHouse peer stays"


def test_every_gated_stage_is_measured_with_its_gates_off(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = bench
    stages = {s["stage"]: s for s in result["stages"]}
    table = (out / "bench.md").read_text()
    for name in SPARK_STAGES[:5]:  # the chain's stages, run with gates on and off
        assert checked_peer(stages, table, name, "gates off")["stage"] == f"gates off: {name}"


def test_two_stage_records_do_not_grow_with_pods(bench: tuple[Path, dict[str, Any], str]) -> None:
    _, result, _ = bench
    rows = sorted(result["reduction"], key=lambda r: r["pods"])
    assert [r["pods"] for r in rows] == [1, 4, 12]
    assert len({r["two_stage_records"] for r in rows}) == 1, rows
    single = [r["single_stage_records"] for r in rows]
    assert single == sorted(single) and single[0] == rows[0]["two_stage_records"] and single[-1] > single[0]


def test_dedup_prunes_more_as_windows_grow(bench: tuple[Path, dict[str, Any], str]) -> None:
    _, result, _ = bench
    for mode in ("tumbling", "staggered"):
        by_window = sorted((r["window_minutes"], r["pruned_percent"]) for r in result["dedup"] if r["mode"] == mode)
        assert len(by_window) == 5
        pruned = [p for _, p in by_window]
        assert pruned == sorted(pruned) and 0 < pruned[0] and pruned[-1] < 100, (mode, pruned)


def test_the_buffer_sees_every_page_change_once(bench: tuple[Path, dict[str, Any], str]) -> None:
    _, result, _ = bench
    steps = result["buffer"]
    inputs = [s["input_events"] for s in steps]
    assert inputs == sorted(inputs) and inputs[-1] == result["workload"]["page_changes_landed"]
    assert all(0 <= s["buffered_events"] <= s["input_events"] for s in steps)
    assert result["scaling"]["sizes"] == {"XS": SIZES["XS"].events}


def test_fixed_costs_time_a_noop_and_a_one_event_run_of_every_event_path_job(
    bench: tuple[Path, dict[str, Any], str],
) -> None:
    out, result, _ = bench
    rows = {r["stage"]: r for r in result["fixed_costs"]}
    assert list(rows) == ["silver events", "gold stage 1", "gold stage 2", "export to ClickHouse"]
    for name, r in rows.items():
        # the empty increment did nothing, and the one event went through every job
        assert r["statuses"] == ["noop: noop", "one_event: ok"], (name, r["statuses"])
        assert 0 < r["noop"]["min"] <= r["noop"]["median"] <= r["noop"]["max"]
        assert 0 < r["one_event"]["min"] <= r["one_event"]["median"] <= r["one_event"]["max"]
        assert r["runs"] == result["repeats"] == 1, name  # XS runs them once, as its stages
    assert "## Per-run fixed costs" in (out / "bench.md").read_text()


def test_a_one_window_backfill_is_timed_on_the_lake_the_chain_left(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = bench
    r = result["backfill"]
    assert r["gold_rows"] > 0 and r["tuples"] > 0  # a window in the middle of the lake's events
    assert 0 < r["seconds"]["min"] <= r["seconds"]["median"] <= r["seconds"]["max"]
    assert "## A 1-window backfill" in (out / "bench.md").read_text()


def test_a_pass_of_run_all_is_timed_empty_and_with_one_event_per_flow_and_in_total(
    bench: tuple[Path, dict[str, Any], str],
) -> None:
    from pipelines.dev.bench.passes import EVENT_LOG_STEP
    from pipelines.flows import runnable

    out, result, _ = bench
    costs = result["pass_costs"]
    rows = {r["flow"]: r for r in costs["flows"]}
    assert list(rows) == [f.name for f in runnable()] + [EVENT_LOG_STEP]
    # the empty pass found nothing to do anywhere; the event went through silver and both gold stages
    assert all(r["noop_statuses"] == ["noop"] for name, r in rows.items() if name != EVENT_LOG_STEP), costs
    # the flows' event-log rows are written after the last flow, in one commit timed as a step
    assert rows[EVENT_LOG_STEP]["noop_statuses"] == rows[EVENT_LOG_STEP]["one_event_statuses"] == ["ok"]
    assert [rows[f]["one_event_statuses"] for f in ("silver.events", "gold.partials", "gold.merge")] == [["ok"]] * 3
    assert all(r["spark_jobs"] is not None and r["spark_jobs"] >= 0 for r in rows.values())
    assert rows["silver.events"]["spark_jobs"] > 0  # the event was read, checked and written
    assert [rows[f]["one_event_interpreted_statuses"] for f in ("silver.events", "gold.partials")] == [["ok"]] * 2
    for kind in ("noop", "one_event", "one_event_interpreted"):
        t = costs["total"][kind]
        assert 0 < t["min"] <= t["median"] <= t["max"]
    assert "## A pass of run all (session up, XS lake)" in (out / "bench.md").read_text()


def test_every_spark_stage_has_its_jobs_from_sparks_event_log(bench: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = bench
    jobs = result["spark_jobs"]
    assert jobs is not None, "the bench's session wrote no event log it could read"
    for stage in (*SPARK_STAGES[:5], "plain Spark: silver events"):
        if stage.startswith("end to end"):
            continue  # a sum of the stages' figures, not a run of its own
        f = jobs[stage]
        assert f["jobs"] >= 1 and f["queries"] >= 1, (stage, f)
        assert 0 < f["job_seconds"] <= f["seconds"] and 0 <= f["before_jobs_seconds"] < f["seconds"], (stage, f)
    assert "## Spark's jobs per stage" in (out / "bench.md").read_text()
