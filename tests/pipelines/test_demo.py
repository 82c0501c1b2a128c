"""The demo end to end through the real CLI: what lands where, and that a rerun changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

pytestmark = pytest.mark.integration

TABLES = (
    "bronze/events",
    "bronze/page_changes",
    "bronze/quarantine",
    "silver/events",
    "silver/page_changes",
    "gold/property_values",
    "_meta/pipeline_events",
)


def medallion(lake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_")}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "--lake-root", str(lake), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("demo") / "lakehouse"
    first = medallion(lake, "demo", "--events", "3000", "--page-changes", "1000", "--json")
    assert first.returncode == 0, first.stderr
    (lake.parent / "first.json").write_text(first.stdout)
    return lake


def table(lake: Path, key: str):  # type: ignore[no-untyped-def]
    return DeltaTable(str(lake / key)).to_pyarrow_table()


def test_demo_creates_every_table_readable_by_deltalake(lake: Path) -> None:
    for key in TABLES:
        assert DeltaTable.is_deltatable(str(lake / key)), key
    assert table(lake, "bronze/events").num_rows == 91 + 3000  # fixtures + synthetic
    silver = table(lake, "silver/events")
    assert silver.num_rows == 91 + 3000
    assert pc.min(silver["bucket"]).as_py() >= 0 and pc.max(silver["bucket"]).as_py() < 8


def test_demo_quarantines_the_malformed_records_with_reasons(lake: Path) -> None:
    reasons = sorted(table(lake, "bronze/quarantine")["reason"].to_pylist())
    assert reasons == [
        "field 'team_id' is not an integer",
        "field 'timestamp' is not an ISO-8601 time",
        "missing required field 'team_id'",
        "not a JSON object",
        "not valid JSON",
    ]


def test_demo_deduplicates_the_fixture_page_as_in_the_worked_example(lake: Path) -> None:
    silver = table(lake, "silver/page_changes").filter(
        (pc.field("wiki_id") == "testwikidatawiki") & (pc.field("page_id") == 330275)
    )
    kinds = sorted(zip(silver["rev_id"].to_pylist(), silver["page_change_kind"].to_pylist(), strict=True))
    assert kinds == [
        (686138, "create"),
        (686139, "edit"),
        (686140, "undelete"),
        (686140, "undelete"),
        (686140, "visibility_change"),
    ]
    bronze = table(lake, "bronze/page_changes").num_rows
    assert sum(table(lake, "silver/page_changes")["merged_count"].to_pylist()) == bronze


def test_demo_exports_gold_counts_to_clickhouse(lake: Path) -> None:
    summary = json.loads((lake.parent / "first.json").read_text())
    gold = table(lake, "gold/property_values")
    assert summary["clickhouse_rows"] > 0
    assert summary["clickhouse_count_sum"] == summary["gold_count_sum"] == pc.sum(gold["count"]).as_py()
    assert summary["clickhouse_tuple_windows"] == gold.num_rows
    # Interleaved batches (pods) repeat tuples, so stage 2 collapses partials.
    assert summary["tables"]["gold/property_value_partials"] > gold.num_rows


def test_second_demo_run_changes_no_table(lake: Path) -> None:
    before = {key: table(lake, key).num_rows for key in TABLES if not key.startswith("_meta")}
    second = medallion(lake, "demo", "--events", "3000", "--page-changes", "1000", "--json")
    assert second.returncode == 0, second.stderr
    after = {key: table(lake, key).num_rows for key in TABLES if not key.startswith("_meta")}
    assert after == before
    assert json.loads(second.stdout) == json.loads((lake.parent / "first.json").read_text())


def test_status_and_sql_read_the_lake(lake: Path) -> None:
    status = medallion(lake, "status")
    assert status.returncode == 0, status.stderr
    assert "gold/property_values" in status.stdout and "export.clickhouse" in status.stdout
    sql = medallion(
        lake, "sql", "SELECT count(*) AS n FROM silver_page_changes WHERE page_id = 330275", "--format", "csv"
    )
    assert sql.returncode == 0, sql.stderr
    assert sql.stdout.splitlines() == ["n", "5"]
    bad = medallion(lake, "sql", "SELECT nope FROM gold_property_values")
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 1 and len(errors) == 1 and "Traceback" not in bad.stderr
    assert "UNRESOLVED_COLUMN" in errors[0] and "nope" in errors[0]


def test_run_once_is_a_noop_when_up_to_date(lake: Path) -> None:
    out = medallion(lake, "run", "all", "--once")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("noop") == 5
