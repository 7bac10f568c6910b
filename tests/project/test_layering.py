"""The layering of the project's Python packages: each imports only lower layers (`LAYERS` in
`tools/import_graph.py`), no import cycles between modules, no project imports inside functions."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from repo_paths import ROOT

TOOL = ROOT / "tools" / "import_graph.py"


@pytest.fixture(scope="module")
def import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_import_cycles(import_graph: ModuleType) -> None:
    graph = import_graph.build()
    assert import_graph.cycles(graph.all_edges()) == []


def test_every_package_has_a_layer_and_imports_only_lower_ones(import_graph: ModuleType) -> None:
    graph = import_graph.build()
    assert import_graph.undeclared(graph) == [], "give the new package its layer in LAYERS"
    assert import_graph.upward(graph) == [], (
        "import only packages of lower layers (LAYERS), or move the shared code down"
    )


def test_no_cycles_between_packages(import_graph: ModuleType) -> None:
    graph = import_graph.build()
    assert import_graph.cycles(import_graph.package_edges(graph)) == []


def test_the_layers_name_each_package_once(import_graph: ModuleType) -> None:
    named = [package for layer in import_graph.LAYERS for package in layer]
    assert len(named) == len(set(named))


def test_no_project_imports_inside_functions(import_graph: ModuleType) -> None:
    graph = import_graph.build()
    found = {(item.module, item.target) for item in graph.deferred}
    assert found == set(), "import at module level, or under `if TYPE_CHECKING:` for annotations"


def test_the_graph_sees_what_it_should(import_graph: ModuleType) -> None:
    graph = import_graph.build()
    assert "dra_gpu.cli" in graph.modules and "cdi.spec" in graph.modules
    assert "dra_gpu.commands" in graph.edges["dra_gpu.cli"] or any(
        target.startswith("dra_gpu.commands.") for target in graph.edges["dra_gpu.cli"]
    )
    assert not any(name.startswith("dra_gpu._proto") for name in graph.modules)


def test_the_tool_finds_a_cycle_and_a_deferred_import(import_graph: ModuleType, tmp_path: Path) -> None:
    package = tmp_path / "dra_gpu"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from dra_gpu import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dra_gpu import c\n"
        "def f():\n    from dra_gpu.a import x\n"
    )
    (package / "c.py").write_text("import dra_gpu.b\n")
    graph = import_graph.build(tmp_path)
    assert [(item.module, item.target) for item in graph.deferred] == [("dra_gpu.b", "dra_gpu.a")]
    assert import_graph.cycles(graph.edges) == []
    assert import_graph.cycles(graph.all_edges()) == [["dra_gpu.a", "dra_gpu.b"]]
    assert import_graph.cycles(graph.all_edges(typing=True)) == [["dra_gpu.a", "dra_gpu.b", "dra_gpu.c"]]


def test_the_tool_finds_an_upward_import_and_an_undeclared_package(
    import_graph: ModuleType, tmp_path: Path
) -> None:
    package = tmp_path / "dra_gpu"
    for name in ("low", "high", "new"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "high" / "a.py").write_text("from dra_gpu.low import b\n")
    (package / "low" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dra_gpu.high import a\n"
    )
    (package / "new" / "c.py").write_text("")
    graph = import_graph.build(tmp_path)
    layers = (("dra_gpu",), ("low",), ("high",))
    assert import_graph.upward(graph, layers) == [("dra_gpu.low.b", "dra_gpu.high.a")]
    assert import_graph.undeclared(graph, layers) == ["new"]
    assert import_graph.cycles(import_graph.package_edges(graph)) == []
    (package / "low" / "b.py").write_text("from dra_gpu.high import a\n")
    assert import_graph.cycles(import_graph.package_edges(import_graph.build(tmp_path))) == [["high", "low"]]


LONG = 500
"""Lines of Python a module of src/ may have before its opening docstring must say why it is longer."""


def test_no_long_module_without_a_reason() -> None:
    src = TOOL.parent.parent / "src"
    unexplained = []
    for path in sorted(src.rglob("*.py")):
        if "_proto" in path.parts:
            continue  # generated
        text = path.read_text()
        if text.count("\n") > LONG and f"Longer than {LONG} lines:" not in (
            ast.get_docstring(ast.parse(text)) or ""
        ):
            unexplained.append(str(path.relative_to(src)))
    assert unexplained == [], (
        f"split these, or say in their docstrings why not ('Longer than {LONG} lines: ...')"
    )
