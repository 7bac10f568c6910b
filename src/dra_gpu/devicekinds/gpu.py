"""The whole GPU: one `resource.k8s.io/v1` device per GPU, in the shape the API server stores.

Choices a user notices:

- Capacity `memory` is the GPU's memory rounded *down* to `MEMORY_STEP` (256 MiB). The API server
  requires a request policy's `default` and `max` to be `min + n * step`, and NVML's totals are not
  round numbers (an H100 80GB reports 81559 MiB), so the published capacity is the largest multiple of
  the step; at most 255 MiB per GPU, which the driver and ECC reserve anyway, is never handed out.
  256 MiB is fine-grained enough for small inference shares and keeps a claim of `10Gi` exactly
  `10Gi` (the step divides every binary GiB amount). Requests round up to the step, as the scheduler
  rounds them.
- Capacity `cores` is a percentage of the GPU's SMs: 100, step 1.
- Both policies default to the whole capacity, so a claim that asks for nothing on a shareable GPU
  gets the whole GPU, and one that asks for `memory: 10Gi, cores: 30` gets that share. A request
  that names only one of them would be charged the whole of the other, leaving the GPU unshareable:
  the claim admission policy refuses it and says what to add.
- A GPU in MIG mode that is published whole (no profile table, or a static GPU with no instances yet)
  is published `Exclusive` (attribute `migEnabled: true`), whatever `--sharing` says: the sharing
  backends cannot enforce a share of it, so no shared class may select it.
- Versions are published as `version` attributes when they can be written as semver (`9.0` ->
  `9.0.0`, `580.95.05` -> `580.95.5`: semver forbids leading zeros), else as strings.

A prepared GPU gets its `/dev/nvidia<minor>`; the toolkit's spec names it by UUID or by index. It has no
`type` attribute (it was published before kinds had names, and classes select it by its absence).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dra_gpu.config import GpuSharingMode
from dra_gpu.config.modes import SHAREABLE_NODE_MODES
from dra_gpu.devicekinds.kind import DeviceMaker, DriverFilesLookup, MakerHost, Obj, Publish
from dra_gpu.host.driver_root import DriverFiles
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.quantity import format_quantity
from dra_gpu.vocabulary.device import (
    CORES_CAPACITY,
    FULL_CORES,
    MAX_STRING,
    MEMORY_CAPACITY,
    MEMORY_ISOLATION_ATTRIBUTE,
    MIG_ENABLED_ATTRIBUTE,
    MPS_NAMESPACES_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    SHARING_ATTRIBUTE,
    device_name,
    published_memory,
)

_NUMERIC_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")


def semver(text: str) -> str | None:
    """`9.0` -> `9.0.0`, `580.95.05` -> `580.95.5`; None when the text is not a dotted number."""
    value = text.strip()
    if not _NUMERIC_VERSION.match(value):
        return None
    parts = [str(int(p)) for p in value.split(".")]
    parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def fit(text: str) -> str:
    """`text` cut to MAX_STRING bytes of UTF-8 without splitting a character."""
    return text.encode("utf-8")[:MAX_STRING].decode("utf-8", "ignore")


def version_attribute(text: str) -> Obj:
    version = semver(text)
    return {"version": version} if version else {"string": fit(text.strip())}


def effective_mode(gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
    """The mode the GPU is published in: what `--sharing` asks, except that a MIG GPU is never shared."""
    return GpuSharingMode.EXCLUSIVE if gpu.mig_enabled else configured


def _policy(value: str, minimum: str, step: str) -> Obj:
    return {"default": value, "validRange": {"min": minimum, "max": value, "step": step}}


def build_device(
    gpu: GpuInfo, mode: GpuSharingMode, *, consumable_capacity: bool = True, taints: list[Obj] | None = None
) -> Obj:
    """The device for one GPU. `consumable_capacity=False` publishes it unshared (older API servers)."""
    mode = effective_mode(gpu, mode)
    memory, step = published_memory(gpu.memory_bytes)
    memory_text, step_text = format_quantity(memory), format_quantity(step)
    cores_text = str(FULL_CORES)
    shared = consumable_capacity and mode in SHAREABLE_NODE_MODES
    device: Obj = {
        "name": device_name(gpu.index),
        "attributes": {
            "uuid": {"string": fit(gpu.uuid)},
            "index": {"int": gpu.index},
            "productName": {"string": fit(gpu.product_name.strip())},
            "architecture": {"string": fit(gpu.architecture.strip())},
            "cudaComputeCapability": version_attribute(gpu.cuda_compute_capability),
            "driverVersion": version_attribute(gpu.driver_version),
            "cudaDriverVersion": version_attribute(gpu.cuda_driver_version),
            PCI_BUS_ID_ATTRIBUTE: {"string": gpu.pci_bus_id},
            SHARING_ATTRIBUTE: {"string": mode.value},
            MEMORY_ISOLATION_ATTRIBUTE: {"string": gpu.memory_isolation},
            MPS_NAMESPACES_ATTRIBUTE: {"bool": gpu.mps_namespaces},
            MIG_ENABLED_ATTRIBUTE: {"bool": gpu.mig_enabled},
        },
        "capacity": {
            MEMORY_CAPACITY: {"value": memory_text},
            CORES_CAPACITY: {"value": cores_text},
        },
    }
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"][MEMORY_CAPACITY]["requestPolicy"] = _policy(memory_text, step_text, step_text)
        device["capacity"][CORES_CAPACITY]["requestPolicy"] = _policy(cores_text, "1", "1")
    if taints:
        device["taints"] = taints
    return device


NVIDIA_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
"""The NVIDIA driver's nodes a container of an NVIDIA device needs, as in the toolkit's spec."""


def nvidia_driver_files(views: Sequence[GpuInfo], lookup: DriverFilesLookup) -> DriverFiles:
    """Exactly the driver NVML reports (an older driver's leftover library would not match the kernel)."""
    versions = {view.driver_version for view in views if view.driver_version}
    return lookup(versions.pop() if len(versions) == 1 else None)


class WholeGpu:
    """The GPU as one device; the last kind asked, it publishes every GPU no other kind took."""

    name: str = "gpu"
    published_type: str | None = None

    def published_mode(self, gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
        return effective_mode(gpu, configured)

    def devices(self, gpu: GpuInfo, publish: Publish) -> list[Obj] | None:
        return [
            build_device(
                gpu, publish.mode, consumable_capacity=publish.consumable_capacity, taints=publish.taints
            )
        ]

    def counter_sets(self, gpu: GpuInfo) -> list[Obj]:
        return []

    def unpublished(self, gpu: GpuInfo) -> list[tuple[str, str]]:
        return []

    def views(self, gpu: GpuInfo) -> dict[str, GpuInfo]:
        return {device_name(gpu.index): gpu}

    def device_nodes(self, view: GpuInfo, commands: GpuCommands) -> list[str]:
        return [f"/dev/nvidia{view.minor}"]

    def driver_nodes(self) -> tuple[str, ...]:
        return NVIDIA_DRIVER_NODES

    def driver_files(self, views: Sequence[GpuInfo], lookup: DriverFilesLookup) -> DriverFiles:
        return nvidia_driver_files(views, lookup)

    def maker(self, host: MakerHost) -> DeviceMaker | None:
        return None  # a GPU is there whether or not it is prepared

    def toolkit_names(self, view: GpuInfo) -> tuple[str, ...]:
        return (view.uuid, str(view.index))  # the UUID first: indexes can change


GPU = WholeGpu()
