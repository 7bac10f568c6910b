"""Finding GPUs that two allocators over-committed at the same moment.

The controller and the scheduler each decide from their own view of the cluster, and nothing in the
API makes a write to one claim conditional on another claim: if both place a share on the same GPU in
the same instant, each write succeeds and the GPU is over-committed. Every pass therefore checks the
usage the allocator has just counted (all allocations, from everyone) against each device's capacity.
The controller then moves its own claims off an over-committed device, newest first, as long as no pod
has been admitted with them yet (`reservedFor` empty): the scheduler's allocations cannot be undone by
us, ours can.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gpu.allocator import Allocator
from dra_gpu.allocator.capacity import fmt


@dataclass(frozen=True)
class Overcommit:
    device: str  # driver/pool/device
    holders: frozenset[str]  # claim ids (UIDs) holding the device
    why: str


def overcommitted(allocator: Allocator) -> list[Overcommit]:
    """Devices whose holders together exceed what the device offers."""
    usage = allocator.usage
    found = []
    for device in allocator.devices:
        i = device.index
        holders = frozenset(usage.holders[i])
        whole, shares = usage.whole[i], usage.shares[i]
        why = None
        if whole > 1 or (not device.multi and len(holders) > 1):
            why = f"{len(holders)} claims hold it whole"
        elif whole and shares:
            why = "held whole by one claim and shared by others"
        elif usage.used[i] is not None:
            used = usage.used[i]
            assert used is not None
            for spec, amount in zip(device.specs, used, strict=True):
                if amount > spec.value:
                    why = f'capacity "{spec.name}" is over-committed ({fmt(amount)} of {fmt(spec.value)})'
                    break
        if why is not None:
            found.append(Overcommit(device.label, holders, why))
    return found
