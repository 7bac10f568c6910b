"""The objects kube.builders makes are the ones the real 1.36 API server stores (tests/fixtures/k8s-1.36-real),
and its edits change a copy, never the object a reader holds."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from repo_paths import TESTS

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import Invalid, builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.validation import device_class_errors, slice_errors

REAL = TESTS / "fixtures" / "k8s-1.36-real"


def _real_claim(name: str) -> dict[str, Any]:
    items = json.loads((REAL / "resourceclaims-after-scheduling.json").read_text())["items"]
    return next(c for c in items if objects.name(c) == name)


def _rebuilt(real: dict[str, Any]) -> dict[str, Any]:
    """The real claim made again from what the accessors read of it, through the builders."""
    [request] = objects.device_requests(real)
    assert request.exactly is not None
    built = builders.claim(
        objects.name(real), request.exactly.device_class, capacity=request.exactly.capacity
    )
    allocated = objects.allocation(real)
    assert allocated is not None
    results = [
        builders.device_result(
            r.request, r.driver, r.pool, r.device, share_id=r.share_id, consumed=r.consumed
        )
        for r in objects.device_results(allocated)
    ]
    allocation = builders.allocation(
        results,
        objects.allocation_config(allocated),
        node_name=objects.allocation_node(allocated),
        timestamp=allocated["allocationTimestamp"],
    )
    return builders.allocated_claim(built, allocation, *objects.reserved_for(real))


@pytest.mark.parametrize("name", ["shared", "pod-t-gpu-fmmjp"])
def test_a_built_claim_and_its_allocation_are_what_the_real_server_stores(name: str) -> None:
    real = _real_claim(name)
    built = _rebuilt(real)
    assert objects.spec(built) == objects.spec(real)
    assert objects.status(built) == objects.status(real)


def test_a_built_claim_is_accepted_allocated_and_reserved_by_the_in_memory_server() -> None:
    api = FakeKube()
    created = api.create(
        "ResourceClaim", builders.claim("c", "limiter.gpu.dra-gpu.io", capacity={"memory": "1Gi"})
    )
    result = builders.device_result(
        "gpu", DRIVER_NAME, "node-1", "gpu-0", share_id="s-1", consumed={"memory": "1Gi"}
    )
    allocation = builders.allocation([result], node_name="node-1", timestamp="2026-11-28T00:00:00Z")
    pod = builders.pod_reference("p", "uid-p")
    stored = api.update_status("ResourceClaim", builders.allocated_claim(created, allocation, pod))
    [read] = objects.device_results(objects.allocation(stored))
    assert (read.device, read.share_id, read.consumed) == ("gpu-0", "s-1", {"memory": "1Gi"})
    assert objects.allocation_node(objects.allocation(stored) or {}) == "node-1"
    assert objects.reserved_for(stored) == [pod]
    wrong = builders.device_result("other", DRIVER_NAME, "node-1", "gpu-1")
    other = api.create("ResourceClaim", builders.claim("d", "gpu.dra-gpu.io"))
    with pytest.raises(Invalid, match="must be the name of a request in the claim"):
        api.update_status("ResourceClaim", builders.with_allocation(other, builders.allocation([wrong])))


def test_a_built_slice_and_class_pass_the_servers_validation() -> None:
    device = {"name": "gpu-0", "attributes": {"index": {"int": 0}}, "capacity": {"memory": {"value": "80Gi"}}}
    spec = builders.slice_spec(DRIVER_NAME, "node-1", "node-1", devices=[device], generation=1, slice_count=1)
    built = builders.resource_slice(spec, generate_name="node-1-gpu.dra-gpu.io-")
    assert slice_errors(built) == []
    assert (objects.pool_name(built), objects.pool_generation(built), objects.slice_node(built)) == (
        "node-1",
        1,
        "node-1",
    )
    device_class = builders.device_class(DRIVER_NAME, ["true"], [builders.opaque_config(DRIVER_NAME, {})])
    assert device_class_errors(device_class) == []


def test_edits_change_a_copy_and_leave_the_object_read() -> None:
    real = _real_claim("shared")
    before = copy.deepcopy(real)
    finalized = builders.with_finalizer(real, "x.io/f")
    assert objects.finalizers(finalized) == [*objects.finalizers(real), "x.io/f"]
    assert builders.with_finalizer(finalized, "x.io/f") == finalized, "added once"
    assert "x.io/f" not in objects.finalizers(builders.without_finalizer(finalized, "x.io/f"))
    released = builders.without_allocation(real)
    assert objects.allocation(released) is None and objects.reserved_for(released) == []
    more = builders.with_reservation(
        real, builders.pod_reference("pod-s3", "u3"), *objects.reserved_for(real)
    )
    assert [r["name"] for r in objects.reserved_for(more)] == ["pod-s1", "pod-s2", "pod-s3"]
    pod = builders.pod("p", ["shared"])
    assert objects.pod_node(builders.bound(pod, "node-1")) == "node-1" and objects.pod_node(pod) == ""
    assert real == before


def test_a_lease_is_taken_over_renewed_and_released() -> None:
    lease = builders.lease("l", "ns", "a", 15, "t0")
    assert (
        objects.lease_holder(lease),
        objects.lease_renew_time(lease),
        objects.lease_transitions(lease),
    ) == ("a", "t0", 0)
    renewed = builders.renewed(lease, "a", 15, "t1")
    assert objects.lease_renew_time(renewed) == "t1" and objects.lease_transitions(renewed) == 0
    assert objects.spec(renewed)["acquireTime"] == "t0"
    taken = builders.renewed(renewed, "b", 15, "t2")
    assert (objects.lease_holder(taken), objects.lease_transitions(taken)) == ("b", 1)
    assert objects.spec(taken)["acquireTime"] == "t2"
    released = builders.renewed(taken, "", 1, "t3")
    assert (
        objects.lease_holder(released),
        objects.lease_duration_s(released),
        objects.lease_transitions(released),
    ) == (
        "",
        1,
        1,
    )
    assert objects.lease_holder(lease) == "a", "the lease read is unchanged"
