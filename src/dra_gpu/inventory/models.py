"""GPU models the simulated backend can pretend to have, with the figures a real board reports.

Memory sizes are what NVML reports as total memory for these boards (a little under the marketing
size where the driver or ECC reserves some), so that simulated capacities look like real ones.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class GpuModel:
    key: str
    product_name: str
    architecture: str
    compute_capability: str
    memory_bytes: int
    mig_capable: bool


KNOWN_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("H100-80GB", "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559 * MiB, True),
        GpuModel("H200-141GB", "NVIDIA H200", "Hopper", "9.0", 143771 * MiB, True),
        GpuModel("B200-180GB", "NVIDIA B200", "Blackwell", "10.0", 183359 * MiB, True),
        GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960 * MiB, True),
        GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 81920 * MiB, True),
        GpuModel("A30-24GB", "NVIDIA A30", "Ampere", "8.0", 24576 * MiB, True),
        GpuModel("A10-24GB", "NVIDIA A10", "Ampere", "8.6", 23028 * MiB, False),
        GpuModel("L4-24GB", "NVIDIA L4", "Ada Lovelace", "8.9", 23034 * MiB, False),
        GpuModel("L40S-48GB", "NVIDIA L40S", "Ada Lovelace", "8.9", 46068 * MiB, False),
        GpuModel("T4-16GB", "Tesla T4", "Turing", "7.5", 15360 * MiB, False),
        GpuModel("V100-32GB", "Tesla V100-SXM2-32GB", "Volta", "7.0", 32768 * MiB, False),
    )
}


def find_model(name: str) -> GpuModel | None:
    """Case-insensitive lookup, so that "h100-80gb" in a profile works too."""
    wanted = name.strip().upper()
    for key, model in KNOWN_MODELS.items():
        if key.upper() == wanted:
            return model
    return None
