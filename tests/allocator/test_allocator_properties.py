"""Property: whatever the pools and the sequence of claims, the allocator never over-commits a shared
device's capacity and never gives a non-shared device to two claims, across commit and release.

The check recomputes usage from the committed allocations themselves (not from the allocator's own
bookkeeping), so a bookkeeping bug shows up as a violation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction
from typing import Any

from allocator_support import DRIVER, claim, device_class, make_allocator, node_slice
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gpu.allocator import AllocationError
from dra_gpu.config import Placement, PlacementPolicy
from dra_gpu.quantity import parse_quantity

CLASSES = {
    "shared": device_class("shared", "device.allowMultipleAllocations"),
    "whole": device_class("whole", "!device.allowMultipleAllocations"),
    "any": device_class("any", f'device.driver == "{DRIVER}"'),
}


@st.composite
def devices(draw: st.DrawFn, node: int, count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        memory = draw(st.sampled_from([8, 16, 80]))
        cores = draw(st.sampled_from([10, 100]))
        device: dict[str, Any] = {
            "name": f"gpu-{i}",
            "attributes": {
                "model": {"string": draw(st.sampled_from(["a", "b"]))},
                "uuid": {"string": f"GPU-{node}-{i}"},
            },
            "capacity": {"memory": {"value": f"{memory}Gi"}, "cores": {"value": str(cores)}},
        }
        if draw(st.booleans()):
            device["allowMultipleAllocations"] = True
            policy = draw(st.sampled_from(["none", "range", "values"]))
            if policy == "range":
                device["capacity"]["memory"]["requestPolicy"] = {
                    "default": f"{memory}Gi",
                    "validRange": {
                        "min": "1Gi",
                        "max": f"{memory}Gi",
                        "step": draw(st.sampled_from(["1Gi", "2Gi"])),
                    },
                }
            elif policy == "values":
                device["capacity"]["cores"]["requestPolicy"] = {
                    "default": str(cores),
                    "validValues": sorted({str(cores // 2), str(cores)}, key=int),
                }
        out.append(device)
    return out


@st.composite
def clusters(draw: st.DrawFn) -> list[dict[str, Any]]:
    nodes = draw(st.integers(1, 3))
    return [node_slice(f"node-{n}", draw(devices(n, draw(st.integers(1, 4))))) for n in range(nodes)]


@st.composite
def requests(draw: st.DrawFn, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": draw(st.sampled_from(sorted(CLASSES)))}
    if draw(st.integers(0, 5)) == 0:
        spec["allocationMode"] = "All"
    else:
        spec["count"] = draw(st.integers(1, 2))
    caps = {}
    if draw(st.booleans()):
        caps["memory"] = draw(st.sampled_from(["1Gi", "1.5Gi", "3Gi", "7Gi", "16Gi"]))
    if draw(st.booleans()):
        caps["cores"] = draw(st.sampled_from(["1", "5", "10", "50"]))
    if caps:
        spec["capacity"] = {"requests": caps}
    if draw(st.integers(0, 4)) == 0:
        alt = dict(spec, name="alt", deviceClassName=draw(st.sampled_from(sorted(CLASSES))))
        return {"name": name, "firstAvailable": [dict(spec, name="first"), alt]}
    return {"name": name, "exactly": spec}


@st.composite
def claims(draw: st.DrawFn, n: int) -> dict[str, Any]:
    reqs = [draw(requests(name)) for name in draw(st.sampled_from([["a"], ["a", "b"]]))]
    constraints = []
    if draw(st.booleans()):
        constraints.append(
            {draw(st.sampled_from(["matchAttribute", "distinctAttribute"])): f"{DRIVER}/model"}
        )
    labels = {"tenant": draw(st.sampled_from(["x", "y"]))} if draw(st.booleans()) else None
    return claim(f"c{n}", *reqs, constraints=constraints, labels=labels)


POLICIES = st.sampled_from(
    [
        None,
        Placement(policy=PlacementPolicy.BIN_PACK),
        Placement(policy=PlacementPolicy.SPREAD, exclusionLabel="tenant"),
        Placement(policy=PlacementPolicy.BIN_PACK, affinityLabel="tenant"),
        Placement(policy=PlacementPolicy.SPREAD, antiAffinityLabel="tenant"),
    ]
)


def check_no_overcommit(slices: list[dict[str, Any]], committed: dict[str, dict[str, Any]]) -> None:
    capacity: dict[tuple[str, str], dict[str, Fraction]] = {}
    shared: set[tuple[str, str]] = set()
    for s in slices:
        for d in s["spec"]["devices"]:
            key = (s["spec"]["pool"]["name"], d["name"])
            capacity[key] = {n: parse_quantity(c["value"]) for n, c in d["capacity"].items()}
            if d.get("allowMultipleAllocations"):
                shared.add(key)
    whole_holders: Counter[tuple[str, str]] = Counter()
    share_holders: dict[tuple[str, str], set[str]] = defaultdict(set)
    consumed: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for name, c in committed.items():
        for r in c["status"]["allocation"]["devices"]["results"]:
            key = (r["pool"], r["device"])
            if key in shared and "shareID" in r:
                share_holders[key].add(name)
                assert set(r["consumedCapacity"]) == set(capacity[key]), r  # every capacity listed
                for cap, value in r["consumedCapacity"].items():
                    consumed[key][cap] += parse_quantity(value)
            else:
                assert key not in shared or "shareID" not in r
                whole_holders[key] += 1
    for key, n in whole_holders.items():
        assert n == 1, f"{key} handed out whole {n} times"
        assert not share_holders[key], f"{key} handed out whole and shared"
    for key, used in consumed.items():
        for cap, amount in used.items():
            assert amount <= capacity[key][cap], f"{key} {cap}: {amount} > {capacity[key][cap]}"


def check_shape(allocation: dict[str, Any], c: dict[str, Any], slices: list[dict[str, Any]]) -> None:
    results = allocation["devices"]["results"]
    pools = {r["pool"] for r in results}
    assert len(pools) == 1, "node-local devices of one claim on several nodes"
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [pools.pop()]
    for req in c["spec"]["devices"]["requests"]:
        got = [r for r in results if r["request"].split("/")[0] == req["name"]]
        spec = req.get("exactly")
        if spec and spec.get("allocationMode") != "All":
            assert len(got) == spec["count"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_never_overcommits_and_never_double_allocates(data: st.DataObject) -> None:
    slices = data.draw(clusters(), label="slices")
    alloc = make_allocator(slices, CLASSES)
    committed: dict[str, dict[str, Any]] = {}
    for n in range(data.draw(st.integers(1, 14), label="steps")):
        if committed and data.draw(st.integers(0, 4), label="release?") == 0:
            name = data.draw(st.sampled_from(sorted(committed)), label="release")
            alloc.release(committed.pop(name))
            continue
        c = data.draw(claims(n), label=f"claim {n}")
        policy = data.draw(POLICIES, label="policy")
        before = [list(h.items()) for h in alloc.usage.holders], list(alloc.usage.used)
        try:
            allocation = alloc.allocate(c, policy=policy)
        except AllocationError as exc:
            assert str(exc)  # always says something
            continue
        finally:  # allocate alone changes nothing
            assert ([list(h.items()) for h in alloc.usage.holders], list(alloc.usage.used)) == before
        check_shape(allocation, c, slices)
        c["status"] = {"allocation": allocation}
        alloc.commit(c)
        committed[c["metadata"]["name"]] = c
        check_no_overcommit(slices, committed)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_commit_of_the_same_claim_twice_counts_it_once(data: st.DataObject) -> None:
    slices = data.draw(clusters())
    alloc = make_allocator(slices, CLASSES)
    c = data.draw(claims(0))
    try:
        allocation = alloc.allocate(c)
    except AllocationError:
        return
    c["status"] = {"allocation": allocation}
    alloc.commit(c)
    first = [dict(h) for h in alloc.usage.holders], list(alloc.usage.used)
    alloc.commit(c)
    assert ([dict(h) for h in alloc.usage.holders], list(alloc.usage.used)) == first
    alloc.release(c)
    assert not any(alloc.usage.holders) and all(u is None for u in alloc.usage.used)
