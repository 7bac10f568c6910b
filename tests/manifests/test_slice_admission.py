"""The ResourceSlice policy lets a node agent write only its own node's slices, in the pool named after its
node, of this driver: one node can neither publish nor take over nor delete another node's GPUs, nor
shadow its pool with a higher generation. Its CEL runs here with the project's CEL, against requests
shaped as the API server sends them."""

from __future__ import annotations

from typing import Any

import cel
import pytest
import yaml
from policy_cel import refusals_in

from dra_gpu import DRIVER_NAME
from dra_gpu.allocator.cel_env import kubernetes_context, rewrite_optionals
from dra_gpu.manifests import load_values, render

Obj = dict[str, Any]
AGENT = f"system:serviceaccount:{load_values().kubeletPlugin.namespace}:dra-gpu-kubelet-plugin"


def policy() -> Obj:
    docs = yaml.safe_load_all(render(load_values())["validatingadmissionpolicy.yaml"])
    return next(
        d
        for d in docs
        if d and d["metadata"]["name"] == "dra-gpu-resourceslices" and d["kind"].endswith("Policy")
    )


def run(expression: str, context: Any) -> Any:
    return cel.compile(rewrite_optionals(expression)).execute(context)


def refusals(
    operation: str, user_node: str | None, new: Obj | None = None, old: Obj | None = None
) -> list[str]:
    """The messages the API server returns for the agent of `user_node` doing `operation` (none: admitted)."""
    spec = policy()["spec"]
    extra = {"authentication.kubernetes.io/node-name": [user_node]} if user_node else {}
    context = kubernetes_context()
    context.add_variable("request", {"operation": operation, "userInfo": {"username": AGENT, "extra": extra}})
    context.add_variable("object", new)
    context.add_variable("oldObject", old)
    assert all(run(c["expression"], context) is True for c in spec["matchConditions"])
    return refusals_in(context, spec, run)


def slice_of(node: str, pool: str | None = None, driver: str = DRIVER_NAME, generation: int = 1) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-x"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_the_agent_writes_its_own_nodes_pool(operation: str) -> None:
    own = slice_of("node-a")
    new, old = (own, None) if operation == "CREATE" else (None, own)
    assert refusals(operation, "node-a", new, old) == []
    assert refusals("UPDATE", "node-a", slice_of("node-a", generation=2), own) == []


def test_a_node_cannot_shadow_another_nodes_pool() -> None:
    shadow = slice_of("node-a", pool="node-b", generation=99)
    assert refusals("CREATE", "node-a", shadow) == [
        "the node agent on node 'node-a' may modify only the pool named after its node, not pool 'node-b'"
    ]


def test_a_node_cannot_publish_slices_of_another_node() -> None:
    assert refusals("CREATE", "node-a", slice_of("node-b")) == [
        "the node agent on node 'node-a' may not modify ResourceSlices of node 'node-b'",
        "the node agent on node 'node-a' may modify only the pool named after its node, not pool 'node-b'",
    ]


def test_a_node_cannot_take_over_or_delete_another_nodes_slice() -> None:
    theirs = slice_of("node-b")
    taken = slice_of("node-a", pool="node-a")
    assert "the node agent on node 'node-a' may not modify ResourceSlices of node 'node-b'" in refusals(
        "UPDATE", "node-a", taken, theirs
    )
    assert "the node agent on node 'node-a' may not modify ResourceSlices of node 'node-b'" in refusals(
        "DELETE", "node-a", None, theirs
    )


def test_a_node_cannot_publish_for_another_driver() -> None:
    assert refusals("CREATE", "node-a", slice_of("node-a", driver="gpu.nvidia.com")) == [
        f"the node agent on node 'node-a' may modify only ResourceSlices of driver {DRIVER_NAME}, "
        "not of driver 'gpu.nvidia.com'"
    ]


def test_a_slice_without_a_node_is_refused() -> None:
    unbound = slice_of("node-a")
    del unbound["spec"]["nodeName"]
    assert refusals("CREATE", "node-a", unbound) == [
        "the node agent on node 'node-a' may not modify ResourceSlices without a node"
    ]


def test_an_agent_without_a_node_in_its_token_is_refused() -> None:
    assert refusals("CREATE", None, slice_of("node-a"))[0].startswith(
        "no node association found for the user"
    )


def test_a_stray_pool_on_its_own_node_may_be_deleted_but_not_written() -> None:
    stray = slice_of("node-a", pool="old-name")
    assert refusals("DELETE", "node-a", None, stray) == []
    assert refusals("UPDATE", "node-a", slice_of("node-a"), stray) == []  # renamed into its own pool
    assert refusals("UPDATE", "node-a", stray, slice_of("node-a")) == [
        "the node agent on node 'node-a' may modify only the pool named after its node, not pool 'old-name'"
    ]
