"""What every device kind answers, so that the slice publisher and prepare never ask which kind a device is.

A kind is one way a node's GPU is handed out: the whole GPU, one MIG instance of it, or another vendor's
device one day. The publisher asks each kind in turn for the devices of an inventory GPU; prepare looks a
claim's device up among the kinds' views of the node and asks the view's kind which device nodes and
toolkit names it has. (dra-example-driver's `Profile` is the model: one interface per kind of device for
its enumeration, its configuration and the container edits of a prepared device.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from dra_gpu.config import GpuSharingMode
from dra_gpu.host.driver_root import DriverFiles
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.kube import KubeAPI

Obj = dict[str, Any]
DriverFilesLookup = Callable[[str | None], DriverFiles]
"""The NVIDIA driver's user-space files under the node's driver root, of exactly that version (None: any)."""


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


class SetupFailed(Exception):
    """Making or unmaking a device failed; the message says what to change, `reason` is its metric label."""

    def __init__(self, message: str, reason: str = "setup_failed") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class ClaimRef(Protocol):
    """The claim a device is made for (the plugin's `ClaimInfo`)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def ref(self) -> str: ...


class OnDevice(Protocol):
    """A claim's share of a device (the plugin's `Share`, a dataclass): its device name and what it stands for."""

    @property
    def device(self) -> str: ...
    @property
    def gpu(self) -> GpuInfo: ...


ShareT = TypeVar("ShareT", bound=OnDevice)


class Lock(Protocol):
    """A lock held over a block (the node lock)."""

    def hold(self) -> AbstractContextManager[Any]: ...


class KeyedLocks(Protocol):
    """Locks by key, held together over a block (the plugin's `KeyLocks`)."""

    def hold(self, keys: Any, deadline: float | None = None) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True)
class MakerHost:
    """What a kind's maker is given by the node agent."""

    state_dir: Path
    """Where it keeps its records (the agent's state directory)."""
    commands: GpuCommands
    lock: Lock
    """The node lock: held over each read and write of its records."""
    locks: Callable[[str], KeyedLocks]
    """Keyed locks in a directory of this name beside the node lock's file."""
    hook: Callable[[str], None]
    """Called at each step of making a device (the crash tests' fault hook)."""
    api: KubeAPI


class DeviceMaker(Protocol):
    """Makes and unmakes the devices of a kind that exist only while a claim holds them (dynamic MIG
    instances): made at prepare, unmade at unprepare, recorded before they are made so that a restarted
    agent finds them. Failures are SetupFailed."""

    def materialize(self, claim: ClaimRef, shares: list[ShareT], gpus: Sequence[GpuInfo]) -> list[ShareT]:
        """The shares, each on a device of this kind with its device made (or adopted) and standing for it."""
        ...

    def lost(self, uid: str, gpus: Sequence[GpuInfo]) -> list[str]:
        """The claim's made devices that are gone (a reboot or a GPU reset), each described."""
        ...

    def release(self, uid: str, gpus: Sequence[GpuInfo]) -> None:
        """Unmake the claim's devices and drop their records."""
        ...

    def reconcile(self, claims: Set[str], gpus: Sequence[GpuInfo]) -> None:
        """At start: unmake what prepares of claims not in `claims` left made, once those claims are gone."""
        ...

    def temp_files(self) -> list[Path]:
        """Temporary files its interrupted writes left."""
        ...


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

    def driver_nodes(self) -> tuple[str, ...]:
        """The driver's device nodes (paths in the container) every container with a device of this kind
        needs beside each device's own (`device_nodes`): control, memory manager; those missing on the host
        are left out by the caller. Not asked for a device the toolkit's spec brings."""
        ...

    def driver_files(self, views: Sequence[GpuInfo], lookup: DriverFilesLookup) -> DriverFiles:
        """The driver's user-space files (libraries, tools) a container with these devices of this kind
        needs, found through `lookup` for an NVIDIA device; none for a device whose runtime brings them.
        Not asked for a device the toolkit's spec brings."""
        ...

    def maker(self, host: MakerHost) -> DeviceMaker | None:
        """What makes and unmakes its devices at prepare and unprepare, for devices that exist only while
        prepared; None for a kind whose devices are always there."""
        ...

    def toolkit_names(self, view: GpuInfo) -> tuple[str, ...]:
        """The names the NVIDIA Container Toolkit's CDI spec may give the device, preferred first; a
        device the toolkit's spec names gets its edits from there instead of `device_nodes`."""
        ...
