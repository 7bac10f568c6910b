"""What MPS shares of either protocol have in common: the client's mounts, the run-as user, the claim's limits.

Protocol 2 (`daemon`) gives each client its limits in its environment; protocol 3 (`namespaces`) keeps
them in the server, one namespace per claim. `uses_v3` picks between them per GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dra_gpu.config import Strategy
from dra_gpu.host.gpu_commands import ComputeMode, GpuCommands
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.sharing.plan import Holder, Plan, Share
from dra_gpu.quantity import to_int

CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
# MPS clients and their server exchange data through POSIX shared memory, so both must see the same
# /dev/shm: a per-GPU host directory that the daemon gets as its /dev/shm and every client mounts.
CONTAINER_SHM_DIR = "/dev/shm"
MIB = 1024 * 1024
CLIENT_MOUNT_OPTIONS = ["nosuid", "nodev", "bind"]


def per_process_compute_notice(percentage: int) -> str:
    return (
        f"MPS limits each process of this claim to {percentage}% of the GPU's SMs "
        f"(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); it cannot cap the claim as a whole, so N processes "
        f"of the claim may together use up to N x {percentage}%. Its memory budget is pooled over all "
        f"of its processes and pods"
    )


USER_DETAIL = "mpsRunAsUser"
"""The UID a MPS share declared (`sharing.mps.runAsUser`), kept so later claims on the GPU are checked."""


def run_as_user(share: Share) -> int | None:
    mps = share.config.sharing.mps
    return mps.runAsUser if mps is not None else None


def undeclared_user_notice() -> str:
    return (
        "sharing.mps.runAsUser is not set: the GPU's MPS control daemon serves one UID at a time, so "
        "pods of MPS claims on this GPU that run as different UIDs wait for each other. Set runAsUser "
        "to the UID the claim's pods run as, and the node refuses a claim that would wait"
    )


def user_conflict(share: Share, others: Sequence[Holder]) -> str | None:
    """Why `share`'s declared UID cannot join the GPU's MPS daemon, or None."""
    wanted = run_as_user(share)
    if wanted is None:
        return None
    for other in others:
        declared = other.record.detail.get(USER_DETAIL)
        if other.record.strategy == Strategy.MPS.value and declared and declared != str(wanted):
            return (
                f"GPU {share.device} ({share.gpu.uuid}) serves MPS claim {other.claim} as UID {declared}; "
                f"this claim sets sharing.mps.runAsUser {wanted}. The MPS control daemon runs one server "
                f"per UID at a time, so the two claims' pods would wait for each other: run them as the "
                f"same UID, or use another GPU"
            )
    return None


def claim_limits(plan: Plan, gpu: GpuInfo, shares: list[Share], driver: str) -> tuple[int | None, int | None]:
    """The claim's MPS cores and memory on `gpu`; memory also goes into the claim's pooled budget."""
    cores = _sum([_cores(s, driver) for s in shares])
    memory = _sum([_memory(s, driver) for s in shares])
    if memory is not None:
        plan.limit(gpu, memory)
    if cores is not None and cores < 100:
        plan.notice(per_process_compute_notice(min(max(cores, 1), 100)))
    return cores, memory


def _cores(share: Share, driver: str) -> int | None:
    mps = share.config.sharing.mps
    return share.amount("cores", driver, mps.defaultActiveThreadPercentage if mps is not None else None)


def _memory(share: Share, driver: str) -> int | None:
    mps = share.config.sharing.mps
    limit = mps.defaultPinnedDeviceMemoryLimit if mps is not None else None
    return share.amount("memory", driver, to_int(limit) if limit is not None else None)


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


PROTOCOL_ENV = "DRA_GPU_MPS_PROTOCOL"


def uses_v3(share: Share) -> bool:
    """MPS v3 where the driver has it, unless the node is told to keep protocol 2."""
    return share.gpu.mps_namespaces and os.environ.get(PROTOCOL_ENV, "3") != "2"


def set_compute_mode(commands: GpuCommands, gpu_uuid: str, mode: ComputeMode) -> None:
    """The GPU's compute mode for its MPS daemon; nothing for a MIG instance. The compute mode is a setting of
    the whole GPU: exclusive-process on the parent would apply to the other instances' tenants too. An
    instance's daemon serves it without it, so a client of the claim that skips the daemon is not refused
    (docs/mig.md, Limits)."""
    if not gpu_uuid.startswith("MIG-"):
        commands.set_compute_mode(gpu_uuid, mode)
