"""MIG instances: static instances as devices, dynamic MIG GPUs as partitionable devices (counters).

- A static instance is published like a GPU of its own (so it can be Exclusive, Shared or MPS,
  with `memory` the instance's memory and `cores` a percentage of the instance), plus attributes
  `type: mig`, `profile`, `migUUID`, `parentUUID`, `placementStart`, `memorySlices`,
  `computeSlices` and `copyEngines`. `uuid` is the MIG UUID, which is what the sharing backends
  and the limiter key their limits by.
- A dynamic GPU publishes one counter set `gpu-<index>-mig` holding one counter per memory slice
  (`memory-slice-<n>`, value 1: two placements that share a slice cannot both be allocated) and
  the GPU's totals of compute slices and engines; and one device per valid placement of every
  profile, consuming its slices and engines from that one set (one consumesCounters entry, so the
  1.35+ limit of two is never reached). Counter sets go into slices of their own (1.35+ forbids
  devices and counter sets in one slice), at most 8 sets per slice. A dynamic device is
  Exclusive: its instance exists only while its one claim is prepared.
- Where the API server has no counters (DRAPartitionableDevices off: it drops them silently; or 1.34's
  rules, which refuse this layout), placements that overlap could all be allocated at once. A dynamic
  GPU then publishes its full profile only, one placement that consumes nothing: one claim per GPU,
  never two instances on the same memory slices.

At prepare, a claim's MIG device is a view of the parent GPU standing for the instance: the instance's
UUID and memory (so limits, records and visibility are the instance's) and the parent's minor (its
`/dev/nvidia<minor>` is what the container opens, with the instance's `/dev/nvidia-caps` nodes). A
dynamic placement has no instance until prepare makes one (`mig_instances.py`, asked through the kind in `mig_kind.py`): its view keeps
the parent's UUID (so its claim locks the GPU whose table changes) and `mig_instance` None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from dra_gpu.config import GpuSharingMode
from dra_gpu.devicekinds.gpu import build_device, fit
from dra_gpu.devicekinds.kind import DeviceNodeError, Obj
from dra_gpu.host.mig_commands import capability_keys, parse_mig_minors
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile, MigTable, profile_memory, table_for
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.vocabulary.device import (
    DYNAMIC_ATTRIBUTE,
    MIG_UUID_ATTRIBUTE,
    PARENT_UUID_ATTRIBUTE,
    PLACEMENT_START_ATTRIBUTE,
    PROFILE_ATTRIBUTE,
    TYPE_ATTRIBUTE,
    mig_device_name,
)

MIG_TYPE = "mig"
"""The kind's name, and its devices' `type` attribute (the MIG DeviceClass selects on it)."""
ENGINE_COUNTERS = {
    "compute-slices": "compute_slices",
    "copy-engines": "copy_engines",
    "decoders": "decoders",
    "jpeg-decoders": "jpeg_decoders",
    "ofa": "ofa",
}
"""Counter name -> MigProfile field: the engines a placement takes besides its memory slices."""


def table_of(gpu: GpuInfo) -> MigTable | None:
    return table_for(gpu.product_name, gpu.memory_bytes) if gpu.mig_enabled else None


def counter_set_name(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.index}-mig"


def _mig_attributes(gpu: GpuInfo, profile: MigProfile, start: int, mig_uuid: str, dynamic: bool) -> Obj:
    attributes: Obj = {
        TYPE_ATTRIBUTE: {"string": MIG_TYPE},
        PROFILE_ATTRIBUTE: {"string": profile.name},
        PARENT_UUID_ATTRIBUTE: {"string": fit(gpu.uuid)},
        PLACEMENT_START_ATTRIBUTE: {"int": start},
        "memorySlices": {"int": profile.memory_slices},
        "computeSlices": {"int": profile.compute_slices},
        "copyEngines": {"int": profile.copy_engines},
        DYNAMIC_ATTRIBUTE: {"bool": dynamic},
    }
    if mig_uuid:
        attributes[MIG_UUID_ATTRIBUTE] = {"string": fit(mig_uuid)}
    return attributes


def static_device(
    gpu: GpuInfo,
    instance: MigInstance,
    profile: MigProfile,
    mode: GpuSharingMode,
    *,
    consumable_capacity: bool = True,
    taints: list[Obj] | None = None,
) -> Obj:
    """An existing instance as a device, in the GPU's sharing mode (its share is of the instance)."""
    as_gpu = replace(gpu, uuid=instance.uuid, memory_bytes=instance.memory_bytes, mig_enabled=False)
    device = build_device(as_gpu, mode, consumable_capacity=consumable_capacity, taints=taints)
    device["name"] = mig_device_name(gpu.index, profile.name, instance.start)
    device["attributes"]["migEnabled"] = {"bool": True}
    device["attributes"].update(_mig_attributes(gpu, profile, instance.start, instance.uuid, False))
    return device


def dynamic_device(gpu: GpuInfo, profile: MigProfile, start: int, taints: list[Obj] | None = None) -> Obj:
    """A placement that prepare will create: Exclusive, consuming its slices and engines."""
    as_gpu = replace(gpu, memory_bytes=profile_memory(profile, gpu), mig_enabled=False)
    device = build_device(as_gpu, GpuSharingMode.EXCLUSIVE, taints=taints)
    device["name"] = mig_device_name(gpu.index, profile.name, start)
    del device["attributes"]["uuid"]  # the instance has no UUID until it is made
    device["attributes"]["migEnabled"] = {"bool": True}
    device["attributes"].update(_mig_attributes(gpu, profile, start, "", True))
    counters = {f"memory-slice-{n}": {"value": "1"} for n in range(start, start + profile.memory_slices)}
    for counter, field in ENGINE_COUNTERS.items():
        amount = getattr(profile, field)
        if amount:
            counters[counter] = {"value": str(amount)}
    device["consumesCounters"] = [{"counterSet": counter_set_name(gpu), "counters": counters}]
    return device


def counter_set(gpu: GpuInfo, table: MigTable) -> Obj:
    counters = {f"memory-slice-{n}": {"value": "1"} for n in range(table.memory_slices)}
    for counter, field in ENGINE_COUNTERS.items():
        counters[counter] = {"value": str(getattr(table.full, field))}
    return {"name": counter_set_name(gpu), "counters": counters}


def mig_devices(
    gpu: GpuInfo,
    mode: GpuSharingMode,
    *,
    consumable_capacity: bool = True,
    taints: list[Obj] | None = None,
    counters: bool = True,
) -> list[Obj] | None:
    """The devices of a GPU in MIG mode; None to publish it whole (Exclusive, `migEnabled`) as before:
    not in MIG mode, a model without a profile table, or a static GPU with no instances yet.
    `counters`: the API server keeps shared counters; without them a dynamic GPU offers its full
    profile only (see the module docstring)."""
    table = table_of(gpu)
    if table is None or not (gpu.mig_dynamic or gpu.mig_instances):
        return None
    if gpu.mig_dynamic and not counters:
        whole = dynamic_device(gpu, table.full, table.full.starts[0], taints)
        del whole["consumesCounters"]
        return [whole]
    if gpu.mig_dynamic:
        return [dynamic_device(gpu, p, start, taints) for p in table.profiles for start in p.starts]
    devices = []
    for instance in gpu.mig_instances:
        profile = table.find(instance.profile)
        if profile is not None:
            devices.append(
                static_device(
                    gpu, instance, profile, mode, consumable_capacity=consumable_capacity, taints=taints
                )
            )
    return devices


def unpublished_instances(gpu: GpuInfo) -> list[tuple[MigInstance, str]]:
    """The existing instances `mig_devices` leaves out, each with the reason (for the publisher's log).

    A GPU instance split into several compute instances (`1c.3g.40gb`, made with `nvidia-smi mig -cci`)
    is left out: its compute instances share one GPU instance's memory, which this driver cannot
    give to one claim and limit for another; and a profile the model's table does not list."""
    table = table_of(gpu)
    if table is None or gpu.mig_dynamic:
        return []
    left_out = []
    for instance in gpu.mig_instances:
        if table.find(instance.profile) is not None:
            continue
        if re.match(r"\d+c\.", instance.profile):
            why = (
                f"compute instance {instance.ci_id} of GPU instance {instance.gi_id} ({instance.profile}) shares "
                "the GPU instance's memory with its other compute instances; only GPU instances with one "
                "compute instance spanning them are published (recreate it with `nvidia-smi mig -cgi <profile> -C`)"
            )
        else:
            why = f"profile {instance.profile!r} is not in the {table.model} table ({table.names()})"
        left_out.append((instance, why))
    return left_out


@dataclass(frozen=True)
class MigPlacement:
    """A dynamic device: the placement prepare creates an instance at."""

    parent: GpuInfo
    profile: MigProfile
    start: int


def instance_view(parent: GpuInfo, instance: MigInstance) -> GpuInfo:
    return replace(
        parent,
        uuid=instance.uuid,
        memory_bytes=instance.memory_bytes,
        mig_instances=(),
        mig_dynamic=False,
        mig_instance=instance,
        kind=MIG_TYPE,
    )


def mig_views(gpus: list[GpuInfo]) -> tuple[dict[str, GpuInfo], dict[str, MigPlacement]]:
    """Device name -> view of every MIG device published for these GPUs, and the dynamic ones' placements."""
    views: dict[str, GpuInfo] = {}
    placements: dict[str, MigPlacement] = {}
    for gpu in gpus:
        table = table_of(gpu)
        if table is None:
            continue
        if gpu.mig_dynamic:
            for profile in table.profiles:
                for start in profile.starts:
                    name = mig_device_name(gpu.index, profile.name, start)
                    views[name] = replace(gpu, memory_bytes=profile_memory(profile, gpu), kind=MIG_TYPE)
                    placements[name] = MigPlacement(gpu, profile, start)
            continue
        for instance in gpu.mig_instances:
            views[mig_device_name(gpu.index, instance.profile, instance.start)] = instance_view(gpu, instance)
    return views, placements


def capability_nodes(gpu: GpuInfo, minors_file: str) -> list[str]:
    """The `/dev/nvidia-caps` nodes of the instance `gpu` stands for, from the driver's minors table."""
    instance = gpu.mig_instance
    if instance is None:
        return []
    try:
        with open(minors_file) as f:
            minors = parse_mig_minors(f.read())
    except OSError as exc:
        raise DeviceNodeError(
            f"MIG device {instance.uuid}: cannot read the driver's capability minors {minors_file} "
            f"({exc.strerror}); the driver root must contain proc/driver/nvidia-caps"
        ) from None
    nodes = []
    for key in capability_keys(gpu.minor, instance):
        if key not in minors:
            raise DeviceNodeError(
                f"MIG device {instance.uuid}: {minors_file} has no entry {key}; is the GPU still in MIG mode?"
            )
        nodes.append(f"/dev/nvidia-caps/nvidia-cap{minors[key]}")
    return nodes
