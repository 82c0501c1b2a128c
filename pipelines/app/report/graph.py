"""The flow graph of the report, drawn as SVG from the flow registry: a node per table, per flow
and per outside system (Kafka, files, remote write, ClickHouse), an edge from each flow's sources
to it and from it to each target. Laid out top to bottom in ranks (the longest path from a
source), each rank ordered to keep edges short (a few barycenter sweeps); no JavaScript.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from xml.sax.saxutils import escape, quoteattr

from pipelines.app.report.collect import FlowNode, Report, Table

TABLE_W, TABLE_H = 236, 118
FLOW_W, FLOW_H = 236, 62
OUTSIDE_W, OUTSIDE_H = 150, 40
GAP_X, GAP_Y = 26, 46
MARGIN = 16
SWEEPS = 4


@dataclass
class Node:
    id: str
    kind: str  # table | flow | outside
    width: int
    height: int
    rank: int = 0
    x: float = 0.0
    y: float = 0.0
    succ: list[str] = field(default_factory=list)
    pred: list[str] = field(default_factory=list)


def nodes_of(report: Report) -> dict[str, Node]:
    """The graph's nodes and edges, from the registry (through the report's flows)."""
    nodes: dict[str, Node] = {}

    def node(id: str, kind: str) -> Node:
        if id not in nodes:
            w, h = {"table": (TABLE_W, TABLE_H), "flow": (FLOW_W, FLOW_H), "outside": (OUTSIDE_W, OUTSIDE_H)}[kind]
            nodes[id] = Node(id, kind, w, h)
        return nodes[id]

    def edge(a: Node, b: Node) -> None:
        a.succ.append(b.id)
        b.pred.append(a.id)

    for key in report.tables:
        node(f"table:{key}", "table")
    for fn in report.flows:
        f = fn.flow
        me = node(f"flow:{f.name}", "flow")
        for s in f.sources:
            edge(node(f"table:{s.key}", "table"), me)
        if f.external_source:
            edge(node(f"outside:{f.external_source}", "outside"), me)
        for t in f.targets:
            edge(me, node(f"table:{t.key}", "table"))
        if f.external_target:
            edge(me, node(f"outside:{f.external_target}", "outside"))
    return nodes


def layout(nodes: dict[str, Node]) -> tuple[float, float]:
    """Place the nodes; returns the drawing's (width, height)."""
    order = list(TopologicalSorter({n.id: n.pred for n in nodes.values()}).static_order())
    for id in order:
        n = nodes[id]
        n.rank = max((nodes[p].rank + 1 for p in n.pred), default=0)
    ranks: list[list[Node]] = [[] for _ in range(max(n.rank for n in nodes.values()) + 1)]
    for id in order:
        ranks[nodes[id].rank].append(nodes[id])
    index = {n.id: i for rank in ranks for i, n in enumerate(rank)}

    def sweep(rank: list[Node], neighbours: Callable[[Node], Sequence[str]]) -> None:
        def centre(n: Node) -> float:
            near = neighbours(n)
            return sum(index[m] for m in near) / len(near) if near else index[n.id]

        rank.sort(key=centre)
        for i, n in enumerate(rank):
            index[n.id] = i

    for _ in range(SWEEPS):
        for rank in ranks[1:]:
            sweep(rank, lambda n: n.pred)
        for rank in reversed(ranks[:-1]):
            sweep(rank, lambda n: n.succ)
    widths = [sum(n.width for n in rank) + GAP_X * (len(rank) - 1) for rank in ranks]
    width = max(widths) + 2 * MARGIN
    y = float(MARGIN)
    for rank, w in zip(ranks, widths, strict=True):
        x = (width - w) / 2
        height = max(n.height for n in rank)
        for n in rank:
            n.x, n.y = x, y + (height - n.height) / 2
            x += n.width + GAP_X
        y += height + GAP_Y
    return width, y - GAP_Y + MARGIN


def age(seconds: float) -> str:
    """A duration as people read it: ``45 s``, ``12 min``, ``5 h``, ``3 d``, ``2.1 y``."""
    for limit, unit, size in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600), (63072000, "d", 86400)):
        if seconds < limit:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 31557600:.1f} y"


def _text(x: float, y: float, text: str, cls: str) -> str:
    return f'<text x="{x:.0f}" y="{y:.0f}" class="{cls}">{escape(text)}</text>'


def _table(n: Node, t: Table, now_s: float, behind: int | None) -> str:
    counts = t.outcomes
    attrs = {
        "class": f"node table-node outcome-{t.worst or 'none'}" + ("" if t.exists else " missing"),
        "data-table": t.key,
        "data-rows": str(t.rows),
        **{f"data-{o}": str(counts.get(o, 0)) for o in ("passed", "warned", "dropped", "failed")},
    }
    lines = [
        _text(n.x + 10, n.y + 20, t.key, "title"),
        _text(n.x + 10, n.y + 40, f"{t.rows:,} rows · v{t.version}" if t.exists else "not created yet", "line rows"),
    ]
    if t.newest is not None:
        lines.append(_text(n.x + 10, n.y + 58, f"newest row {age(max(0.0, now_s - t.newest.timestamp()))} old", "line"))
    if behind is not None:
        lag = f"{behind} source version(s) behind" if behind else "up to date with its source"
        lines.append(_text(n.x + 10, n.y + 76, lag, "line lag" if behind else "line dim"))
    if t.results:
        parts = [f"{counts.get(o, 0)} {o}" for o in ("passed", "warned", "dropped", "failed") if counts.get(o)]
        lines.append(_text(n.x + 10, n.y + 96, "expectations: " + ", ".join(parts), "line quality"))
    else:
        lines.append(_text(n.x + 10, n.y + 96, "no expectation results", "line dim"))
    body = f'<rect x="{n.x:.0f}" y="{n.y:.0f}" width="{n.width}" height="{n.height}" rx="6"/>' + "".join(lines)
    return _group(attrs, body, t.page)


def _flow(n: Node, fn: FlowNode) -> str:
    last = fn.last
    status = last.status if last else "never run"
    attrs = {"class": f"node flow-node status-{status.replace(' ', '-')}", "data-flow": fn.name, "data-status": status}
    first = f"{status}" + (f" · {last.seconds:.1f} s" if last and last.seconds is not None else "")
    if last is not None:
        first += f" · {last.rows_in:,} → {last.rows_out:,} rows"
    lines = [_text(n.x + 10, n.y + 20, fn.name, "title"), _text(n.x + 10, n.y + 38, first, "line")]
    if fn.behind:
        lines.append(_text(n.x + 10, n.y + 54, f"{fn.behind} source version(s) not read yet", "line lag"))
    elif fn.flow.mode == "ingest":
        lines.append(_text(n.x + 10, n.y + 54, f"from {fn.flow.external_source}", "line dim"))
    body = f'<rect x="{n.x:.0f}" y="{n.y:.0f}" width="{n.width}" height="{n.height}" rx="{n.height // 2}"/>' + "".join(
        lines
    )
    return _group(attrs, body, last.page if last else None)


def _outside(n: Node) -> str:
    name = n.id.partition(":")[2]
    body = (
        f'<rect x="{n.x:.0f}" y="{n.y:.0f}" width="{n.width}" height="{n.height}" rx="4"/>'
        f'<text x="{n.x + n.width / 2:.0f}" y="{n.y + 25:.0f}" class="title" text-anchor="middle">{escape(name)}</text>'
    )
    return _group({"class": "node outside-node", "data-outside": name}, body, None)


def _group(attrs: dict[str, str], body: str, href: str | None) -> str:
    g = "<g " + " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items()) + ">" + body + "</g>"
    return f'<a href="{escape(href)}">{g}</a>' if href else g


def _edge(a: Node, b: Node) -> str:
    x1, y1 = a.x + a.width / 2, a.y + a.height
    x2, y2 = b.x + b.width / 2, b.y
    bend = max(24.0, (y2 - y1) / 2)
    return (
        f'<path class="edge" d="M{x1:.0f},{y1:.0f} C{x1:.0f},{y1 + bend:.0f} {x2:.0f},{y2 - bend:.0f} '
        f'{x2:.0f},{y2:.0f}" marker-end="url(#arrow)"/>'
    )


def svg(report: Report) -> str:
    """The flow graph as an inline ``<svg>`` element."""
    nodes = nodes_of(report)
    width, height = layout(nodes)
    flows = {f"flow:{f.name}": f for f in report.flows}
    now_s = report.generated_at.timestamp()
    edges = [_edge(n, nodes[s]) for n in nodes.values() for s in n.succ]
    drawn = []
    for n in nodes.values():
        if n.kind == "table":
            t = report.tables[n.id.partition(":")[2]]
            lags = [f.behind for f in report.flows if f.name in t.writers and f.behind is not None]
            drawn.append(_table(n, t, now_s, max(lags) if lags else None))
        elif n.kind == "flow":
            drawn.append(_flow(n, flows[n.id]))
        else:
            drawn.append(_outside(n))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="flow-graph" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="flow graph">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="arrow"/></marker></defs>'
        + "".join(edges)
        + "".join(drawn)
        + "</svg>"
    )
