"""The node agent's own code that the checks use, loaded from its files.

`commands()`: the agent's GPU commands (`src/dra_gpu/host/nvidia.py`). `module()`: any other
module of the agent that needs only the standard library (the layouts of the elastic-compute board and
activity files, of the limiter's region). Importing them the usual way first runs their packages'
`__init__`, which need grpc, pydantic or prometheus-client. Loading the file alone keeps the checks
running on exactly the agent's code even where the project's other dependencies are missing.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

SRC = Path(__file__).resolve().parent.parent / "src/dra_gpu"
COMMANDS = SRC / "host/nvidia.py"
NAME = "gpucheck_agent_commands"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and enums look their module up while being defined
    spec.loader.exec_module(module)
    return module


@cache
def commands() -> ModuleType:
    return _load(COMMANDS, NAME)


@cache
def module(relative: str) -> ModuleType:
    """`src/dra_gpu/<relative>`, a module of the standard library only (e.g. `limiter_abi/board.py`)."""
    return _load(SRC / relative, "gpucheck_agent_" + relative.removesuffix(".py").replace("/", "_"))
