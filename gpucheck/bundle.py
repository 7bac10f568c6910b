"""The project's Python dependencies that a GPU node may lack, as wheels that travel with the tree.

`python -m gpucheck.bundle DIR` (run by `make gpu-check-bundle` on a machine with a package
registry, in the project's environment) downloads, for CPython 3.12 (GPU_CHECK_PYTHON_VERSION) on
manylinux x86_64, the wheels of `ROOTS` and what they require, less what the node has, at the
versions installed in the running environment (the versions the tests ran with). On the GPU node, `unpack` extracts them into a folder that goes first on PYTHONPATH; no pip,
no network. The Kubernetes client is not bundled: the node path imports it only when it talks to
a real API server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

ROOTS = (
    "pydantic",
    # The generated gRPC and protobuf modules check the runtime's version: bring the one they need.
    "grpcio",
    "grpcio-health-checking",
    "protobuf",
    # The CLI imports every command, the controller's allocator (CEL) included.
    "common-expression-language",
)
NODE_HAS = ("jinja2", "markupsafe", "pyyaml", "prometheus-client", "nvidia-ml-py")
"""What the GPU node provides itself (with PyTorch and CuPy): not bundled."""
PYTHON_VERSION = os.environ.get("GPU_CHECK_PYTHON_VERSION") or "3.12"
"""The GPU node's Python (`make gpu-check-bundle GPU_CHECK_PYTHON_VERSION=3.11` for another one)."""
PLATFORMS = (
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
)
MARKER = ".unpacked.json"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...] = ROOTS) -> list[str]:
    """The roots and every distribution they require (extras left out), as installed here."""
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in NODE_HAS:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name in map(_norm, roots):
                raise SystemExit(
                    f"gpu-check-bundle: {name} is not installed in this environment ({sys.executable}); "
                    "run it with the project's environment (make venv)"
                ) from None
            continue  # a requirement for another platform or Python
        seen[name] = dist.version
        for requirement in dist.requires or []:
            if "extra" in requirement.partition(";")[2]:
                continue
            match = re.match(r"[A-Za-z0-9._-]+", requirement)
            if match:
                todo.append(match.group(0))
    return sorted(f"{name}=={version}" for name, version in seen.items())


def download(target: Path) -> int:
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.whl"):
        old.unlink()
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    argv += ["--python-version", PYTHON_VERSION, "--implementation", "cp"]
    argv += ["--abi", f"cp{PYTHON_VERSION.replace('.', '')}", "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    argv += ["--dest", str(target), *closure()]
    done = subprocess.run(argv, check=False)
    if done.returncode != 0:
        print(f"gpu-check-bundle: pip download failed (exit {done.returncode})", file=sys.stderr)
        return 1
    wheels = sorted(target.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"gpu-check-bundle: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {target}")
    return 0


def unpack(wheels: Path, site: Path) -> list[str]:
    """Extract every wheel of `wheels` into `site` (once per set of wheels); the wheels' names."""
    found = sorted(w.name for w in wheels.glob("*.whl")) if wheels.is_dir() else []
    marker = site / MARKER
    if found and marker.is_file() and json.loads(marker.read_text()) == found:
        return found
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    for name in found:
        with zipfile.ZipFile(wheels / name) as zf:
            for member in zf.namelist():
                parts = member.split("/")
                # `<dist>.data/purelib/...` and `.../platlib/...` belong in site-packages itself.
                if len(parts) > 2 and parts[0].endswith(".data"):
                    if parts[1] not in ("purelib", "platlib"):
                        continue
                    dest = site.joinpath(*parts[2:])
                else:
                    dest = site / member
                if member.endswith("/"):
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
    marker.write_text(json.dumps(found))
    return found


def foreign(wheels: list[str], version: tuple[int, int] = sys.version_info[:2]) -> list[str]:
    """The wheels built for another CPython than `version` (they will not import)."""
    tag = f"cp{version[0]}{version[1]}"
    return [w for w in wheels if (m := re.search(r"-(cp3\d+)-(cp3\d+)-", w)) and m.group(2) != tag]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpucheck.bundle DIR", file=sys.stderr)
        return 2
    return download(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
