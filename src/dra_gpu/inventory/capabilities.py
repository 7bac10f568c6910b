"""Which enforcement a GPU can have, decided from the driver version and the node's cgroup layout.

- Driver-native memory limits (NVML ``nvmlDeviceSetMemoryLimits_v1``) need release 615 or later, a
  cgroup-v2 hierarchy (the limit is set on a cgroup-v2 directory), and a GPU that is not in MIG mode
  (MIG is not covered). The driver enforces them with the kernel's ``dmem`` controller where the
  kernel has it, else with its own internal (``misc``) accounting, so a missing ``dmem`` controller
  changes the backend, not the answer.
- MPS v3 (named servers and namespaces with server-side limits) comes with the same release.
- Driver limits are set by a CDI hook that the container runtime runs on the host, so the hook's
  executable has to exist there (``find_limit_hook``); where it does not, the GPU keeps the limiter
  rather than take claims whose containers could never start.
- Everything else keeps the LD_PRELOAD limiter.

The answer is published as the device attribute ``memoryIsolation`` so that a DeviceClass can ask for
hard isolation, and it is what the kubelet plugin uses to pick a backend for a share.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from dra_gpu.inventory.types import GpuInfo

log = logging.getLogger(__name__)

DRIVER_MEMORY_LIMITS_MIN_MAJOR = 615
MPS_V3_MIN_MAJOR = 615
CGROUP_ROOT_ENV = "DRA_GPU_CGROUP_ROOT"
DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")
HOOK_PATH_ENV = "DRA_GPU_CDI_HOOK_PATH"
HOOK_KIND_ENV = "DRA_GPU_MEMORY_LIMIT_HOOK"
TOOLKIT_HOOK_ENV = "DRA_GPU_NVIDIA_CDI_HOOK"


class MemoryIsolation(StrEnum):
    DRIVER = "driver"
    """The NVIDIA driver caps the container's cgroup: holds against any program in the container."""
    LIMITER = "limiter"
    """Our LD_PRELOAD limiter inside the processes: holds against programs that use the dynamic loader."""


class CgroupBackend(StrEnum):
    DMEM = "dmem"
    MISC = "misc"
    """The driver-internal fallback where the kernel has no dmem controller."""
    NONE = "none"
    """No cgroup-v2 hierarchy: driver limits are impossible."""


@dataclass(frozen=True)
class CgroupLayout:
    v2: bool
    dmem: bool

    @property
    def backend(self) -> CgroupBackend:
        if not self.v2:
            return CgroupBackend.NONE
        return CgroupBackend.DMEM if self.dmem else CgroupBackend.MISC


def cgroup_root() -> Path:
    return Path(os.environ.get(CGROUP_ROOT_ENV) or DEFAULT_CGROUP_ROOT)


def read_cgroup_layout(root: Path | None = None) -> CgroupLayout:
    """cgroup v2 when the root has ``cgroup.controllers``; dmem when that file lists it."""
    controllers = (root or cgroup_root()) / "cgroup.controllers"
    try:
        names = controllers.read_text().split()
    except OSError:
        return CgroupLayout(v2=False, dmem=False)
    return CgroupLayout(v2=True, dmem="dmem" in names)


_MAJOR = re.compile(r"^\s*(\d+)")


def driver_major(version: str) -> int | None:
    match = _MAJOR.match(version)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class LimitHook:
    """The executable the container runtime runs on the host to set a container's memory limits."""

    kind: str
    """"dra-gpu" (our own `cdi-hook`) or "toolkit" (the NVIDIA Container Toolkit's `nvidia-cdi-hook`)."""
    path: str
    """Its absolute path as the host sees it; "" when there is none."""
    problem: str = ""
    """Why there is none, saying what to set; "" when `path` is usable."""


def _seen_from_here(host_path: str, driver_root: Path, host_root: Path) -> Path | None:
    """Where this process sees the host's `host_path`: under the driver root, which is `host_root` on
    the host; None when the path lies outside it."""
    try:
        relative = Path(host_path).relative_to(host_root)
    except ValueError:
        return None
    return driver_root / relative


def find_limit_hook(
    driver_root: Path = Path("/"), host_root: Path | None = None, env: Mapping[str, str] = os.environ
) -> LimitHook:
    """The memory-limit hook the host can run, checked once at start through the driver root.

    The agent usually runs in a container of its own, so a path from its own ``PATH`` means nothing
    to the host's runtime. A configured path is looked up under the driver root (the host's root,
    mounted into the agent's container); without one, only an agent that sees the host's root as its
    own (driver root ``/``) may use its own lookup.
    """
    toolkit = env.get(HOOK_KIND_ENV, "").strip() == "toolkit"
    kind, name, variable = (
        ("toolkit", "nvidia-cdi-hook", TOOLKIT_HOOK_ENV) if toolkit else ("dra-gpu", "dra-gpu", HOOK_PATH_ENV)
    )
    need = f"driver memory limits need the {name} executable on the host: "
    configured = env.get(variable, "").strip()
    if configured:
        if not os.path.isabs(configured):
            return LimitHook(kind, "", f"{need}set {variable} to an absolute path (it is {configured!r})")
        root = host_root or driver_root
        seen = _seen_from_here(configured, driver_root, root)
        if seen is None:
            return LimitHook(
                kind,
                "",
                f"{need}{variable}={configured} lies outside the driver root {root}, so it cannot be checked; install it under {root}",
            )
        if not (seen.is_file() and os.access(seen, os.X_OK)):
            return LimitHook(
                kind,
                "",
                f"{need}{variable}={configured} is not an executable file on the host (looked at {seen})",
            )
        return LimitHook(kind, configured)
    if driver_root == Path("/"):
        argv0 = sys.argv[0] if kind == "dra-gpu" and os.path.isabs(sys.argv[0]) else None
        found = shutil.which(name) or argv0
        if found and os.path.isabs(found):
            return LimitHook(kind, found)
        return LimitHook(kind, "", f"{need}set {variable} to its absolute path")
    return LimitHook(
        kind,
        "",
        f"{need}set {variable} to its path on the host (this agent sees the host under {driver_root}, "
        "and its own executable is not there)",
    )


@dataclass(frozen=True)
class Capabilities:
    memory_isolation: MemoryIsolation
    memory_limit_backend: CgroupBackend
    """dmem or misc where memory_isolation is driver, else none."""
    mps_namespaces: bool
    reason: str
    """Why memory_isolation is what it is, for the start-up log and `dra-gpu gpus`."""


def detect(
    driver_version: str, layout: CgroupLayout, mig_enabled: bool, hook_problem: str = ""
) -> Capabilities:
    """`hook_problem`: why the node has no usable memory-limit hook (`LimitHook.problem`); "" if it has one."""
    major = driver_major(driver_version)
    mps_v3 = major is not None and major >= MPS_V3_MIN_MAJOR
    limiter = MemoryIsolation.LIMITER
    if major is None or major < DRIVER_MEMORY_LIMITS_MIN_MAJOR:
        why = f"driver {driver_version or 'unknown'} predates {DRIVER_MEMORY_LIMITS_MIN_MAJOR} (no NVML memory limits)"
        return Capabilities(limiter, CgroupBackend.NONE, mps_v3, why)
    if mig_enabled:
        return Capabilities(
            limiter, CgroupBackend.NONE, mps_v3, "MIG mode is on; driver memory limits do not cover MIG"
        )
    if not layout.v2:
        why = "no cgroup-v2 hierarchy; driver memory limits are set on cgroup-v2 directories"
        return Capabilities(limiter, CgroupBackend.NONE, mps_v3, why)
    if hook_problem:
        return Capabilities(limiter, CgroupBackend.NONE, mps_v3, hook_problem)
    backend = layout.backend
    why = f"driver {driver_version} with cgroup v2 ({'dmem controller' if backend is CgroupBackend.DMEM else 'driver-internal accounting, no dmem controller'})"
    return Capabilities(MemoryIsolation.DRIVER, backend, mps_v3, why)


def with_capabilities(gpu: GpuInfo, caps: Capabilities) -> GpuInfo:
    return replace(
        gpu,
        memory_isolation=caps.memory_isolation.value,
        memory_limit_backend=caps.memory_limit_backend.value,
        mps_namespaces=caps.mps_namespaces,
        isolation_reason=caps.reason,
    )


def log_choice(gpus: Iterable[GpuInfo]) -> None:
    """One line per GPU at start-up: the enforcement it gets and why."""
    for gpu in gpus:
        log.info(
            "GPU memory isolation",
            extra={
                "gpu": gpu.uuid,
                "index": gpu.index,
                "memory_isolation": gpu.memory_isolation,
                "memory_limit_backend": gpu.memory_limit_backend,
                "mps_namespaces": gpu.mps_namespaces,
                "reason": gpu.isolation_reason,
            },
        )
