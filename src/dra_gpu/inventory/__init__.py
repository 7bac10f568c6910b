"""The node's GPUs behind one interface: NVML on real nodes, a profile on simulated ones."""

from dra_gpu.inventory.factory import open_inventory
from dra_gpu.inventory.models import KNOWN_MODELS, GpuModel
from dra_gpu.inventory.nvml import NvmlInventory
from dra_gpu.inventory.simulated import SimulatedInventory, parse_profile
from dra_gpu.inventory.types import GpuInfo, Inventory, InventoryError, NvmlUnavailableError

__all__ = [
    "KNOWN_MODELS",
    "GpuInfo",
    "GpuModel",
    "Inventory",
    "InventoryError",
    "NvmlInventory",
    "NvmlUnavailableError",
    "SimulatedInventory",
    "open_inventory",
    "parse_profile",
]
