"""The report's flow graph, drawn from the registry with no lake: every table, flow and outside
system once, an edge for each flow's every source and target, no two nodes on top of each other,
and a flow added to the registry drawn too."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from pipelines import flows
from pipelines.app.report.collect import FlowNode, Report, Table, registry_tables
from pipelines.app.report.graph import age, svg
from pipelines.app.report.site import time_axis
from pipelines.runtime.flow_types import Append, Flow
from pipelines.runtime.tables import SILVER_EVENTS
from pipelines.storage import TableSpec

SVG = "{http://www.w3.org/2000/svg}"


def report() -> Report:
    tables = {s.key: Table(s.key, s.description) for s in registry_tables()}
    return Report(datetime.now(UTC), "/lake", "delta-rs", tables, [FlowNode(f) for f in flows.FLOWS], [])


def drawn(r: Report) -> ET.Element:
    return ET.fromstring(svg(r))


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if cls in g.get("class", "").split()]


def test_every_table_flow_and_outside_system_is_a_node_with_an_edge_per_source_and_target() -> None:
    root = drawn(report())
    tables = sorted(g.get("data-table") for g in groups(root, "table-node"))
    assert tables == sorted({s.key for f in flows.FLOWS for s in (*f.sources, *f.targets)})
    assert sorted(g.get("data-flow") for g in groups(root, "flow-node")) == sorted(f.name for f in flows.FLOWS)
    outside = {f.external_source for f in flows.FLOWS} | {f.external_target for f in flows.FLOWS}
    assert sorted(g.get("data-outside") for g in groups(root, "outside-node")) == sorted(outside - {None})
    edges = [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]
    expected = sum(
        len(f.sources) + len(f.targets) + bool(f.external_source) + bool(f.external_target) for f in flows.FLOWS
    )
    assert len(edges) == expected


def test_no_two_nodes_overlap_and_the_drawing_holds_them_all() -> None:
    root = drawn(report())
    width, height = float(root.get("width")), float(root.get("height"))
    boxes = []
    for g in root.iter(f"{SVG}g"):
        rect = g.find(f"{SVG}rect")
        if "node" in g.get("class", "").split() and rect is not None:
            x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
            assert 0 <= x and x + w <= width and 0 <= y and y + h <= height
            boxes.append((x, y, w, h))
    for (x1, y1, w1, h1), (x2, y2, w2, h2) in itertools.combinations(boxes, 2):
        assert x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1


def test_a_flow_added_to_the_registry_is_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    names = TableSpec("gold", "event_names", StructType([StructField("events", LongType())]))
    example = Flow("gold.event_names", "gold", (SILVER_EVENTS,), (names,), Append(), "events per name")
    monkeypatch.setattr(flows, "FLOWS", (*flows.FLOWS, example))
    root = drawn(report())
    assert "gold/event_names" in {g.get("data-table") for g in groups(root, "table-node")}
    assert "gold.event_names" in {g.get("data-flow") for g in groups(root, "flow-node")}


@pytest.mark.parametrize(
    ("seconds", "text"), [(5, "5 s"), (600, "10 min"), (3 * 3600, "3 h"), (5 * 86400, "5 d"), (3 * 31557600, "3.0 y")]
)
def test_ages_read_as_people_say_them(seconds: float, text: str) -> None:
    assert age(seconds) == text


def test_a_run_chart_of_one_run_or_a_few_spans_minutes_around_them_not_years() -> None:
    t = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    minute, day = timedelta(minutes=1), timedelta(days=1)
    assert time_axis([t]) == (t - minute, t + minute)
    few = [t, t + timedelta(seconds=10), t + timedelta(seconds=40)]
    assert time_axis(few) == (t - minute, t + timedelta(seconds=40) + minute)
    assert time_axis([t, t + 10 * day]) == (t - day / 2, t + 10 * day + day / 2)  # 5% of the span either side
