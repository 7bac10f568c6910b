"""The inventory contract: what every backend reports about a node's GPUs.

Everything above the inventory (slice publisher, kubelet plugin, health loop, CLI) codes against
these names only, so that a simulated node and a real one are indistinguishable to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dra_gpu.inventory.mig import MigInstance


class InventoryError(Exception):
    """A backend failure, with a message that says what to do about it."""


class NvmlUnavailableError(InventoryError):
    """NVML cannot be used at all on this machine (no library, no driver, no permission).

    Kept apart from other failures so that callers can suggest the simulated backend.
    """


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as the node sees it."""

    index: int
    minor: int
    uuid: str
    product_name: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    driver_version: str
    cuda_driver_version: str
    pci_bus_id: str
    mig_capable: bool
    healthy: bool = True
    mig_enabled: bool = False
    """MIG mode is on: the whole GPU is no longer a device; its instances (or placements) are."""
    mig_instances: tuple[MigInstance, ...] = ()
    """Instances that exist now (static MIG), in placement order."""
    mig_dynamic: bool = False
    """The node lets the driver create and destroy instances on this GPU (dynamic MIG)."""
    mig_profile_memory: tuple[tuple[int, int], ...] = ()
    """(GPU-instance profile id, bytes) as NVML's profile info reports them on a real MIG GPU: what an
    instance of that profile will have, which the profile's name only rounds."""
    mig_instance: MigInstance | None = None
    """Set on the view of one instance that a claim's MIG device stands for (`devicekinds/mig.py`):
    `uuid` is then the instance's and `minor` the parent GPU's, whose device node it needs."""
    health_reason: str = ""
    memory_isolation: str = "limiter"
    """"driver" or "limiter" (see inventory.capabilities), published as the `memoryIsolation` attribute."""
    memory_limit_backend: str = "none"
    mps_namespaces: bool = False
    isolation_reason: str = ""
    kind: str = "gpu"
    """The device kind this stands for (`devicekinds`): `gpu`, a whole GPU, as every backend reports it;
    a kind's views of a part of it, which prepare looks claims' devices up in, carry their own."""

    def to_json(self) -> dict[str, object]:
        """camelCase keys, as the Kubernetes-facing parts of the project spell attributes."""
        return {
            "index": self.index,
            "minor": self.minor,
            "uuid": self.uuid,
            "productName": self.product_name,
            "architecture": self.architecture,
            "cudaComputeCapability": self.cuda_compute_capability,
            "memoryBytes": self.memory_bytes,
            "driverVersion": self.driver_version,
            "cudaDriverVersion": self.cuda_driver_version,
            "pciBusId": self.pci_bus_id,
            "migCapable": self.mig_capable,
            "migEnabled": self.mig_enabled,
            "migDynamic": self.mig_dynamic,
            "migInstances": [m.to_json() for m in self.mig_instances],
            "healthy": self.healthy,
            "healthReason": self.health_reason,
            "memoryIsolation": self.memory_isolation,
            "memoryLimitBackend": self.memory_limit_backend,
            "mpsNamespaces": self.mps_namespaces,
            "isolationReason": self.isolation_reason,
        }


class Inventory(Protocol):
    """A node's GPUs. Implementations are safe to call from a health thread and a main thread."""

    backend: str
    """"nvml" or "simulated"."""

    def gpus(self) -> list[GpuInfo]:
        """All GPUs ordered by index, with the health last read."""
        ...

    def refresh_health(self) -> list[GpuInfo]:
        """Re-read health now; same GPUs, same order as gpus()."""
        ...

    def wait_health_event(self, timeout_s: float) -> bool:
        """Block up to timeout_s; True if health may have changed (call refresh_health then)."""
        ...

    def close(self) -> None:
        """Release the backend; idempotent."""
        ...
