"""What the commands that show this node's GPUs without a cluster (`gpus`, `slices`) share: the GPUs
through NVML, or simulated ones from `--simulate PROFILE`."""

from __future__ import annotations

import argparse
import sys

from dra_gpu.commands._exit import BAD_INPUT, fail
from dra_gpu.flags import add_flag
from dra_gpu.inventory import Inventory, InventoryError, NvmlUnavailableError, open_inventory
from dra_gpu.inventory.models import KNOWN_MODELS


def add_simulate_flag(parser: argparse.ArgumentParser, shows: str) -> None:
    """`--simulate PROFILE` (unset: NVML); `shows` says what it shows, the known models follow."""
    add_flag(
        parser,
        "--simulate",
        env="DRA_GPU_SIMULATE",
        default=None,
        help=f"{shows}; models: {', '.join(KNOWN_MODELS)}",
        unset="NVML",
    )


def open_gpus(args: argparse.Namespace, instead: str, seed: str, hook_problem: str = "") -> Inventory | int:
    """The inventory `--simulate` names (NVML without it), or the exit status once the problem is said:
    `instead` completes "use --simulate PROFILE to ..." where NVML is not there."""
    spec = f"simulated:{args.simulate}" if args.simulate is not None else "nvml"
    try:
        return open_inventory(spec, seed=seed, hook_problem=hook_problem)
    except NvmlUnavailableError as err:
        print(f"{err}; use --simulate PROFILE to {instead}", file=sys.stderr)
        return 1
    except InventoryError as err:
        return fail(str(err), BAD_INPUT if args.simulate is not None else 1)
