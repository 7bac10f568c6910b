"""The kinds of device this driver hands out, each behind one interface (`DeviceKind`), in one table.

`KINDS` is asked in order: the first kind with devices for an inventory GPU publishes them (MIG before the
whole GPU, which takes every GPU no other kind took). The slice publisher enumerates through
`published_devices` and `counter_sets`; prepare finds a claim's device among `views` and asks `kind_of`
the view for its device nodes and toolkit names; a kind whose devices exist only while prepared (dynamic
MIG) has a `maker` that prepare and unprepare reach through this table. A new kind is a module here and a line in `KINDS`
(CONTRIBUTING, "Add a device kind").
"""

from __future__ import annotations

from dra_gpu.devicekinds.gpu import GPU
from dra_gpu.devicekinds.kind import (
    DeviceKind,
    DeviceMaker,
    DeviceNodeError,
    MakerHost,
    Obj,
    Publish,
    SetupFailed,
)
from dra_gpu.devicekinds.mig_kind import MIG
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.vocabulary.device import TYPE_ATTRIBUTE

KINDS: tuple[DeviceKind, ...] = (MIG, GPU)
"""Every kind, in the order the publisher asks them; the whole GPU last."""


def kind_named(name: str) -> DeviceKind:
    """The kind of this name (`GpuInfo.kind`); ValueError for a name no kind has."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"no device kind {name!r} (known: {', '.join(k.name for k in KINDS)})")


def kind_of(view: GpuInfo) -> DeviceKind:
    """The kind a view from `views` stands for."""
    return kind_named(view.kind)


def kind_of_device(device: Obj) -> DeviceKind:
    """The kind of a published device, by its `type` attribute (none: the kind that publishes none)."""
    published = ((device.get("attributes") or {}).get(TYPE_ATTRIBUTE) or {}).get("string")
    for kind in KINDS:
        if kind.published_type == published:
            return kind
    raise ValueError(f"device {device.get('name')!r}: no device kind publishes type {published!r}")


def published_devices(gpu: GpuInfo, publish: Publish) -> list[Obj]:
    """The devices of `gpu`: those of the first kind that has any."""
    for kind in KINDS:
        devices = kind.devices(gpu, publish)
        if devices is not None:
            return devices
    return []


def counter_sets(gpus: list[GpuInfo]) -> list[Obj]:
    """The shared counter sets of every kind's devices of these GPUs, GPU by GPU."""
    return [found for gpu in gpus for kind in KINDS for found in kind.counter_sets(gpu)]


def unpublished(gpu: GpuInfo) -> list[tuple[str, str]]:
    """(key, message) for each part of `gpu` that some kind leaves out of the pool."""
    return [item for kind in KINDS for item in kind.unpublished(gpu)]


def views(gpus: list[GpuInfo]) -> dict[str, GpuInfo]:
    """Device name -> what it stands for at prepare, for every device any kind publishes on these GPUs."""
    return {name: view for kind in KINDS for gpu in gpus for name, view in kind.views(gpu).items()}


__all__ = [
    "GPU",
    "KINDS",
    "MIG",
    "DeviceKind",
    "DeviceMaker",
    "DeviceNodeError",
    "MakerHost",
    "Publish",
    "SetupFailed",
    "counter_sets",
    "kind_named",
    "kind_of",
    "kind_of_device",
    "published_devices",
    "unpublished",
    "views",
]
