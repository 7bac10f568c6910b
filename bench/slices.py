"""How long building and publishing ResourceSlices takes: one 8-GPU node, and 1,000 simulated nodes.

Run: `.venv/bin/python bench/slices.py [--nodes 1000] [--repeat 200]`. Publishing goes to the in-memory
API server (`FakeKube`), so the figures are our own cost (building, validating, comparing) without the
network round trips a real API server adds.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

from dra_gpu.config import GpuSharingMode, NodeSharing
from dra_gpu.devicekinds.gpu import build_device
from dra_gpu.inventory.simulated import SimulatedInventory
from dra_gpu.kube import builders
from dra_gpu.kube.fake import FakeKube
from dra_gpu.slices import SlicePublisher, split_devices

PROFILE = "8xH100-80GB"
SHARING = NodeSharing.parse("*=Shared,7=MPS")


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def show(label: str, samples: list[float]) -> None:
    median = statistics.median(samples) * 1e3
    p95 = sorted(samples)[int(len(samples) * 0.95) - 1] * 1e3 if len(samples) > 1 else median
    print(f"{label:<52} median {median:8.3f} ms   p95 {p95:8.3f} ms   (n={len(samples)})")


def build_pool(inventory: SimulatedInventory, sharing: NodeSharing) -> list[list[dict[str, object]]]:
    devices = [build_device(g, sharing.mode_for(g.index, g.uuid)) for g in inventory.gpus()]
    return split_devices(devices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    logging.getLogger("dra_gpu").setLevel(logging.ERROR)  # the retaint loop would log every flip

    inventory = SimulatedInventory(PROFILE, seed="node-0")
    show(f"build one node's pool ({PROFILE})", timed(lambda: build_pool(inventory, SHARING), args.repeat))

    def first_publish() -> None:
        api = FakeKube()
        api.create("Node", builders.node("node-0"))
        SlicePublisher(api, "node-0", inventory, SHARING).sync()

    show("publish it to an empty API server (list, create)", timed(first_publish, args.repeat))

    api = FakeKube()
    api.create("Node", builders.node("node-0"))
    publisher = SlicePublisher(api, "node-0", inventory, SHARING)
    publisher.sync()
    show("reconcile an unchanged pool (list, compare)", timed(publisher.sync, args.repeat))

    def after_wipe() -> None:
        api.delete_collection("ResourceSlice", field_selector="spec.nodeName=node-0")
        publisher.sync()

    show("republish after the kubelet wiped it", timed(after_wipe, args.repeat))

    flip = [False]

    def health_change() -> None:
        flip[0] = not flip[0]
        inventory.set_health(3, not flip[0], "XID 79")
        publisher.sync()

    show("retaint one GPU (update one slice)", timed(health_change, args.repeat))

    start = time.perf_counter()
    devices = 0
    for n in range(args.nodes):
        node = SimulatedInventory(PROFILE, seed=f"node-{n}")
        devices += sum(len(s) for s in build_pool(node, SHARING))
    total = time.perf_counter() - start
    print(
        f"{'build pools for ' + str(args.nodes) + ' simulated nodes':<52} total {total * 1e3:9.1f} ms   "
        f"per node {total / args.nodes * 1e3:7.3f} ms   ({devices} devices)"
    )
    print(f"(modes: {SHARING}; {GpuSharingMode.SHARED.value} and MPS GPUs carry request policies)")


if __name__ == "__main__":
    main()
