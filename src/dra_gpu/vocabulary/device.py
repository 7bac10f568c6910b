"""The names a device is published and asked for by: attributes, capacities, device names and the
memory step. The slice publisher writes them, the device classes and the admission policy select on
them, the plugin and `dra-gpu usage` read them back; none of those owns them, so they live here,
beneath all of them (no project imports but the driver's name).

Capacity `memory` is published rounded *down* to `MEMORY_STEP` (256 MiB): the API server requires a
request policy's `default` and `max` to be `min + n * step`, and NVML's totals are not round numbers
(`devicekinds/gpu.py` says more).
"""

from __future__ import annotations

from dra_gpu import DRIVER_NAME

MiB = 2**20
MEMORY_STEP = 256 * MiB
MEMORY_CAPACITY = "memory"
CORES_CAPACITY = "cores"
FULL_CORES = 100
SHARING_ATTRIBUTE = "sharing"
MEMORY_ISOLATION_ATTRIBUTE = "memoryIsolation"
"""`driver` (the NVIDIA driver caps each container's cgroup) or `limiter` (our LD_PRELOAD limiter)."""
MPS_NAMESPACES_ATTRIBUTE = "mpsNamespaces"
MIG_ENABLED_ATTRIBUTE = "migEnabled"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
MAX_STRING = 64
"""Bytes of a string attribute (the API server counts UTF-8 bytes, not characters)."""
UNHEALTHY_TAINT_KEY = f"{DRIVER_NAME}/unhealthy"
UNHEALTHY_TAINT_EFFECT = "NoSchedule"
"""NoSchedule keeps new claims away without evicting running pods: the pod's owner decides."""

TYPE_ATTRIBUTE = "type"
PROFILE_ATTRIBUTE = "profile"
MIG_UUID_ATTRIBUTE = "migUUID"
PARENT_UUID_ATTRIBUTE = "parentUUID"
PLACEMENT_START_ATTRIBUTE = "placementStart"
DYNAMIC_ATTRIBUTE = "migDynamic"


def device_name(index: int) -> str:
    return f"gpu-{index}"


def published_memory(memory_bytes: int) -> tuple[int, int]:
    """(capacity, step) in bytes: the memory rounded down to the step (see the module docstring)."""
    if memory_bytes >= MEMORY_STEP:
        return memory_bytes - memory_bytes % MEMORY_STEP, MEMORY_STEP
    return memory_bytes, 1  # smaller than one step: only a toy GPU; publish it exactly


def profile_slug(name: str) -> str:
    """`1g.10gb+me` -> `1g10gbme`: a device name is a DNS label (no dots, no plus)."""
    return "".join(c for c in name.lower() if c.isalnum())


def mig_device_name(gpu_index: int, profile: str, start: int) -> str:
    return f"gpu-{gpu_index}-mig-{profile_slug(profile)}-{start}"
