"""`dra-gpu slices`: the ResourceSlices the node agent would publish, without a cluster.

The real slice publisher runs against the in-memory API server (which applies the real API
server's slice validation), so the preview is exactly what the agent sends: MIG devices,
dynamic MIG counter sets in slices of their own, and the split into slices of at most 64 devices.
"""

from __future__ import annotations

import argparse
import logging

from dra_gpu.commands._exit import fail
from dra_gpu.commands._simulate import add_simulate_flag, open_gpus
from dra_gpu.commands.output import dump
from dra_gpu.config import ConfigError
from dra_gpu.config.node import NodeSharing
from dra_gpu.flags import add_flag
from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.slices.publisher import SliceError, SlicePublisher

NAME = "slices"
HELP = "print the ResourceSlices the node agent would publish (real GPUs, or simulated with --simulate)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_simulate_flag(
        parser,
        "simulated GPUs from a profile such as 2xH100-80GB or 1xH100-80GB:mig (dynamic MIG) or "
        "1xH100-80GB:mig=1g.10gb*7 (static MIG)",
    )
    add_flag(
        parser, "--node-name", env="DRA_GPU_NODE_NAME", default="node-1", help="the node (and pool) name"
    )
    add_flag(parser, "--sharing", default="*=Shared", help="per-GPU sharing modes, e.g. '*=Shared,0=MPS'")
    add_flag(parser, "--output", short="-o", choices=["json", "yaml"], default="yaml", help="output format")


def run(args: argparse.Namespace) -> int:
    if args.simulate is not None and not args.simulate.strip():
        return fail("--simulate needs a profile such as 1xH100-80GB:mig (leave it out for NVML)")
    try:
        sharing = NodeSharing.parse(args.sharing)
    except ConfigError as err:
        return fail(str(err))
    inventory = open_gpus(args, "preview simulated GPUs instead", seed=args.node_name)
    if isinstance(inventory, int):
        return inventory
    api = FakeKube()
    api.create("Node", builders.node(args.node_name))
    logging.getLogger("dra_gpu.slices.publisher").setLevel(logging.WARNING)  # no "published" line
    try:
        slices = SlicePublisher(api, args.node_name, inventory, sharing).sync()
    except SliceError as err:
        return fail(str(err), 1)
    finally:
        inventory.close()
    shown = [{"apiVersion": s["apiVersion"], "kind": s["kind"], "spec": objects.spec(s)} for s in slices]
    print(dump(args.output, shown), end="")
    return 0
