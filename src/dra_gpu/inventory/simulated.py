"""A node's GPUs described by a profile string, for CPU-only clusters, demos and tests.

Everything is derived from the profile and a seed (the node name), never from randomness or the
clock: the same node always shows the same UUIDs, so its ResourceSlice and the claims prepared
against it survive a restart exactly as they would on real hardware, while two simulated nodes
still have distinct GPUs.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass, replace

from dra_gpu.inventory.capabilities import CgroupLayout, detect, driver_major, with_capabilities
from dra_gpu.inventory.models import KNOWN_MODELS, GpuModel, find_model
from dra_gpu.inventory.types import GpuInfo, InventoryError

SIMULATED_DRIVER_VERSION = "580.95.05"
SIMULATED_CUDA_VERSION = "13.0"
MAX_SIMULATED_GPUS = 128
"""A ResourceSlice holds at most 128 devices; more GPUs than that on one node is a typo."""

_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.gpu.dra-gpu.io")
# Bus numbers of the eight GPUs of an HGX H100 board; further GPUs go to further PCI domains.
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PART = re.compile(r"^(\d+)\s*[xX]\s*(\S+)$")


def known_models_text() -> str:
    return ", ".join(KNOWN_MODELS)


def parse_profile(profile: str) -> list[GpuModel]:
    """One model per GPU, in index order, from a profile such as 2xH100-80GB,1xL4-24GB."""

    def bad(part: str, why: str) -> InventoryError:
        return InventoryError(
            f"bad GPU profile {profile!r}: {part!r} {why}; expected COUNTxMODEL[,COUNTxMODEL...] "
            f"such as 2xH100-80GB,1xL4-24GB; known models: {known_models_text()}"
        )

    if not profile.strip():
        raise bad(profile, "is empty")
    gpus: list[GpuModel] = []
    for raw in profile.split(","):
        part = raw.strip()
        match = _PART.match(part)
        if match is None:
            if find_model(part) is not None:
                raise bad(part, f"has no count (write 1x{part} for one GPU)")
            raise bad(part, "is not COUNTxMODEL")
        count, name = int(match.group(1)), match.group(2)
        model = find_model(name)
        if model is None:
            raise bad(part, f"names an unknown GPU model {name!r}")
        if count < 1:
            raise bad(part, "asks for no GPUs (the count must be at least 1)")
        gpus.extend([model] * count)
        if len(gpus) > MAX_SIMULATED_GPUS:
            raise bad(part, f"brings the node above {MAX_SIMULATED_GPUS} GPUs")
    return gpus


_CGROUP_LAYOUTS = {
    "dmem": CgroupLayout(v2=True, dmem=True),
    "misc": CgroupLayout(v2=True, dmem=False),
    "v1": CgroupLayout(v2=False, dmem=False),
}


@dataclass(frozen=True)
class NodeOptions:
    """Node facts a profile may set after the GPUs: `driver=615.71.09`, `cgroup=dmem|misc|v1`."""

    driver_version: str = SIMULATED_DRIVER_VERSION
    cgroup: CgroupLayout = _CGROUP_LAYOUTS["dmem"]


def split_options(profile: str) -> tuple[str, NodeOptions]:
    """The GPU part of a profile and its node options (`2xH100-80GB,driver=615.71.09`)."""
    gpus: list[str] = []
    driver, cgroup = SIMULATED_DRIVER_VERSION, _CGROUP_LAYOUTS["dmem"]
    for raw in profile.split(","):
        key, sep, value = raw.partition("=")
        if not sep:
            gpus.append(raw)
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "driver" and driver_major(value) is not None:
            driver = value
        elif key == "cgroup" and value.lower() in _CGROUP_LAYOUTS:
            cgroup = _CGROUP_LAYOUTS[value.lower()]
        else:
            raise InventoryError(
                f"bad GPU profile {profile!r}: option {raw.strip()!r} is not driver=VERSION (e.g. "
                f"driver=615.71.09) or cgroup=dmem|misc|v1"
            )
    return ",".join(gpus), NodeOptions(driver, cgroup)


def simulated_uuid(seed: str, index: int, model: GpuModel) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{seed}/{index}/{model.key}')}"


def simulated_pci_bus_id(index: int) -> str:
    domain, slot = divmod(index, len(_PCI_BUSES))
    return f"{domain:04x}:{_PCI_BUSES[slot]:02x}:00.0"


class SimulatedInventory:
    """GPUs from a profile; set_health() stands in for NVML's health signals in tests and demos."""

    backend = "simulated"

    def __init__(self, profile: str, seed: str = "", hook_problem: str = "") -> None:
        self.profile = profile
        self.seed = seed
        gpu_profile, options = split_options(profile)
        self.options = options
        self._lock = threading.Condition()
        self._changes = 0
        self._seen = 0
        caps = detect(options.driver_version, options.cgroup, mig_enabled=False, hook_problem=hook_problem)
        self._gpus = [
            with_capabilities(
                GpuInfo(
                    index=i,
                    minor=i,
                    uuid=simulated_uuid(seed, i, model),
                    product_name=model.product_name,
                    architecture=model.architecture,
                    cuda_compute_capability=model.compute_capability,
                    memory_bytes=model.memory_bytes,
                    driver_version=options.driver_version,
                    cuda_driver_version=SIMULATED_CUDA_VERSION,
                    pci_bus_id=simulated_pci_bus_id(i),
                    mig_capable=model.mig_capable,
                ),
                caps,
            )
            for i, model in enumerate(parse_profile(gpu_profile))
        ]

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            return list(self._gpus)

    def refresh_health(self) -> list[GpuInfo]:
        with self._lock:
            self._seen = self._changes
            return list(self._gpus)

    def wait_health_event(self, timeout_s: float) -> bool:
        """True once set_health() has changed something since the last refresh_health()."""
        with self._lock:
            return self._lock.wait_for(lambda: self._changes != self._seen, timeout=max(timeout_s, 0.0))

    def set_health(self, index: int, healthy: bool, reason: str = "") -> None:
        """Mark a GPU unhealthy (with a reason, e.g. "XID 79: GPU has fallen off the bus") or healthy again."""
        with self._lock:
            if not 0 <= index < len(self._gpus):
                raise InventoryError(
                    f"no simulated GPU with index {index}: this node has {len(self._gpus)} "
                    f"(indexes 0 to {len(self._gpus) - 1})"
                )
            if not healthy and not reason:
                reason = "marked unhealthy"
            gpu = self._gpus[index]
            updated = replace(gpu, healthy=healthy, health_reason="" if healthy else reason)
            if updated != gpu:
                self._gpus[index] = updated
                self._changes += 1
                self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._lock.notify_all()
