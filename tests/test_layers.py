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
        "from pipelines.settings import AggregationSettings\n"
        "import pipelines.errors as errors\n"
        "from pipelines_extra import x\n"
        "def f():\n"
        "    from pipelines import jobs\n"
    )
    assert edge_imports(source) == [
        "2: from pipelines.settings import AggregationSettings",
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


#: "No module over about 500 lines": the package's modules stay small enough to read whole.
MAX_MODULE_LINES = 500


def test_no_module_of_the_package_is_over_about_500_lines() -> None:
    modules = [p for top in (*LAYERS, EDGE) for p in (ROOT / top).rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def test_no_flow_code_sees_a_context() -> None:
    """The flows' code (pipelines/jobs/, beside the run-once entry points of its ``__init__``)
    gets its batch, its typed config and its record: it never names ``Context``, the runner's."""
    modules = [p for p in sorted((ROOT / EDGE / "jobs").glob("*.py")) if p.name != "__init__.py"]
    assert modules
    offending = []
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id == "Context":
                offending.append(f"{module.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and any(a.name == "Context" for a in node.names):
                offending.append(f"{module.relative_to(ROOT)}:{node.lineno}")
    assert not offending, "flow code that takes a Context:\n" + "\n".join(offending)
