"""`dra-gpu gpus`: show the GPUs the driver would publish for this node.

The same inventory code runs here as in the kubelet plugin, so what this prints (including the
simulated UUIDs for a given --node-name) is what the node's ResourceSlice will carry.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dra_gpu.commands._exit import fail
from dra_gpu.commands._simulate import add_simulate_flag, open_gpus
from dra_gpu.commands.output import OUTPUTS, dump
from dra_gpu.flags import add_flag
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.capabilities import find_limit_hook
from dra_gpu.quantity import format_quantity

NAME = "gpus"
HELP = "list this node's GPUs (real ones through NVML, or simulated ones with --simulate)"

_COLUMNS = (
    "INDEX",
    "UUID",
    "PRODUCT",
    "ARCHITECTURE",
    "CC",
    "MEMORY",
    "PCI BUS ID",
    "MIG",
    "ISOLATION",
    "HEALTH",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_simulate_flag(
        parser, "show simulated GPUs from a profile such as 2xH100-80GB,1xL4-24GB instead of asking NVML"
    )
    add_flag(
        parser,
        "--node-name",
        env="DRA_GPU_NODE_NAME",
        default=None,
        help="node whose simulated GPUs to show (simulated UUIDs differ per node)",
        unset="none: the UUIDs of an unnamed node",
    )
    add_flag(
        parser,
        "--driver-root",
        default="/",
        type=Path,
        help="the host's root as this process sees it, as for kubelet-plugin (where the memory-limit hook is looked for)",
    )
    add_flag(
        parser,
        "--driver-root-host-path",
        default=None,
        type=Path,
        help="the driver root as the host sees it",
        unset="--driver-root",
    )
    add_flag(parser, "--output", short="-o", choices=list(OUTPUTS), default="table", help="output format")


def run(args: argparse.Namespace) -> int:
    if args.simulate is not None and not args.simulate.strip():
        return fail("--simulate needs a profile such as 2xH100-80GB (leave it out for NVML)")
    if not args.driver_root.is_dir():
        return fail(f"--driver-root {args.driver_root} is not a directory")
    hook = find_limit_hook(args.driver_root, args.driver_root_host_path)
    inventory = open_gpus(
        args,
        "show simulated GPUs instead (e.g. --simulate 2xH100-80GB)",
        seed=args.node_name or "",
        hook_problem=hook.problem,
    )
    if isinstance(inventory, int):
        return inventory
    try:
        gpus = inventory.gpus()
    finally:
        inventory.close()
    if args.output == "table":
        print(render_table(gpus, inventory.backend))
    else:
        print(dump(args.output, [gpu.to_json() for gpu in gpus]), end="")
    return 0


def render_table(gpus: list[GpuInfo], backend: str) -> str:
    rows = [_COLUMNS, *(_row(gpu) for gpu in gpus)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]) for row in rows
    ]
    if gpus:
        first = gpus[0]
        lines.append(
            f"\n{len(gpus)} GPU(s), backend {backend}, driver {first.driver_version}, "
            f"CUDA {first.cuda_driver_version or 'unknown'}"
        )
    else:
        lines.append(f"\nno GPUs found (backend {backend})")
    return "\n".join(lines)


def mig_state(gpu: GpuInfo) -> str:
    """`enabled`, `capable` (could be turned on) or `-`: "yes" read as "MIG is on" when it meant capable."""
    if gpu.mig_enabled:
        return "enabled"
    return "capable" if gpu.mig_capable else "-"


def _row(gpu: GpuInfo) -> tuple[str, ...]:
    return (
        str(gpu.index),
        gpu.uuid,
        gpu.product_name,
        gpu.architecture,
        gpu.cuda_compute_capability or "?",
        format_quantity(gpu.memory_bytes),
        gpu.pci_bus_id,
        mig_state(gpu),
        gpu.memory_isolation + (f" ({gpu.memory_limit_backend})" if gpu.memory_isolation == "driver" else ""),
        "ok" if gpu.healthy else f"unhealthy: {gpu.health_reason}",
    )
