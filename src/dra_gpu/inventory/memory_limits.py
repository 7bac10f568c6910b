"""NVML's per-cgroup GPU memory limits (release 615+), on top of the pynvml module.

nvidia-ml-py has no binding for ``nvmlDeviceSetMemoryLimits_v1`` / ``nvmlDeviceGetMemoryLimits_v1``
yet, so they are called through pynvml's own function-pointer lookup with the structures of the
NVML reference (``nvmlSetMemoryLimits_v1_t``: nameSpace, softLimit, hardLimit; the get variant adds
currentUsed). A module that already has the functions (a newer binding, or the test fake) is used
as it is. The module comes from ``DRA_GPU_NVML_MODULE`` (default ``pynvml``), so a hook process can be
pointed at a stand-in NVML.
"""

from __future__ import annotations

import importlib
import os
from ctypes import Structure, byref, c_char_p, c_ulonglong
from dataclasses import dataclass
from typing import Any

NVML_MODULE_ENV = "DRA_GPU_NVML_MODULE"
NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
"""`NVML_DEVICE_MEMORY_LIMIT_MAX`, the hard limit meaning "none" (value taken as ULLONG_MAX; unverified)."""


class c_nvmlSetMemoryLimits_v1_t(Structure):
    _fields_ = [("nameSpace", c_char_p), ("softLimit", c_ulonglong), ("hardLimit", c_ulonglong)]


class c_nvmlGetMemoryLimits_v1_t(Structure):
    _fields_ = [
        ("nameSpace", c_char_p),
        ("softLimit", c_ulonglong),
        ("hardLimit", c_ulonglong),
        ("currentUsed", c_ulonglong),
    ]


@dataclass(frozen=True)
class Limits:
    soft: int
    hard: int
    used: int = 0

    @property
    def unlimited(self) -> bool:
        return self.soft == 0 and self.hard == NVML_DEVICE_MEMORY_LIMIT_MAX


def load_nvml() -> Any:
    return importlib.import_module(os.environ.get(NVML_MODULE_ENV) or "pynvml")


def _call(nvml: Any, name: str, handle: Any, struct: Structure) -> None:
    own = getattr(nvml, name, None)
    if own is not None:
        own(handle, struct)
        return
    function = nvml._nvmlGetFunctionPointer(name)  # NVMLError Function Not Found before 615
    nvml._nvmlCheckReturn(function(handle, byref(struct)))


def set_limits(nvml: Any, handle: Any, cgroup_dir: str, soft: int, hard: int) -> None:
    """Set the soft (guaranteed) and hard (ceiling) limit of one GPU for one cgroup-v2 directory."""
    struct = c_nvmlSetMemoryLimits_v1_t(cgroup_dir.encode(), soft, hard)
    _call(nvml, "nvmlDeviceSetMemoryLimits_v1", handle, struct)


def clear_limits(nvml: Any, handle: Any, cgroup_dir: str) -> None:
    """The documented way to remove a limit: soft 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX."""
    set_limits(nvml, handle, cgroup_dir, 0, NVML_DEVICE_MEMORY_LIMIT_MAX)


def get_limits(nvml: Any, handle: Any, cgroup_dir: str) -> Limits:
    struct = c_nvmlGetMemoryLimits_v1_t(cgroup_dir.encode(), 0, 0, 0)
    _call(nvml, "nvmlDeviceGetMemoryLimits_v1", handle, struct)
    return Limits(int(struct.softLimit), int(struct.hardLimit), int(struct.currentUsed))
