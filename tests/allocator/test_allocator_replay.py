"""Replays what a real Kubernetes 1.36 scheduler did (tests/fixtures/k8s-1.36-real) through the allocator.

Same slice, classes and claims, in the order they were applied; the allocator must agree with the
scheduler on which claims fit, which device each got, the rounded consumedCapacity, the configs and
the nodeSelector. Where the scheduler gave up, the allocator must fail and say why.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml
from repo_paths import TESTS

from dra_gpu.allocator import AllocationError, Allocator

FIXTURES = TESTS / "fixtures" / "k8s-1.36-real"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def load_yaml(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]


def load_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def real_claims() -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in load_json("resourceclaims-after-scheduling.json")["items"]}


@pytest.fixture(scope="module")
def events() -> dict[str, str]:
    """Pod name -> the scheduler's last event reason for it."""
    return {e["object"].removeprefix("Pod/"): e["reason"] for e in load_json("events.json")["items"]}


def comparable(allocation: dict[str, Any]) -> dict[str, Any]:
    """An allocation without what differs between any two runs: shareIDs and the timestamp."""
    out = copy.deepcopy(allocation)
    out.pop("allocationTimestamp", None)
    for result in out["devices"]["results"]:
        if "shareID" in result:
            assert UUID.match(result["shareID"]), result["shareID"]
            result["shareID"] = "<uuid>"
    return out


class Replay:
    def __init__(self) -> None:
        classes = {c["metadata"]["name"]: c for c in load_yaml("classes.yaml") + load_yaml("ext.yaml")[:1]}
        self.alloc = Allocator(load_yaml("slice.yaml"), classes, [])

    def apply(self, claim: dict[str, Any]) -> dict[str, Any]:
        allocation = self.alloc.allocate(claim)
        done = {**claim, "status": {"allocation": allocation}}
        self.alloc.commit(done)
        return allocation


def template_claim(real_claims: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The claim the resourceclaim controller generated from the whole-gpu template."""
    template = next(d for d in load_yaml("claims1.yaml") if d["kind"] == "ResourceClaimTemplate")
    real = real_claims["pod-t-gpu-fmmjp"]
    return {
        "metadata": {"name": real["metadata"]["name"], "namespace": "default"},
        "spec": template["spec"]["spec"],
    }


def test_replay_matches_the_real_scheduler(
    real_claims: dict[str, dict[str, Any]], events: dict[str, str]
) -> None:
    replay = Replay()

    # claims1.yaml + the template's claim: three shares of gpu-0 and the whole gpu-1, all scheduled.
    first = [d for d in load_yaml("claims1.yaml") if d["kind"] == "ResourceClaim"] + [
        template_claim(real_claims)
    ]
    for c in first:
        ours = replay.apply(c)
        real = real_claims[c["metadata"]["name"]]["status"]["allocation"]
        assert RFC3339.match(ours["allocationTimestamp"])
        assert comparable(ours) == comparable(real), c["metadata"]["name"]

    # 10.5Gi at a 1Gi step became 11Gi, as the real scheduler rounded it.
    b = real_claims["share-b"]["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert b["memory"] == "11Gi"

    # claims2.yaml: nothing fits; the real scheduler left all three unallocated.
    expected_why = {
        "share-c-asks-nothing": 'capacity "cores": needs 100, 20 of 100 left',  # default = whole GPU
        "share-d-too-many-cores": 'capacity "cores": needs 25, 20 of 100 left',
        "whole-2": "in use by another claim (gpu.dra-gpu.io/node-1/gpu-1)",
    }
    for c in load_yaml("claims2.yaml"):
        name = c["metadata"]["name"]
        assert "allocation" not in real_claims[name].get("status", {})
        with pytest.raises(AllocationError) as err:
            replay.apply(c)
        assert expected_why[name] in str(err.value)

    # A third party's allocation (10 cores) counts as in use, as it did for the scheduler.
    replay.alloc.commit(load_json("third-party-allocation-without-timestamp.json"))

    # claims3.yaml: 10 cores fill the GPU exactly (pod-e scheduled), 1 more core does not (pod-f).
    fills, one_more = load_yaml("claims3.yaml")
    assert events["pod-e"] == "Scheduled" and events["pod-f"] == "FailedScheduling"
    got = replay.apply(fills)
    assert got["devices"]["results"][0]["device"] == "gpu-0"
    assert got["devices"]["results"][0]["consumedCapacity"] == {"cores": "10", "memory": "1Gi"}
    with pytest.raises(AllocationError, match=r'capacity "cores": needs 1, 0 of 100 left'):
        replay.apply(one_more)


def test_extended_resource_claim_gets_the_policy_default_on_an_empty_node() -> None:
    real = load_json("extended-resource-claim.json")["items"][0]
    claim = {"metadata": real["metadata"], "spec": real["spec"]}
    ours = Replay().alloc.allocate(claim)
    assert comparable(ours) == comparable(real["status"]["allocation"])
    assert ours["devices"]["results"][0]["consumedCapacity"] == {"cores": "100", "memory": "80Gi"}


def test_allocations_pass_the_real_api_servers_shape(real_claims: dict[str, dict[str, Any]]) -> None:
    """Keys and nesting exactly as the API server returned them (nothing extra, nothing missing)."""
    replay = Replay()
    ours = replay.apply(next(d for d in load_yaml("claims1.yaml") if d["metadata"]["name"] == "share-b"))
    real = real_claims["share-b"]["status"]["allocation"]
    assert set(ours) == set(real)
    assert set(ours["devices"]) == set(real["devices"])
    assert [set(r) for r in ours["devices"]["results"]] == [set(r) for r in real["devices"]["results"]]
    assert [set(c) for c in ours["devices"]["config"]] == [set(c) for c in real["devices"]["config"]]
    assert [c["source"] for c in ours["devices"]["config"]] == ["FromClass", "FromClaim"]
