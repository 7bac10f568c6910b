"""A claim's MIG device as the sharing backends see it: a GPU view standing for the instance.

The view has the instance's UUID and memory (so limits, records and visibility are the instance's)
and the parent's minor (its `/dev/nvidia<minor>` is what the container opens, with the instance's
capability nodes). A dynamic placement has no instance until prepare makes one: its view keeps the
parent's UUID (so its claim locks the GPU whose table changes) and `mig_instance` None.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dra_gpu.host.mig_commands import capability_keys, parse_mig_minors
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile, profile_memory, table_for
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.vocabulary.device import mig_device_name


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
    )


def mig_views(gpus: list[GpuInfo]) -> tuple[dict[str, GpuInfo], dict[str, MigPlacement]]:
    """Device name -> view of every MIG device published for these GPUs, and the dynamic ones' placements."""
    views: dict[str, GpuInfo] = {}
    placements: dict[str, MigPlacement] = {}
    for gpu in gpus:
        table = table_for(gpu.product_name, gpu.memory_bytes) if gpu.mig_enabled else None
        if table is None:
            continue
        if gpu.mig_dynamic:
            for profile in table.profiles:
                for start in profile.starts:
                    name = mig_device_name(gpu.index, profile.name, start)
                    views[name] = replace(gpu, memory_bytes=profile_memory(profile, gpu))
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
        raise PrepareError(
            f"MIG device {instance.uuid}: cannot read the driver's capability minors {minors_file} "
            f"({exc.strerror}); the driver root must contain proc/driver/nvidia-caps",
            reason="setup_failed",
        ) from None
    nodes = []
    for key in capability_keys(gpu.minor, instance):
        if key not in minors:
            raise PrepareError(
                f"MIG device {instance.uuid}: {minors_file} has no entry {key}; is the GPU still in MIG mode?",
                reason="setup_failed",
            )
        nodes.append(f"/dev/nvidia-caps/nvidia-cap{minors[key]}")
    return nodes
