"""The layers hold the logic and never reach for the edge: no module of bronze/, silver/, gold/ or
expectations/ imports pipelines (pipelines imports them, never the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("bronze", "silver", "gold", "expectations")
EDGE = "pipelines"


def edge_imports(source: str) -> list[str]:
    """``line: statement`` for each import of the edge in ``source``, at any depth: an import inside
    a function ties the layer to the edge as much as one at the top."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == EDGE or name.startswith(EDGE + ".") for name in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_top_level_lazy_and_aliased_imports_of_the_edge_are_all_found() -> None:
    source = (
        "import os\n"
        "from pipelines.config.settings import AggregationSettings\n"
        "import pipelines.errors as errors\n"
        "from pipelines_extra import x\n"
        "def f():\n"
        "    from pipelines import jobs\n"
    )
    assert edge_imports(source) == [
        "2: from pipelines.config.settings import AggregationSettings",
        "3: import pipelines.errors as errors",
        "6: from pipelines import jobs",
    ]


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_module_imports_pipelines(layer: str) -> None:
    modules = sorted((ROOT / layer).rglob("*.py"))
    assert modules, f"{layer}/ holds no modules"
    offending = [
        f"{module.relative_to(ROOT)}:{line}"
        for module in modules
        for line in edge_imports(module.read_text(encoding="utf-8"))
    ]
    assert not offending, f"{layer}/ imports {EDGE}/; pass plain values or a config object in:\n" + "\n".join(offending)


#: No module over 450 lines, the tests' helper modules included: modules are split by what they
#: do before they near it.
MAX_MODULE_LINES = 450
#: No function over 60 lines outside the bench and the tests.
MAX_FUNCTION_LINES = 60


def test_no_module_is_over_450_lines() -> None:
    modules = [p for top in (*LAYERS, EDGE) for p in (ROOT / top).rglob("*.py")]
    modules += [p for p in (ROOT / "tests").rglob("*.py") if not p.name.startswith("test_")]
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules by what they do (over {MAX_MODULE_LINES} lines): {long}"


def test_no_function_is_over_60_lines_outside_the_bench() -> None:
    long = {}
    for top in (*LAYERS, EDGE):
        for path in (ROOT / top).rglob("*.py"):
            if "bench" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = length
    assert not long, f"split these functions (over {MAX_FUNCTION_LINES} lines): {long}"


def test_no_flow_code_sees_a_context() -> None:
    """The flows' code (pipelines/flows/, beside the registry in its ``__init__``) gets its batch,
    its typed config and its record: it never names ``Context``, the runner's."""
    modules = [p for p in sorted((ROOT / EDGE / "flows").glob("*.py")) if p.name != "__init__.py"]
    assert modules
    offending = []
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id == "Context":
                offending.append(f"{module.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and any(a.name == "Context" for a in node.names):
                offending.append(f"{module.relative_to(ROOT)}:{node.lineno}")
    assert not offending, "flow code that takes a Context:\n" + "\n".join(offending)


def import_graph(root: Path, tops: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth (inside functions and under
    ``TYPE_CHECKING`` too): ``from a import b`` names ``a.b`` when that is a module, else ``a``."""
    files = {}
    for top in tops:
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else known(base) for a in node.names)
        graph[module] = {m for m in found if m is not None and m != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, directly or through others: each strongly connected
    set of more than one module, sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            members = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(members) > 1:
                cycles.append(sorted(members))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(cycles)


def test_a_cycle_closed_by_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name, text in {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import f\n",
        "pkg/b.py": "def f():\n    from pkg import c\n",
        "pkg/sub/__init__.py": "",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
        "pkg/sub/d.py": "from ..a import x\nfrom . import e\n",
        "pkg/sub/e.py": "import pkg.sub.d as d\n",
        "pkg/lone.py": "import pkg.a\n",
    }.items():
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.sub.d"] == {"pkg.a", "pkg.sub.e"} and graph["pkg.lone"] == {"pkg.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub.d", "pkg.sub.e"]]


def test_no_import_cycle() -> None:
    """No module imports itself through others, imports inside functions and under
    ``TYPE_CHECKING`` included: the flow types are a leaf, the registry imports the flows' code, and
    the dispatch (:mod:`pipelines.runtime.passes`) imports both."""
    assert import_cycles(import_graph(ROOT, (*LAYERS, EDGE))) == []
