"""What every device kind answers, so that the slice publisher and prepare never ask which kind a device is.

A kind is one way a node's GPU is handed out: the whole GPU, one MIG instance of it, or another vendor's
device one day. The publisher asks each kind in turn for the devices of an inventory GPU; prepare looks a
claim's device up among the kinds' views of the node and asks the view's kind which device nodes and
toolkit names it has. (dra-example-driver's `Profile` is the model: one interface per kind of device for
its enumeration, its configuration and the container edits of a prepared device.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from dra_gpu.config import GpuSharingMode
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.inventory.types import GpuInfo

Obj = dict[str, Any]


@dataclass(frozen=True)
class Publish:
    """How the publisher publishes one inventory GPU's devices in this reconcile."""

    configured: GpuSharingMode
    """The node's `--sharing` setting for the GPU."""
    mode: GpuSharingMode
    """The mode of the GPU's whole device (`gpu-<index>`): `configured` as the GPU kind publishes it, or
    the mode the publisher keeps while claims still hold the device (see `slices/publisher.py`)."""
    consumable_capacity: bool = True
    """False where the API server drops consumable capacity: every device is published unshared."""
    counters: bool = True
    """The API server keeps shared counters (DRAPartitionableDevices)."""
    taints: list[Obj] | None = None
    """The GPU's taints (unhealthy), for each of its devices."""


class DeviceNodeError(Exception):
    """A prepared device's nodes cannot be named; the message says what to fix on the node."""


@runtime_checkable
class DeviceKind(Protocol):
    """One kind of device: how it is published, what it accepts and what a prepared one needs."""

    name: str
    """The kind's name: the `kind` of its views (`GpuInfo.kind`)."""
    published_type: str | None
    """Its published `type` attribute; None for the one kind that publishes none (the whole GPU)."""

    def published_mode(self, gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
        """The sharing mode its devices of `gpu` are published in when the node is set to `configured`:
        the modes it accepts (a kind that cannot be shared answers Exclusive whatever is configured)."""
        ...

    def devices(self, gpu: GpuInfo, publish: Publish) -> list[Obj] | None:
        """The `resource.k8s.io/v1` devices this kind publishes for `gpu`; None when `gpu` is not of this
        kind (the next kind of the table is asked)."""
        ...

    def counter_sets(self, gpu: GpuInfo) -> list[Obj]:
        """The shared counter sets its devices of `gpu` consume (each goes into a slice of its own)."""
        ...

    def unpublished(self, gpu: GpuInfo) -> list[tuple[str, str]]:
        """(key, message) for each part of `gpu` it leaves out of the pool, for the publisher's log."""
        ...

    def views(self, gpu: GpuInfo) -> dict[str, GpuInfo]:
        """Device name -> what a claim's device of this kind on `gpu` stands for at prepare (its UUID,
        memory and minor), with `kind` set to this kind's name."""
        ...

    def device_nodes(self, view: GpuInfo, commands: GpuCommands) -> list[str]:
        """The device nodes (paths in the container) a prepared device needs besides the driver's
        common ones; those missing on the host are left out by the caller. DeviceNodeError when the
        node cannot say which they are."""
        ...

    def toolkit_names(self, view: GpuInfo) -> tuple[str, ...]:
        """The names the NVIDIA Container Toolkit's CDI spec may give the device, preferred first; a
        device the toolkit's spec names gets its edits from there instead of `device_nodes`."""
        ...
