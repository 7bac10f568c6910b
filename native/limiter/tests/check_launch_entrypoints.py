#!/usr/bin/env python3
"""Check that every launch entry point the driver API declares is throttled on every route.

The list is generated from the header, not kept by hand: every function cuda.h declares whose name starts with
cuLaunch or cuGraphLaunch (the toolkit's cuda.h and cudaTypedefs.h where installed; else the project's own
src/cuda_min.h, which tests/check_cuda_min.py keeps equal to the toolkit's), in every ABI variant its PFN typedefs
name (legacy and per-thread stream), except the ones that launch no GPU work (HOST_ONLY). A new launch call in a
newer cuda.h, or one the library forgot, fails here: t_entrypoints checks that dlsym, dlvsym and cuGetProcAddress
all hand out the limiter's wrapper of each, and it must be exported (every wrapper throttles).

usage: check_launch_entrypoints.py <cuda_min.h> <toolkit include dir or ""> <t_entrypoints> [<LD_PRELOAD>]
Exit status: 0 when every entry point is covered, 1 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake"))
from gen_proctable import exported_names, parse_typedefs

# Launch calls that run host work, not kernels: nothing of the GPU's time to charge.
HOST_ONLY = {"cuLaunchHostFunc": "enqueues a host function: it runs on the CPU"}
LAUNCH = re.compile(r"\bCUresult\s+CUDAAPI\s+(cu(?:Graph)?Launch\w*)\s*\(")


def strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    cuda_min, toolkit, program = sys.argv[1:4]
    preload = sys.argv[4] if len(sys.argv) > 4 else ""
    paths = (
        [os.path.join(toolkit, "cuda.h"), os.path.join(toolkit, "cudaTypedefs.h")] if toolkit else [cuda_min]
    )
    text = ""
    for path in paths:
        with open(path) as f:
            text += strip_comments(f.read()) + "\n"
    variants = parse_typedefs(text)
    bases = sorted({m.group(1) for m in LAUNCH.finditer(text)})
    # A declared base name without _ptsz/_v2 suffix is the base; suffixed prototypes are its variants.
    bases = sorted({b for b in bases if not re.search(r"_(v\d+|ptsz|ptds)$", b)})
    specs, missing = [], []
    for base in bases:
        if base in HOST_ONLY:
            continue
        if base not in variants:
            missing.append(f"{base}: no PFN typedef to derive its exported variants from")
            continue
        for version, suffix, name in exported_names(base, variants[base]):
            specs.append(f"{name}:{base}:{version}:{1 if suffix else 0}")
    if missing:
        print("check_launch_entrypoints: " + "; ".join(missing), file=sys.stderr)
        return 1
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = preload
    r = subprocess.run([program, "routes", *specs], env=env, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        return 1
    source = "the toolkit's cuda.h" if toolkit else "cuda_min.h"
    print(
        f"check_launch_entrypoints: {len(specs)} variants of {len(bases)} launch calls in {source} throttled"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
