"""Creating, listing and destroying MIG instances: nvidia-smi's output parsed, and the simulated table.

`nvidia-smi mig -cgi <profile-id>:<start> -C` makes a GPU instance at a placement and one compute
instance spanning it; its output names the GI and CI ids, but not the new instance's UUID, which is
the one `nvidia-smi -L` lists after the call and not before. Destroying is `-dci` then `-dgi`; the
driver refuses both while a process uses the instance.

A container reaches an instance through `/dev/nvidia-caps/nvidia-cap<N>` nodes: one for the GI's
access capability, one for the CI's. The minors are in the driver's
`/proc/driver/nvidia-caps/mig-minors` (`gpu<minor>/gi<id>/access <N>` and
`gpu<minor>/gi<id>/ci<id>/access <N>` lines, beside `config` and `monitor`); the simulated backend
writes a file of the same shape.
"""

from __future__ import annotations

import re
from pathlib import Path

from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance, check_placement, next_gi_id, simulated_mig_uuid
from dra_gpu.inventory.mig_profiles import MigProfile, profile_memory, table_for
from dra_gpu.inventory.types import InventoryError

MIG_MINORS = Path("proc/driver/nvidia-caps/mig-minors")
"""Relative to the driver root."""
MAX_GPU_INSTANCES = 15
MAX_COMPUTE_INSTANCES = 8

_GI_CREATED = re.compile(r"created GPU instance ID\s+(\d+)", re.IGNORECASE)
_CI_CREATED = re.compile(r"created compute instance ID\s+(\d+)", re.IGNORECASE)
_MIG_UUID = re.compile(r"\(UUID:\s*(MIG-[0-9A-Fa-f-]+)\)")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|", re.MULTILINE)


class MigCommandError(Exception):
    """What the driver would refuse; the commands module turns it into its CommandError."""


def parse_created(output: str) -> tuple[int, int]:
    """GI and CI ids from `nvidia-smi mig -cgi ... -C`."""
    gi, ci = _GI_CREATED.search(output), _CI_CREATED.search(output)
    if gi is None or ci is None:
        raise MigCommandError(
            f"nvidia-smi did not report the created GPU and compute instance: {output.strip()}"
        )
    return int(gi.group(1)), int(ci.group(1))


def parse_mig_uuids(output: str) -> list[str]:
    """MIG UUIDs listed by `nvidia-smi -L`."""
    return _MIG_UUID.findall(output)


def parse_gpu_instances(output: str) -> list[tuple[str, int, int, int]]:
    """(profile name, profile id, GI id, start) per row of `nvidia-smi mig -lgi`."""
    return [
        (m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))) for m in _LGI_ROW.finditer(output)
    ]


def parse_mig_minors(text: str) -> dict[str, int]:
    """`gpu0/gi1/access 12` lines -> {"gpu0/gi1/access": 12}; other lines are skipped."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def capability_keys(gpu_minor: int, instance: MigInstance) -> tuple[str, str]:
    """The mig-minors entries of an instance's GI and CI access capabilities."""
    gi = f"gpu{gpu_minor}/gi{instance.gi_id}"
    return f"{gi}/access", f"{gi}/ci{instance.ci_id}/access"


def simulated_mig_minors(gpus: int = 8) -> str:
    """The file's shape as the driver writes it: every possible GI and CI of every GPU numbered in order."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(gpus):
        for gi in range(MAX_GPU_INSTANCES):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(MAX_COMPUTE_INSTANCES):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def instance_from_json(data: dict[str, object]) -> MigInstance:
    return MigInstance(
        uuid=str(data["uuid"]),
        parent_uuid=str(data["parentUuid"]),
        profile=str(data["profile"]),
        start=int(str(data["start"])),
        size=int(str(data["size"])),
        gi_id=int(str(data["giId"])),
        ci_id=int(str(data["ciId"])),
        memory_bytes=int(str(data["memoryBytes"])),
    )


def simulated_create(
    gpu: GpuInfo, profile: MigProfile, start: int, live: list[MigInstance], serial: int
) -> MigInstance:
    """Refuse what NVML refuses (a profile the GPU lacks, a start it does not allow, an overlap)."""
    table = table_for(gpu.product_name, gpu.memory_bytes)
    if not gpu.mig_enabled or table is None:
        raise MigCommandError(f"GPU {gpu.uuid} is not in MIG mode")
    if table.find(profile.name) != profile:
        raise MigCommandError(f"GPU {gpu.uuid} ({table.model}) has no MIG profile {profile.name}")
    try:
        check_placement(table, profile, start, [*gpu.mig_instances, *live], gpu.uuid)
    except InventoryError as exc:
        raise MigCommandError(str(exc)) from None
    return MigInstance(
        uuid=simulated_mig_uuid(gpu.uuid, profile.name, start, serial),
        parent_uuid=gpu.uuid,
        profile=profile.name,
        start=start,
        size=profile.memory_slices,
        gi_id=next_gi_id([*gpu.mig_instances, *live]),
        ci_id=0,
        memory_bytes=profile_memory(profile, gpu),
    )
