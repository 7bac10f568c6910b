"""The node's pool is published, accepted by the API server as sent, and republished after a wipe."""

from __future__ import annotations

from e2e_support import Agent, attribute, node_devices, node_slices, wait_for

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import KubeAPI


def test_pool_is_published_and_accepted(api: KubeAPI, agent: Agent) -> None:
    slices = node_slices(api, agent.node)
    assert slices, f"node {agent.node} publishes no ResourceSlice"
    pools = {
        (s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
        for s in slices
    }
    assert len(pools) == 1, f"slices of several pools or generations: {pools}"
    ((pool, _, count),) = pools
    assert pool == agent.node and count == len(slices)
    node = api.get("Node", agent.node)
    for s in slices:
        assert s["spec"]["driver"] == DRIVER_NAME and s["spec"]["nodeName"] == agent.node
        (owner,) = s["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner.get("controller")) == (
            "Node",
            agent.node,
            node["metadata"]["uid"],
            True,
        )
    devices = node_devices(api, agent.node)
    assert devices, "the pool has no devices"
    for device in devices:
        assert device["name"].startswith("gpu-")
        assert attribute(device, "sharing") in ("Exclusive", "Shared", "MPS")
        assert str(attribute(device, "uuid")).startswith("GPU-")
        assert {"memory", "cores"} <= set(device["capacity"])
        shareable = attribute(device, "sharing") != "Exclusive"
        # Stored as sent: an API server with DRAConsumableCapacity off drops these (and the agent then
        # falls back to unshared devices, which this cluster is not meant to need).
        why = f"{device['name']}: shared-device fields missing; is DRAConsumableCapacity on?"
        assert bool(device.get("allowMultipleAllocations")) == shareable, why
        assert all(("requestPolicy" in c) == shareable for c in device["capacity"].values()), why


def test_pool_comes_back_after_its_slices_are_deleted(api: KubeAPI, agent: Agent) -> None:
    before = sorted(d["name"] for d in node_devices(api, agent.node))
    api.delete_collection(
        "ResourceSlice", field_selector=f"spec.nodeName={agent.node},spec.driver={DRIVER_NAME}"
    )
    wait_for(
        "the pool to be republished",
        lambda: sorted(d["name"] for d in node_devices(api, agent.node)) == before or None,
        timeout_s=60,
        every_s=0.5,
    )
