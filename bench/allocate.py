"""Allocation throughput: 1,000 simulated nodes with 8 GPUs each and 10,000 claims of mixed sizes.

Prints claims allocated per second for first fit (no policy), BinPack and Spread. Each run allocates
and commits the claims one after the other, as the cluster controller does. The slices are built in
memory in the shape the kubelet plugin publishes (four shareable and four exclusive H100s per node).

    .venv/bin/python bench/allocate.py [--nodes 1000] [--claims 10000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from allocator_support import gpu, standard_classes

from dra_gpu import DRIVER_NAME
from dra_gpu.allocator import AllocationError, Allocator
from dra_gpu.config import Placement, PlacementPolicy
from dra_gpu.kube import builders

GOAL = 200.0


def make_slices(nodes: int) -> list[dict[str, Any]]:
    slices = []
    for n in range(nodes):
        node = f"node-{n:04d}"
        devices = [
            gpu(f"gpu-{g}", shared=g < 4, attrs={"uuid": {"string": f"GPU-{n:04d}-{g}"}, "index": {"int": g}})
            for g in range(8)
        ]
        spec = builders.slice_spec(DRIVER_NAME, node, node, devices=devices, generation=1, slice_count=1)
        slices.append(builders.resource_slice(spec, name=f"{node}-{DRIVER_NAME}"))
    return slices


def make_claims(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """70% fractional shares (5-40Gi), 22% one whole GPU, 8% two whole GPUs of the same model."""
    claims = []
    for i in range(count):
        kind = rng.random()
        constraints: list[dict[str, Any]] = []
        if kind < 0.70:
            memory = rng.choice(["5Gi", "10Gi", "10.5Gi", "20Gi", "40Gi"])
            cores = str(rng.choice([10, 20, 25, 50]))
            asked = {"memory": memory, "cores": cores}
            request = builders.exact_request("gpu", f"limiter.{DRIVER_NAME}", capacity=asked)
        elif kind < 0.92:
            request = builders.exact_request("gpu", DRIVER_NAME)
        else:
            request = builders.exact_request("gpus", DRIVER_NAME, count=2)
            constraints = [{"matchAttribute": f"{DRIVER_NAME}/productName"}]
        claim = builders.resource_claim(
            f"claim-{i}", [request], namespace="bench", constraints=constraints, uid=f"uid-{i}"
        )
        claims.append(claim)
    return claims


def run(label: str, slices: Any, classes: Any, claims: Any, policy: Placement | None) -> float:
    start = time.perf_counter()
    allocator = Allocator(slices, classes, [])
    setup = time.perf_counter() - start
    outcome: Counter[str] = Counter()
    start = time.perf_counter()
    for claim in claims:
        try:
            allocation = allocator.allocate(claim, policy=policy)
        except AllocationError:
            outcome["unallocatable"] += 1
            continue
        allocator.commit(builders.with_allocation(claim, allocation))
        outcome["allocated"] += 1
    elapsed = time.perf_counter() - start
    rate = len(claims) / elapsed
    print(
        f"{label:<10} {rate:8.0f} claims/s  ({len(claims)} claims in {elapsed:.2f}s, "
        f"{outcome['allocated']} allocated, {outcome['unallocatable']} did not fit; setup {setup:.2f}s)"
    )
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    slices, classes = make_slices(args.nodes), standard_classes()
    claims = make_claims(args.claims, random.Random(args.seed))
    print(f"{args.nodes} nodes x 8 GPUs, {len(claims)} claims; goal {GOAL:.0f} claims/s")
    rates = [
        run("first-fit", slices, classes, claims, None),
        run("BinPack", slices, classes, claims, Placement(policy=PlacementPolicy.BIN_PACK)),
        run("Spread", slices, classes, claims, Placement(policy=PlacementPolicy.SPREAD)),
    ]
    slowest = min(rates)
    print(f"slowest {slowest:.0f} claims/s: {'meets' if slowest >= GOAL else 'BELOW'} the goal of {GOAL:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
