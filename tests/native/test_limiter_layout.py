"""The limiter's C tree is modules with a header each: no catch-all header, and every header compiles on its own
(it includes what it uses), so a file that includes one module's header gets that module and nothing else."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

from repo_paths import ROOT

SRC = ROOT / "native" / "limiter" / "src"
BASE = {"common.h", "cuda_min.h", "nvml_min.h"}


def layout_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("limiter_layout", ROOT / "tools" / "limiter_layout.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_module_header_belongs_to_a_source_file() -> None:
    tool = layout_tool()
    headers = {p.name for p in SRC.glob("*.h")} - BASE
    orphans = sorted(h for h in headers if not (SRC / tool.module(h)).exists())
    assert not orphans, f"headers that are no module's interface: {orphans}"


def test_no_header_includes_every_module() -> None:
    """What limiter.h was: one header that declared every module, included by nearly every file."""
    tool = layout_tool()
    inc = tool.includes()
    for f, hs in inc.items():
        if f.endswith(".h"):
            assert len(hs - {"common.h"}) <= 2, f"{f} includes {sorted(hs)}"
    assert not (SRC / "limiter.h").exists()


def test_each_header_compiles_on_its_own(tmp_path: Path) -> None:
    unit = tmp_path / "unit.c"
    failed = []
    for h in sorted(SRC.glob("*.h")):
        unit.write_text(f'#include "{h.name}"\n')
        r = subprocess.run(
            ["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{SRC}", str(unit)],
            capture_output=True,
            text=True,
        )
        if r.returncode:
            failed.append(f"{h.name}: {r.stderr.strip().splitlines()[0]}")
    assert not failed, failed
