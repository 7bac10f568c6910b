"""Allocating dynamic MIG placements: counters shared across the slices of a pool, as 1.36 does.

The pool is what `dra-gpu slices` publishes for a dynamic H100 (counters in a slice of their own).
Kubernetes 1.36 (DRAPartitionableDevices, beta and on) never allocates two devices whose summed
consumption of a counter exceeds the counter set's value, whether the first was allocated by the
scheduler or by a third party, and whichever slice of the pool the devices are in.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from allocator_support import allocate_and_commit, claim, device_class, make_allocator, request, selector

from dra_gpu.allocator import AllocationError
from dra_gpu.cli import main

MIG_CLASS = "mig.gpu.dra-gpu.io"
CLASSES = {MIG_CLASS: device_class(MIG_CLASS, 'device.attributes["gpu.dra-gpu.io"].type == "mig"')}


def pool(capsys: pytest.CaptureFixture[str], profile: str) -> list[dict[str, Any]]:
    assert main(["slices", "--simulate", profile, "-o", "json"]) == 0
    slices: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    for n, s in enumerate(slices):
        s["metadata"] = {"name": f"slice-{n}"}
    return slices


def profile_request(profile: str, name: str = "mig") -> dict[str, Any]:
    expr = f'device.attributes["gpu.dra-gpu.io"].profile == "{profile}"'
    return request(name, MIG_CLASS, selectors=[selector(expr)])


def test_placements_overlapping_an_allocated_one_are_not_offered(capsys: pytest.CaptureFixture[str]) -> None:
    alloc = make_allocator(pool(capsys, "1xH100-80GB:mig"), CLASSES)
    first = allocate_and_commit(alloc, claim("a", profile_request("4g.40gb")))
    assert [r["device"] for r in first["devices"]["results"]] == ["gpu-0-mig-4g40gb-0"]
    # 3g.40gb can start at 0 or 4; slices 0-3 are taken, so only 4 is offered.
    second = allocate_and_commit(alloc, claim("b", profile_request("3g.40gb")))
    assert [r["device"] for r in second["devices"]["results"]] == ["gpu-0-mig-3g40gb-4"]
    with pytest.raises(AllocationError, match="overlap a partition already allocated"):
        alloc.allocate(claim("c", profile_request("1g.10gb")))


def test_the_engines_a_gpu_has_are_counted_too(capsys: pytest.CaptureFixture[str]) -> None:
    alloc = make_allocator(pool(capsys, "1xH100-80GB:mig"), CLASSES)
    allocate_and_commit(alloc, claim("a", profile_request("1g.10gb+me")))  # takes the one OFA
    with pytest.raises(AllocationError, match=r'counter "ofa" of set "gpu-0-mig": needs 1, 0 of 1 left'):
        alloc.allocate(claim("b", profile_request("1g.10gb+me")))


def test_one_claim_cannot_take_two_overlapping_placements(capsys: pytest.CaptureFixture[str]) -> None:
    alloc = make_allocator(pool(capsys, "1xH100-80GB:mig"), CLASSES)
    with pytest.raises(AllocationError):  # 4g.40gb has one placement: two would overlap
        alloc.allocate(claim("a", profile_request("4g.40gb", "big"), profile_request("4g.40gb", "again")))
    one_each = alloc.allocate(
        claim("b", profile_request("4g.40gb", "big"), profile_request("3g.40gb", "small"))
    )
    assert [r["device"] for r in one_each["devices"]["results"]] == [
        "gpu-0-mig-4g40gb-0",
        "gpu-0-mig-3g40gb-4",
    ]


def test_releasing_a_placement_offers_its_slices_again(capsys: pytest.CaptureFixture[str]) -> None:
    alloc = make_allocator(pool(capsys, "1xH100-80GB:mig"), CLASSES)
    big = claim("a", profile_request("7g.80gb"))
    allocate_and_commit(alloc, big)
    with pytest.raises(AllocationError):
        alloc.allocate(claim("b", profile_request("1g.10gb")))
    alloc.release(big)
    again = alloc.allocate(claim("b", profile_request("1g.10gb")))
    assert [r["device"] for r in again["devices"]["results"]] == ["gpu-0-mig-1g10gb-0"]


def test_a_third_partys_allocation_counts(capsys: pytest.CaptureFixture[str]) -> None:
    done = claim("theirs", profile_request("3g.40gb"))
    done["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "mig",
                        "driver": "gpu.dra-gpu.io",
                        "pool": "node-1",
                        "device": "gpu-0-mig-3g40gb-0",
                    }
                ]
            }
        }
    }
    alloc = make_allocator(pool(capsys, "1xH100-80GB:mig"), CLASSES, allocated=[done])
    got = alloc.allocate(claim("mine", profile_request("2g.20gb")))
    assert [r["device"] for r in got["devices"]["results"]] == ["gpu-0-mig-2g20gb-4"]


def test_a_pool_with_a_counter_set_listed_twice_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    """As the scheduler does ("duplicate counter set name"): which of the two sets would count is undefined."""
    slices = pool(capsys, "1xH100-80GB:mig")
    counters = next(s for s in slices if s["spec"].get("sharedCounters"))
    again = json.loads(json.dumps(counters))
    again["metadata"] = {"name": "slice-again"}
    slices.append(again)
    for s in slices:
        s["spec"]["pool"]["resourceSliceCount"] = len(slices)
    alloc = make_allocator(slices, CLASSES)
    with pytest.raises(AllocationError, match=r'invalid: counter set "gpu-0-mig" is listed twice'):
        alloc.allocate(claim("a", profile_request("1g.10gb")))
