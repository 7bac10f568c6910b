"""The NVIDIA driver's user-space files under the node's driver root: libraries and tools.

The node agent needs them itself (NVML for the inventory, ``nvidia-smi`` and the MPS control
program for GPU settings) and, where the NVIDIA Container Toolkit's CDI spec is absent, brings them
into the claims' containers. Both find them here, under ``--driver-root`` (the host's root, or a
containerized driver's, as this process sees it), never through a runtime hook or the agent's own
image.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dra_gpu.host import ldcache_hook

LIBRARIES = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-gpucomp.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
)
"""The compute libraries of the toolkit's list: the CUDA driver API, NVML, the PTX JIT compiler that
libcuda loads for PTX-only kernels, the GPU compiler libcuda needs since about R530, NVVM for JIT LTO,
and the debugger back end (cuda-gdb). Table in docs/device-access.md."""
REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
"""Without these a claim's container cannot use the GPU; the others only some programs need, and an
older driver lacks some of them."""
DEV_LINKS = ldcache_hook.DEV_LINKS
"""Development names a program links with (`-lcuda`, as Triton does) and the soname each points to;
the `update-ldcache` hook makes them next to the libraries, as the toolkit's symlink hook does."""
HOST_PYTHON = "usr/bin/python3"
"""Where the host's python3 is, if it has one: the `update-ldcache` hook is then the Python one."""
KERNEL_VERSION_FILE = "module/nvidia/version"
"""Under /sys: the loaded kernel module's version, which NVML reports as the driver version."""
EXECUTABLES = ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
)
EXECUTABLE_DIRS = ("usr/bin", "usr/local/bin", "bin", "usr/sbin", "sbin")
NVML_SONAME = "libnvidia-ml.so.1"
LDCACHE_HOOK = "update-ldcache"


def host_python(driver_root: Path, host_root: Path | None = None) -> str | None:
    """The host's python3 as the host sees it, where the driver root is the host's own root and has one;
    None otherwise (a containerized driver's root holds that container's python, not the host's)."""
    if (host_root or driver_root) != Path("/"):
        return None
    return "/" + HOST_PYTHON if os.access(driver_root / HOST_PYTHON, os.X_OK) else None


def ldcache_hook_text(python: str | None) -> bytes:
    """The hook: `ldcache_hook` run by `python` (the host's; `-I`: no environment, no user site), or
    without one the POSIX shell script that needs only /bin/sh and ldconfig."""
    if python is None:
        return resources.files("dra_gpu").joinpath("templates", "hooks", LDCACHE_HOOK).read_bytes()
    source = resources.files("dra_gpu").joinpath("host", "ldcache_hook.py").read_bytes()
    return f"#!{python} -I\n".encode() + source


def install_ldcache_hook(directory: Path, python: str | None = None) -> Path:
    """Put the `update-ldcache` OCI hook into `directory`; its path.

    Claims' CDI specs name it as a ``createContainer`` hook. The container runtime runs it on the host,
    where this package is not installed: with the host's python3 (`host_python`) it is `ldcache_hook`
    (a JSON parser, no check-then-act on a container's paths); without one, a POSIX shell script.
    `directory` must be at the same path on the host (the agent's state directory is). Written next to
    itself and renamed: a runtime never runs a partial file.
    """
    script = ldcache_hook_text(python)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LDCACHE_HOOK
    if target.is_file() and target.read_bytes() == script and os.access(target, os.X_OK):
        return target
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{LDCACHE_HOOK}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(script)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@dataclass(frozen=True)
class DriverFiles:
    """Paths relative to the driver root."""

    libraries: tuple[Path, ...]
    executables: tuple[Path, ...]

    def missing_libraries(self) -> list[str]:
        """The required libraries (`REQUIRED_LIBRARIES`) not found."""
        found = {p.name.split(".so")[0] for p in self.libraries}
        return [name for name in REQUIRED_LIBRARIES if name.split(".so")[0] not in found]


def _version(name: str, stem: str) -> tuple[int, ...]:
    tail = name[len(stem) :].lstrip(".")
    return tuple(int(p) for p in re.findall(r"\d+", tail))


def kernel_driver_version(sys_root: Path = Path("/sys")) -> str | None:
    """The loaded NVIDIA kernel module's version (what NVML reports); None without one."""
    try:
        return (sys_root / KERNEL_VERSION_FILE).read_text().strip() or None
    except OSError:
        return None


def find_library(root: Path, stem: str, version: str | None = None) -> Path | None:
    """The driver's file of library `stem` (e.g. ``libcuda.so``), relative to `root`.

    With `version` (the driver version NVML reports), exactly ``<stem>.<version>``: a leftover of an
    older driver beside it would pair the kernel module with the wrong user-space library, which
    fails at cuInit. Without, the regular file with the highest version, not one of its symlinks.
    """
    if version is not None:
        for directory in LIBRARY_DIRS:
            candidate = Path(directory) / f"{stem}.{version}"
            if (root / candidate).is_file() and not (root / candidate).is_symlink():
                return candidate
        return None
    best: tuple[tuple[int, ...], Path] | None = None
    for directory in LIBRARY_DIRS:
        try:
            entries = list(os.scandir(root / directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(stem + ".") or not entry.is_file(follow_symlinks=False):
                continue
            numbers = _version(entry.name, stem)
            if not numbers:
                continue
            if best is None or numbers > best[0]:
                best = (numbers, Path(directory) / entry.name)
        if best is not None:
            return best[1]
    return None


def find_executable(root: Path, name: str) -> Path | None:
    for directory in EXECUTABLE_DIRS:
        candidate = root / directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return Path(directory) / name
    return None


def find_driver_files(root: Path, version: str | None = None) -> DriverFiles:
    """The driver's files under `root`; with `version`, only the libraries of exactly that driver."""
    libraries = tuple(p for p in (find_library(root, stem, version) for stem in LIBRARIES) if p is not None)
    executables = tuple(p for p in (find_executable(root, name) for name in EXECUTABLES) if p is not None)
    return DriverFiles(libraries, executables)


def tool_path(root: Path, name: str) -> str:
    """The absolute path of a driver tool under `root`, or its bare name (found on PATH) if absent."""
    found = find_executable(root, name)
    return str(root / found) if found is not None else name


def tool_env(root: Path, link_dir: Path, version: str | None = None) -> dict[str, str]:
    """What the driver's tools need to find the driver's libraries when `root` is not this system's.

    `link_dir` gets a soname link to each driver library under `root` (of `version`, by default the
    loaded kernel module's) and nothing else, so the tools (and what they start: the MPS server)
    load the driver's libraries, and no other host library shadows this system's own.
    """
    if root == Path("/"):
        return {}
    version = version or kernel_driver_version()
    # The control daemon starts `nvidia-cuda-mps-server` by name when its first client connects:
    # the driver root's tool directories come first on PATH (NVIDIA's device plugin chroots for this).
    tool_dirs = [str(root / d) for d in EXECUTABLE_DIRS if (root / d / "nvidia-cuda-mps-server").is_file()]
    path = os.pathsep.join([*tool_dirs, os.environ.get("PATH") or os.defpath])
    link_dir.mkdir(parents=True, exist_ok=True)
    for stem in LIBRARIES:
        found = find_library(root, stem, version)
        if found is None:
            continue
        link = link_dir / f"{stem}.1"
        tmp = link_dir / f".{link.name}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(root / found)
        tmp.replace(link)
    return {"LD_LIBRARY_PATH": str(link_dir), "PATH": path}


def load_nvml(root: Path) -> Path | None:
    """Make pynvml use the NVML library under `root` (before its first nvmlInit); the file loaded.

    pynvml loads ``libnvidia-ml.so.1`` by name, which finds the driver only where the agent's own
    loader looks (its image, or a legacy runtime hook's injection). Under a driver root that is not
    this system's, the library is loaded by path here instead.
    """
    if root == Path("/"):
        return None
    found = find_library(root, "libnvidia-ml.so", kernel_driver_version())
    if found is None:
        return None
    import ctypes

    import pynvml

    path = root / found
    pynvml.nvmlLib = ctypes.CDLL(str(path))
    return path
