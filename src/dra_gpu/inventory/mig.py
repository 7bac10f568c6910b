"""MIG instances (a GPU instance with one compute instance spanning it) and the rules NVML applies.

One compute instance per GPU instance is what `nvidia-smi mig -cgi ... -C` makes and what this
driver hands out; the GI and CI ids are kept because the `/dev/nvidia-caps` nodes a container
needs are named by them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from dra_gpu.inventory.mig_profiles import MigProfile, MigTable
from dra_gpu.inventory.types import InventoryError


@dataclass(frozen=True)
class MigInstance:
    uuid: str
    """`MIG-<uuid>`: what NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES take."""
    parent_uuid: str
    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int
    memory_bytes: int

    def to_json(self) -> dict[str, object]:
        return {
            "uuid": self.uuid,
            "parentUuid": self.parent_uuid,
            "profile": self.profile,
            "start": self.start,
            "size": self.size,
            "giId": self.gi_id,
            "ciId": self.ci_id,
            "memoryBytes": self.memory_bytes,
        }


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def check_placement(
    table: MigTable, profile: MigProfile, start: int, existing: list[MigInstance], gpu: str
) -> None:
    """Refuse what NVML refuses: a start the profile does not allow, or slices already in use."""
    if start not in profile.starts:
        raise InventoryError(
            f"MIG profile {profile.name} cannot start at memory slice {start} on {gpu}; "
            f"valid starts: {', '.join(map(str, profile.starts))}"
        )
    for other in existing:
        if overlaps((start, profile.memory_slices), (other.start, other.size)):
            raise InventoryError(
                f"MIG {profile.name} at slice {start} on {gpu} overlaps instance {other.uuid} "
                f"({other.profile} at {other.start}); choose a free placement"
            )


def first_free_start(profile: MigProfile, existing: list[MigInstance]) -> int | None:
    for start in profile.starts:
        if not any(overlaps((start, profile.memory_slices), (o.start, o.size)) for o in existing):
            return start
    return None


def next_gi_id(existing: list[MigInstance]) -> int:
    used = {o.gi_id for o in existing}
    return next(i for i in range(1, len(used) + 2) if i not in used)


def simulated_mig_uuid(parent_uuid: str, profile: str, start: int, serial: int = 0) -> str:
    """Stable per (GPU, profile, placement, serial): a re-created instance gets a new serial."""
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, parent_uuid)
    return f"MIG-{uuid.uuid5(namespace, f'{profile}@{start}#{serial}')}"
