"""Choosing a backend from one flag value, so that every command and manifest spells it the same way."""

from __future__ import annotations

from dra_gpu.inventory.nvml import NvmlInventory
from dra_gpu.inventory.simulated import SimulatedInventory
from dra_gpu.inventory.types import Inventory, InventoryError

SIMULATED_PREFIX = "simulated:"


def open_inventory(spec: str, seed: str = "", hook_problem: str = "", mig_dynamic: bool = False) -> Inventory:
    """Open "nvml" or "simulated:PROFILE"; seed (the node name) makes simulated UUIDs differ per node.

    hook_problem: why the node has no usable memory-limit hook (`capabilities.find_limit_hook`).
    """
    text = spec.strip()
    if text == "nvml":
        return NvmlInventory(hook_problem=hook_problem, mig_dynamic=mig_dynamic)
    if text.startswith(SIMULATED_PREFIX):
        profile = text[len(SIMULATED_PREFIX) :]
        if not profile.strip():
            raise InventoryError(
                f"inventory {spec!r} has no profile: write e.g. simulated:2xH100-80GB,1xL4-24GB"
            )
        return SimulatedInventory(profile, seed=seed, hook_problem=hook_problem)
    raise InventoryError(
        f"unknown inventory {spec!r}: use 'nvml' for the node's real GPUs "
        "or 'simulated:PROFILE' (e.g. simulated:2xH100-80GB,1xL4-24GB) for simulated ones"
    )
