"""The node agent's own GPU commands (`src/dra_gpu/plugin/gpu_control.py`), loaded from their file.

That module needs only the standard library, but importing it the usual way first runs the plugin
package's `__init__`, which needs grpc and pydantic. Loading the file alone keeps the compute-mode,
time-slice and MPS checks running on exactly the agent's commands even where the project's other
dependencies are missing.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

COMMANDS = Path(__file__).resolve().parent.parent / "src/dra_gpu/plugin/gpu_control.py"
NAME = "gpucheck_agent_commands"


@cache
def commands() -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, COMMANDS)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {COMMANDS}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module  # dataclasses and enums look their module up while being defined
    spec.loader.exec_module(module)
    return module
