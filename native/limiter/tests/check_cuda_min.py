#!/usr/bin/env python3
"""Check that src/cuda_min.h declares exactly what the CUDA toolkit's cuda.h and cudaTypedefs.h declare.

The limiter builds against its own declarations (no toolkit needed); this check, run by the native test
suite wherever the toolkit's headers are installed, catches any drift. The C compiler does the comparing:
one translation unit includes the toolkit's headers (with their old-ABI declarations) and then restates
each declaration of cuda_min.h, so that

  * typedefs and prototypes are repeated as written (C11 accepts a repeated typedef or prototype only if
    it is the same type);
  * each enumeration constant and #define value is asserted equal to the toolkit's;
  * each structure is compiled again under another tag and asserted to have the toolkit's size, and each
    member its offset and type.

The preprocessor compares the renaming macros (cuMemAlloc -> cuMemAlloc_v2) of every name declared, and
every driver entry point that has a PFN typedef in cuda_min.h must have all of the toolkit's variants (the
fake driver derives its exported names from them). Anything in cuda_min.h this script cannot classify is an
error: a declaration nobody checks would defeat the point.

usage: check_cuda_min.py <cuda_min.h> <toolkit include dir> [<C compiler>]
Exit status: 0 when everything matches, 1 on drift, 2 on usage errors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict

PFN_RE = re.compile(r"\(CUDAAPI \*PFN_(cu\w+?)_v(\d+)(_ptsz|_ptds)?\)")
ALLOWED_DIRECTIVES = re.compile(r"#\s*(ifndef \w+|endif|include\s*<(stddef|stdint)\.h>)$")


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


class MinHeader:
    """The declarations of cuda_min.h, sorted by how each is checked."""

    def __init__(self, text: str) -> None:
        self.constants: list[tuple[str, str]] = []  # object-like #define NAME value
        self.renames: dict[str, str] = {}  # #define cuX cuY
        self.restated: list[str] = []  # typedefs and prototypes repeated verbatim
        self.enums: list[tuple[str, str, list[tuple[str, str]]]] = []  # tag, name, constants
        self.structs: list[tuple[str, str, str]] = []  # tag, name, body
        self.functions: list[str] = []  # names of prototypes as written
        self.errors: list[str] = []
        body_lines = []
        for line in strip_comments(text).splitlines():
            s = line.strip()
            if not s.startswith("#"):
                body_lines.append(line)
                continue
            m = re.fullmatch(r"#\s*define\s+(\w+)(?:\s+(.*))?", s)
            if m and m.group(1) in ("DRAGPU_CUDA_MIN_H", "CUDAAPI") and not m.group(2):
                continue
            if m and m.group(2) and re.fullmatch(r"cu\w+", m.group(2)):
                self.renames[m.group(1)] = m.group(2)
            elif m and m.group(2) and re.fullmatch(r"\(?(0x[0-9a-fA-F]+|\d+)[uUlL]*\)?", m.group(2)):
                self.constants.append((m.group(1), m.group(2)))
            elif not ALLOWED_DIRECTIVES.fullmatch(s):
                self.errors.append(f"unchecked directive: {s}")
        for stmt in split_statements("\n".join(body_lines)):
            self.classify(" ".join(stmt.split()))

    def classify(self, stmt: str) -> None:
        m = re.fullmatch(r"typedef enum (\w+) \{(.*)\} (\w+)", stmt)
        if m:
            consts = []
            for item in filter(None, (x.strip() for x in m.group(2).split(","))):
                c = re.fullmatch(r"(\w+) = (-?(?:0x[0-9a-fA-F]+|\d+))", item)
                if not c:
                    self.errors.append(f"enum {m.group(1)}: constant without an explicit value: {item}")
                    continue
                consts.append((c.group(1), c.group(2)))
            self.enums.append((m.group(1), m.group(3), consts))
            return
        m = re.fullmatch(r"typedef struct (\w+) \{(.*)\} (\w+)", stmt)
        if m:
            self.structs.append((m.group(1), m.group(3), m.group(2)))
            return
        if stmt.startswith("typedef ") and "{" not in stmt:
            self.restated.append(stmt + ";")
            return
        m = re.fullmatch(r"CUresult CUDAAPI (cu\w+)\(.*\)", stmt)
        if m:
            self.functions.append(m.group(1))
            self.restated.append(stmt + ";")
            return
        self.errors.append(f"unchecked declaration: {stmt[:100]}")


def split_statements(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == ";" and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def struct_members(body: str) -> list[tuple[str, bool]]:
    """(member name, whether its type is a nested struct/union) for one structure body; the members of an
    anonymous struct or union count as the structure's own."""
    members: list[tuple[str, bool]] = []
    for decl in split_statements(body):
        if "{" in decl:
            after = decl[decl.rindex("}") + 1 :].strip()
            if not after:
                members += struct_members(decl[decl.index("{") + 1 : decl.rindex("}")])
                continue
            m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", after)
            if m:
                members.append((m.group(1), True))
        else:
            m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl)
            if m:
                members.append((m.group(1), False))
    return members


def declarations_unit(h: MinHeader) -> str:
    lines = [
        "#define __CUDA_API_VERSION_INTERNAL 1 /* the old-ABI declarations too */",
        "#include <stddef.h>",
        "#include <cuda.h>",
        "#include <cudaTypedefs.h>",
        "#define DL_SAME_TYPE(a, b) __builtin_types_compatible_p(__typeof__(a), __typeof__(b))",
    ]
    lines += [f"#define {a} {b}" for a, b in h.renames.items()]
    for name, value in h.constants:
        lines.append(f'_Static_assert(({name}) == ({value}), "{name} is not {value} in cuda.h");')
    for tag, name, consts in h.enums:
        lines.append(f"typedef enum {tag} {name};")
        lines.append(f'_Static_assert(sizeof({name}) == sizeof(int), "{name}: size");')
        for c, v in consts:
            lines.append(f'_Static_assert({c} == ({v}), "{c} is not {v} in cuda.h");')
    for i, (tag, name, body) in enumerate(h.structs):
        mine = f"struct dlmin_check_{i}"
        lines.append(f"typedef struct {tag} {name};")
        lines.append(f"{mine} {{{body}}};")
        lines.append(f'_Static_assert(sizeof({name}) == sizeof({mine}), "{name}: size differs from cuda.h");')
        for member, nested in struct_members(body):
            where = f"{name}.{member}"
            lines.append(
                f"_Static_assert(offsetof({name}, {member}) == offsetof({mine}, {member}), "
                f'"{where}: offset differs from cuda.h");'
            )
            if nested:
                lines.append(
                    f"_Static_assert(sizeof((({name} *)0)->{member}) == sizeof((({mine} *)0)->{member}), "
                    f'"{where}: size differs from cuda.h");'
                )
            else:
                lines.append(
                    f"_Static_assert(DL_SAME_TYPE((({name} *)0)->{member}, (({mine} *)0)->{member}), "
                    f'"{where}: type differs from cuda.h");'
                )
    lines += h.restated
    return "\n".join(lines) + "\n"


def macro_unit(header: str, names: list[str]) -> str:
    return header + "\n" + "\n".join(f'DLMIN "{n}" = {n} ;' for n in names) + "\n"


def expand(cc: str, source: str, include: list[str]) -> dict[str, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write(source)
    try:
        out = subprocess.run(
            [cc, "-E", "-P", *[f"-I{d}" for d in include], f.name], capture_output=True, text=True
        )
    finally:
        os.unlink(f.name)
    if out.returncode:
        raise SystemExit(f"check_cuda_min: the preprocessor failed:\n{out.stderr}")
    return dict(re.findall(r'DLMIN "(\w+)" = (\w+) ;', out.stdout))


def pfn_variants(text: str) -> dict[str, set[tuple[int, str]]]:
    out: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for base, version, suffix in PFN_RE.findall(text):
        out[base].add((int(version), suffix))
    return out


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    min_path, include = sys.argv[1], sys.argv[2]
    cc = sys.argv[3] if len(sys.argv) == 4 else os.environ.get("CC", "cc")
    with open(min_path) as f:
        min_text = f.read()
    try:
        with open(os.path.join(include, "cudaTypedefs.h")) as f:
            real_typedefs = f.read()
        with open(os.path.join(include, "cuda.h")):
            pass
    except OSError as e:
        print(f"check_cuda_min: no toolkit headers in {include}: {e.strerror}", file=sys.stderr)
        return 2

    h = MinHeader(min_text)
    problems = list(h.errors)

    # Every ABI variant of each entry point that cuda_min.h covers.
    real = pfn_variants(real_typedefs)
    for base, mine in sorted(pfn_variants(min_text).items()):
        if mine != real.get(base, set()):
            fmt = lambda vs: ", ".join(f"v{v}{s}" for v, s in sorted(vs)) or "none"  # noqa: E731
            problems.append(f"PFN_{base}: cuda_min.h has {fmt(mine)}, cudaTypedefs.h has {fmt(real[base])}")

    # Renaming macros: each declared name, renamed name and entry point resolves to the same symbol.
    names = sorted(set(h.functions) | set(h.renames) | set(pfn_variants(min_text)))
    theirs = expand(cc, macro_unit("#include <cuda.h>", names), [include])
    ours = expand(cc, macro_unit(f'#include "{os.path.abspath(min_path)}"', names), [])
    for n in names:
        if theirs.get(n) != ours.get(n):
            problems.append(f"{n}: cuda_min.h names the symbol {ours.get(n)}, cuda.h names {theirs.get(n)}")

    # Types, values, layouts and prototypes, compared by the compiler.
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "check.c")
        with open(src, "w") as f:
            f.write(declarations_unit(h))
        out = subprocess.run(
            [cc, "-std=c11", "-Wall", "-Werror", "-fsyntax-only", f"-I{include}", src],
            capture_output=True,
            text=True,
        )
        if out.returncode:
            errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
            problems += errors or [out.stderr.strip()]

    for p in problems:
        print(f"check_cuda_min: {p}", file=sys.stderr)
    if problems:
        return 1
    n = len(h.restated) + len(h.enums) + len(h.structs) + len(h.constants) + len(h.renames)
    print(f"cuda_min.h matches the toolkit's headers ({n} declarations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
