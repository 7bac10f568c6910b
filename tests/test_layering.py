"""The layering of the project's Python modules: no import cycles, no project imports inside functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "import_graph.py"


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
