"""``medallion report`` / ``validate --report``: the report of a small demo lake, opened in Debian's
headless Chromium (driven by Playwright; no browser is downloaded).

The expectations are independent of the report's code: the tables come from the flow registry,
their row counts from delta-rs reading each table's log, and the failing expectation is one the
test injects by appending a row with an impossible bucket straight into the Delta table.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from pipelines.flows import FLOWS
from tests.demo_lake import DEMO_GROUP, DemoLake, medallion_here
from tests.infra.apt import ensure_apt_packages
from tests.infra.common import require_or_skip

# The report of a copy of the shared small demo lake (tests/demo_lake.py); that the demo writes its
# own report and prints where is checked in test_demo.py.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group(DEMO_GROUP)]

ARTIFACTS_ENV = "MEDALLION_TEST_ARTIFACTS"
BAD_UUID = "00000000-0000-4000-8000-00000000bad0"


def artifacts() -> Path:
    """Where the test keeps its screenshots (``test-artifacts/report`` unless the env says)."""
    root = Path(os.environ.get(ARTIFACTS_ENV) or Path(__file__).resolve().parents[2] / "test-artifacts")
    out = root / "report"
    out.mkdir(parents=True, exist_ok=True)
    return out


def registry_tables() -> list[str]:
    return sorted({s.key for f in FLOWS for s in (*f.sources, *f.targets)})


def delta_rows(lake: Path, key: str) -> int:
    path = lake / key
    if not (path / "_delta_log").exists():
        return 0
    return DeltaTable(str(path)).to_pyarrow_dataset().count_rows()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = ensure_apt_packages("chromium")
    if reason is not None:
        require_or_skip(f"chromium unavailable: {reason}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_or_skip("playwright is not installed: pip install -e '.[dev]'")
    executable = shutil.which("chromium")
    assert executable is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"],
            timeout=60_000,
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def reported(
    demo_lake: DemoLake, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, Any]]:
    """(a copy of the small demo lake with one silver event of an impossible bucket appended, its
    report from ``validate --report``, the demo's JSON)."""
    base = tmp_path_factory.mktemp("report")
    lake = demo_lake.copy(base)

    silver = DeltaTable(str(lake / "silver/events"))
    one = silver.to_pyarrow_table().slice(0, 1)
    bad = one.set_column(one.schema.get_field_index("uuid"), "uuid", pa.array([BAD_UUID]))
    bad = bad.set_column(
        bad.schema.get_field_index("bucket"), "bucket", pa.array([99], bad.schema.field("bucket").type)
    )
    write_deltalake(str(lake / "silver/events"), bad, mode="append")

    out = base / "site"
    checked = medallion_here(spark, lake, "validate", "--report", str(out))
    assert checked.returncode == 1, checked.stdout + checked.stderr  # the injected row fails the suite
    assert "bucket_in_range" in checked.stdout
    return lake, out, demo_lake.summary


#: What a GX page needs from its assets: Bootstrap's stylesheet (its reboot: the font stack and no
#: margin on the body), jQuery with Bootstrap's and bootstrap-table's plugins, Font Awesome's face.
GX_PAGE_WORKS = """async () => {
    await document.fonts.ready;
    return {
        bootstrap_font: getComputedStyle(document.body).fontFamily.includes("Segoe UI"),
        bootstrap_margin: getComputedStyle(document.body).margin === "0px",
        plugins: typeof jQuery === "function" && typeof jQuery.fn.modal === "function"
            && typeof jQuery.fn.bootstrapTable === "function",
        icons: [...document.fonts].some(f => f.family.includes("Font Awesome") && f.status === "loaded"),
    };
}"""
GX_PAGE_WORKING = {"bootstrap_font": True, "bootstrap_margin": True, "plugins": True, "icons": True}


def test_the_report_in_a_browser_shows_every_table_with_its_rows_and_the_failed_expectation(
    reported: tuple[Path, Path, dict[str, Any]], browser: Any
) -> None:
    lake, out, _ = reported
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto((out / "index.html").as_uri())
        page.screenshot(path=str(artifacts() / "index.png"), full_page=True)

        nodes = {
            n.get_attribute("data-table"): n for n in page.query_selector_all("svg.flow-graph g.table-node[data-table]")
        }
        assert sorted(nodes) == registry_tables()
        counts = {key: int(n.get_attribute("data-rows")) for key, n in nodes.items()}
        assert counts == {key: delta_rows(lake, key) for key in registry_tables()}
        flows = {n.get_attribute("data-flow") for n in page.query_selector_all("svg.flow-graph g.flow-node")}
        assert flows == {f.name for f in FLOWS}

        silver = nodes["silver/events"]
        assert int(silver.get_attribute("data-failed")) >= 1
        assert "outcome-failed" in silver.get_attribute("class")
        assert "failed" in (silver.text_content() or "")
        for key in registry_tables():
            if key != "silver/events":
                assert nodes[key].get_attribute("data-failed") == "0", key

        page.click('svg.flow-graph g.table-node[data-table="silver/events"]')
        page.wait_for_load_state()
        assert page.url.endswith("/tables/silver_events.html")
        page.screenshot(path=str(artifacts() / "silver_events.png"), full_page=True)
        row = page.query_selector('tr[data-expectation="bucket_in_range"]')
        assert row is not None and row.get_attribute("data-outcome") == "failed"
        assert BAD_UUID in page.inner_text("#expectations")  # the failing row, kept as an example
        assert page.query_selector("img.chart") is not None

        # GX's Data Docs, followed from the table's page: styled, scripted and with icons, from disk.
        page.click("a.gx.table-docs")
        page.wait_for_load_state()
        assert "/gx/uncommitted/data_docs/local_site/validations/silver__events/" in page.url
        validation = page.url
        for docs in (validation, (out / "gx/gx/uncommitted/data_docs/local_site/index.html").as_uri()):
            page.goto(docs)
            page.wait_for_load_state()
            assert page.evaluate(GX_PAGE_WORKS) == GX_PAGE_WORKING, docs
        page.screenshot(path=str(artifacts() / "gx_index.png"), full_page=True)
        page.goto(validation)
        page.screenshot(path=str(artifacts() / "gx_validation.png"), full_page=True)

        page.goto((out / "index.html").as_uri())
        page.click('svg.flow-graph g.flow-node[data-flow="gold.merge"]')
        page.wait_for_load_state()
        assert page.query_selector('h1[data-job^="gold.merge"]') is not None
    finally:
        page.close()

    assert errors == []
    site = out.resolve().as_uri() + "/"
    assert requests and all(u.startswith(site) for u in requests), [u for u in requests if not u.startswith(site)]


def test_great_expectations_data_docs_are_built_from_the_same_validations(
    reported: tuple[Path, Path, dict[str, Any]],
) -> None:
    _, out, _ = reported
    page = (out / "tables" / "silver_events.html").read_text()
    link = page.split('class="gx table-docs" href="../', 1)[1].split('"', 1)[0]
    assert "/validations/silver__events/validate-" in link  # the newest validation: medallion validate's
    docs = (out / link).read_text()
    assert "bucket" in docs  # the failed check's column, as GX renders it
    assert "Failed" in docs
    assert (out / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html").exists()
