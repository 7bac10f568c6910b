"""A node cannot shadow another node's pool in the controller's view: a slice that puts a pool on a node it
is not named after is left out, with an Event on it saying why, and the node's own slices still count."""

from __future__ import annotations

from typing import Any

from test_controller_reconcile import BINPACK, Cluster, gpu_slice

from dra_gpu.controller.pool_nodes import REASON, refuse_foreign_slices


def shadow(of: str, by: str, generation: int = 99) -> dict[str, Any]:
    """A slice that node `by` publishes in the pool of node `of`, at a higher generation."""
    obj = gpu_slice(by, gpus=1)
    obj["metadata"]["name"] = f"{by}-shadows-{of}"
    obj["spec"]["pool"] = {"name": of, "generation": generation, "resourceSliceCount": 1}
    return obj


def pool_events(cluster: Cluster) -> list[dict[str, Any]]:
    return [e for e in cluster.api.objects("Event") if e["reason"] == REASON]


def test_a_slice_shadowing_another_nodes_pool_is_left_out_with_an_event() -> None:
    cluster = Cluster(nodes=2)
    cluster.api.create("ResourceSlice", shadow(of="node-1", by="node-0"))
    cluster.claim("c", BINPACK, cores=30)
    cluster.pod("p", "c", node_name="node-1")
    cluster.run()
    # node-1's own pool (generation 1) is what the claim gets, not node-0's GPU at generation 99
    assert cluster.device_of("c")[0] == "node-1"
    (event,) = pool_events(cluster)
    assert event["involvedObject"]["kind"] == "ResourceSlice"
    assert event["involvedObject"]["name"] == "node-0-shadows-node-1"
    assert event["type"] == "Warning"
    assert event["message"].startswith(
        "slice left out of pool gpu.dra-gpu.io/node-1: a pool of gpu.dra-gpu.io belongs to the node it is "
        "named after, and this slice names 'node-0'"
    )
    cluster.run()
    assert len(pool_events(cluster)) == 1  # a later pass adds no second event


def test_another_drivers_pool_on_two_nodes_is_left_out_whole() -> None:
    slices = []
    for node in ("node-0", "node-1"):
        obj = gpu_slice(node, gpus=1)
        obj["spec"]["driver"] = "other.example.com"
        obj["spec"]["pool"]["name"] = "shared-name"
        slices.append(obj)
    kept, refused = refuse_foreign_slices([*slices, gpu_slice("node-0")])
    assert [s["spec"]["driver"] for s in kept] == ["gpu.dra-gpu.io"]
    (refusal,) = refused
    assert refusal.pool == "shared-name" and len(refusal.slices) == 2
    assert "its slices name the nodes 'node-0', 'node-1'" in refusal.message


def test_pools_of_one_node_each_raise_nothing() -> None:
    cluster = Cluster(nodes=2)
    cluster.claim("c", BINPACK, cores=30)
    cluster.pod("p", "c")
    cluster.run()
    assert pool_events(cluster) == []
