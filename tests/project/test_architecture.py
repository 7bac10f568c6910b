"""docs/architecture.md is made from docs/architecture.yaml and what it names is in the code, so it cannot rot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from repo_paths import ROOT

TOOL = ROOT / "tools" / "architecture.py"


@pytest.fixture(scope="module")
def architecture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["architecture"] = module
    spec.loader.exec_module(module)
    return module


def test_the_architecture_page_is_rendered_from_its_description(architecture: ModuleType) -> None:
    page = architecture.render(architecture.load())
    assert architecture.PAGE.read_text() == page, "run python tools/architecture.py --write"
    assert architecture.main(["--check"]) == 0


def test_every_process_socket_and_file_the_picture_names_is_in_the_code(architecture: ModuleType) -> None:
    description = architecture.load()
    assert architecture.missing_names(description) == []
    kinds = {n["kind"] for n in architecture.nodes(description)}
    assert kinds == {"process", "socket", "file"}


def test_a_renamed_constant_or_a_missing_file_is_reported(architecture: ModuleType, tmp_path: Path) -> None:
    description: dict[str, Any] = {
        "groups": [
            {
                "id": "g",
                "label": "g",
                "nodes": [
                    {"id": "p", "kind": "process", "label": "p", "code": ["src/dra_gpu/no_such_module.py"]},
                    {
                        "id": "f",
                        "kind": "file",
                        "label": "board",
                        "path": "/var/lib/dra-gpu/gpus/<gpu>/bord",
                        "const": [
                            "dra_gpu.limiter_abi.board.BOARD_FILE",
                            "dra_gpu.limiter_abi.board.NO_SUCH",
                        ],
                        "text": [["src/dra_gpu/limiter_abi/board.py", "no such words"]],
                    },
                ],
            }
        ],
        "edges": [["p", "gone", "reads"]],
    }
    problems = architecture.missing_names(description)
    assert any("no file src/dra_gpu/no_such_module.py" in p for p in problems)
    assert any("BOARD_FILE is 'board'" in p for p in problems)
    assert any("NO_SUCH is not in the code" in p for p in problems)
    assert any("does not say 'no such words'" in p for p in problems)
    assert any("no node gone" in p for p in problems)
