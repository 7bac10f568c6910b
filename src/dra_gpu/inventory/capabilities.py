"""Which enforcement a GPU can have, decided from the driver version and the node's cgroup layout.

- Driver-native memory limits (NVML ``nvmlDeviceSetMemoryLimits_v1``) need release 615 or later, a
  cgroup-v2 hierarchy (the limit is set on a cgroup-v2 directory), and a GPU that is not in MIG mode
  (MIG is not covered). The driver enforces them with the kernel's ``dmem`` controller where the
  kernel has it, else with its own internal (``misc``) accounting, so a missing ``dmem`` controller
  changes the backend, not the answer.
- MPS v3 (named servers and namespaces with server-side limits) comes with the same release.
- Everything else keeps the LD_PRELOAD limiter.

The answer is published as the device attribute ``memoryIsolation`` so that a DeviceClass can ask for
hard isolation, and it is what the kubelet plugin uses to pick a backend for a share.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from dra_gpu.inventory.types import GpuInfo

log = logging.getLogger(__name__)

DRIVER_MEMORY_LIMITS_MIN_MAJOR = 615
MPS_V3_MIN_MAJOR = 615
CGROUP_ROOT_ENV = "DRA_GPU_CGROUP_ROOT"
DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")


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
class Capabilities:
    memory_isolation: MemoryIsolation
    memory_limit_backend: CgroupBackend
    """dmem or misc where memory_isolation is driver, else none."""
    mps_namespaces: bool
    reason: str
    """Why memory_isolation is what it is, for the start-up log and `dra-gpu gpus`."""


def detect(driver_version: str, layout: CgroupLayout, mig_enabled: bool) -> Capabilities:
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
