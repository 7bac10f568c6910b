"""The limiter's C tree is modules with a header each: no catch-all header, and every header compiles on its own
(it includes what it uses), so a file that includes one module's header gets that module and nothing else; no two
modules include each other's header or call each other, and a file too long to read whole says why it is one file."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
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


@pytest.mark.limiter
def test_no_two_modules_include_or_call_each_other(built: Path) -> None:
    """tools/limiter_layout.py --check against the built library: each pair it finds is named."""
    tool = layout_tool()
    objects = [o for o in (built / "obj").glob("*.o") if (SRC / f"{o.stem}.c").exists()]
    assert objects, f"no objects of the library's sources under {built / 'obj'}"
    include_pairs = [f"{a}<->{b}" for a, b in tool.include_pairs(tool.includes())]
    assert not include_pairs, f"modules whose files include each other's header: {include_pairs}"
    call_pairs = [f"{a}<->{b}" for a, b in tool.call_pairs(built)]
    assert not call_pairs, f"modules that each call (or use a variable of) the other: {call_pairs}"


def test_no_include_circle() -> None:
    """No modules reach each other through their headers over any number of steps (tools/limiter_layout.py): a
    module lower down that needs something of one above it takes it in turned round (fork.h: the modules declare
    their fork handlers, init.c walks them)."""
    tool = layout_tool()
    circles = tool.include_circles(tool.includes())
    assert not circles, f"include circles: {circles}"


def test_long_files_say_why_they_are_one_file() -> None:
    tool = layout_tool()
    unexplained = sorted(name for name, has_reason in tool.long_files().items() if not has_reason)
    assert not unexplained, (
        f"files over {tool.LONG_LINES} lines without the reason at their top ({tool.REASON!r}): {unexplained}"
    )


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
