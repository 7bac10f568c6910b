#!/usr/bin/env python3
"""Print the layout figures of the limiter's C tree (native/limiter/src).

    python tools/limiter_layout.py [build dir]   (default: native/limiter/build; run `make limiter` first)

- includes: how many files include each header of the library's own (a catch-all header shows as one that
  nearly every file includes);
- include pairs: two modules whose files include each other's header (x.c includes y.h and y.c includes x.h);
- call pairs: two object files that each use a function or variable the other defines (from `nm`);
- include circles: modules that reach each other through the headers they include, over any number of steps
  (each circle is listed as the set of its modules; a pair is the shortest circle);
- largest files: the five longest .c and .h files, by lines; a .c file over LONG_LINES says whether its top
  comment gives the reason it is one file (the words "more than 600 lines").

Exits 0; ``--check`` exits 1 when any include pair, call pair or include circle is found, or a .c file over LONG_LINES
lacks its reason.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import cycles  # tools/import_graph.py: the same search for the Python imports

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "native" / "limiter" / "src"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
# Headers not named after their module (limits.h is the C library's name).
MODULE_OF = {"claim_limits.h": "limits.c"}
LONG_LINES = 600
REASON = "more than 600 lines"


def module(header: str) -> str:
    return MODULE_OF.get(header, header[:-2] + ".c")


def header(module_file: str) -> str:
    return {m: h for h, m in MODULE_OF.items()}.get(module_file, module_file[:-2] + ".h")


def includes() -> dict[str, set[str]]:
    """file name -> the library's own headers it includes (the CUDA and NVML declarations left out)."""
    own = {p.name for p in SRC.glob("*.h")} - {"cuda_min.h", "nvml_min.h"}
    return {p.name: set(INCLUDE.findall(p.read_text())) & own for p in sorted(SRC.glob("*.[ch]"))}


def include_pairs(inc: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Modules (x.c, y.c) where x.c includes y.h and y.c includes x.h."""
    pairs = set()
    for f, hs in inc.items():
        if not f.endswith(".c"):
            continue
        mine = header(f)
        for h in hs:
            other = module(h)
            if other != f and mine in inc.get(other, set()):
                pairs.add(tuple(sorted((f, other))))
    return sorted(pairs)  # type: ignore[arg-type]


def include_circles(inc: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of modules (two or more) of the graph x.c -> y.c where x.c includes y.h."""
    graph = {
        f: {m for m in map(module, hs) if m != f and m in inc} for f, hs in inc.items() if f.endswith(".c")
    }
    return cycles(graph)


def long_files() -> dict[str, bool]:
    """.c files over LONG_LINES lines -> whether the comment at their top gives the reason."""
    out = {}
    for p in sorted(SRC.glob("*.c")):
        lines = p.read_text().splitlines()
        if len(lines) > LONG_LINES:
            top = "\n".join(itertools.takewhile(lambda line: not line.startswith("#"), lines))
            out[p.name] = REASON in " ".join(top.replace("*", " ").split())
    return out


def symbols(build: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    """symbol -> the object defining it; object -> the symbols it uses from elsewhere (objects of the sources
    that exist now: one left behind by a file since removed is not counted)."""
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for obj in sorted((build / "obj").glob("*.o")):
        if not (SRC / f"{obj.stem}.c").exists():
            continue
        out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
        used[obj.stem] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                used[obj.stem].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRVWC":
                defined[parts[2]] = obj.stem
    return defined, used


def call_pairs(build: Path) -> list[tuple[str, str]]:
    defined, used = symbols(build)
    edges = {(a, defined[s]) for a, ss in used.items() for s in ss if s in defined and defined[s] != a}
    return sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})  # type: ignore[misc]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    build = Path(args[0]) if args else ROOT / "native" / "limiter" / "build"
    inc = includes()
    counts = Counter(h for hs in inc.values() for h in hs)
    print("files including each header:", ", ".join(f"{h} {n}" for h, n in counts.most_common()))
    ipairs = include_pairs(inc)
    print(f"include pairs: {len(ipairs)}", " ".join(f"{a}<->{b}" for a, b in ipairs))
    if (build / "obj").is_dir():
        cpairs = call_pairs(build)
        print(f"call pairs: {len(cpairs)}", " ".join(f"{a}<->{b}" for a, b in cpairs))
    else:
        cpairs = []
        print(f"call pairs: no objects under {build}/obj (build the library first)")
    circles = include_circles(inc)
    print(f"include circles: {len(circles)}", " ".join("(" + " ".join(c) + ")" for c in circles))
    sizes = sorted(((len(p.read_text().splitlines()), p.name) for p in SRC.glob("*.[ch]")), reverse=True)
    long = long_files()

    def size(name: str, n: int) -> str:
        if name not in long:
            return f"{name} {n}"
        return f"{name} {n} ({'has its reason at top' if long[name] else 'needs a reason at its top, or a split'})"

    shown = [name for _, name in sizes[:5]]
    print("largest files:", ", ".join(size(name, n) for n, name in sizes if name in shown or name in long))
    unexplained = [name for name, ok in long.items() if not ok]
    return 1 if check and (ipairs or cpairs or circles or unexplained) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
