"""Every `resource.k8s.io/v1` allocation semantic the allocator implements: each one shown working,
and shown failing with a message that says why."""

from __future__ import annotations

import re
from typing import Any

import pytest
from allocator_support import (
    DRIVER,
    SHARED_CLASS,
    WHOLE_CLASS,
    allocate_and_commit,
    claim,
    device_class,
    devices_of,
    gpu,
    make_allocator,
    node_slice,
    opaque,
    request,
    selector,
    standard_classes,
)

from dra_gpu.allocator import AllocationError, AllocationInput, Allocator


def one_node(*devices: dict[str, Any], node: str = "node-1") -> list[dict[str, Any]]:
    return [node_slice(node, list(devices))]


# --- CEL selectors ----------------------------------------------------------------------------------


def test_class_selector_chooses_devices_of_the_class() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1", shared=True)))
    assert devices_of(alloc.allocate(claim("c", request(device_class=SHARED_CLASS)))) == ["node-1/gpu-1"]
    assert devices_of(alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))) == ["node-1/gpu-0"]


def test_class_selector_matching_nothing_fails_naming_the_class() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1")))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=SHARED_CLASS)))
    assert (
        'request "gpu": needs 1 device, 0 fit; of 2 device(s), 0 match class "limiter.gpu.dra-gpu.io"'
        in str(err.value)
    )


def test_request_selectors_narrow_the_class() -> None:
    devices = [gpu("gpu-0", attrs={"index": {"int": 0}}), gpu("gpu-1", attrs={"index": {"int": 1}})]
    alloc = make_allocator(one_node(*devices))
    sel = [selector(f'device.attributes["{DRIVER}"].index == 1')]
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, selectors=sel)))
    assert devices_of(got) == ["node-1/gpu-1"]


def test_request_selector_matching_nothing_fails_with_the_counts() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1")))
    sel = [selector(f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA A100")')]
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, selectors=sel)))
    assert '2 match class "gpu.dra-gpu.io" and 0 of those the request\'s selectors' in str(err.value)


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "gpu.dra-gpu.io"',
        'device.attributes["gpu.dra-gpu.io"].model == "H100"',  # bare name: the driver's domain
        'device.attributes["resource.kubernetes.io"].pciBusID == "0000:18:00.0"',  # qualified name
        'device.capacity["gpu.dra-gpu.io"].memory.compareTo(quantity("40Gi")) >= 0',
        'device.capacity["gpu.dra-gpu.io"].memory == quantity("81920Mi")',
        'device.capacity["gpu.dra-gpu.io"].cores.isGreaterThan(quantity("99"))',
        "device.allowMultipleAllocations",
        'device.attributes["gpu.dra-gpu.io"].driverVersion.isGreaterThan(semver("570.0.0"))',
        'device.attributes["gpu.dra-gpu.io"].driverVersion == semver("580.159.3")',  # a version is a Semver
        'has(device.attributes["other.example.com"].x) == false',  # unknown domain reads as empty
        'device.attributes["gpu.dra-gpu.io"].model.lowerAscii() == "h100"',
    ],
)
def test_cel_environment_has_the_kubernetes_device_variables(expression: str) -> None:
    attrs = {
        "model": {"string": "H100"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
        "driverVersion": {"version": "580.159.3"},
    }
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True, attrs=attrs)))
    got = alloc.allocate(claim("c", request(selectors=[selector(expression)])))
    assert devices_of(got) == ["node-1/gpu-0"]


def test_cel_runtime_error_fails_the_claim_like_kubernetes() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    sel = [selector(f'device.attributes["{DRIVER}"].model == "H100"')]  # no such attribute
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(selectors=sel)))
    assert str(err.value) == (
        'claim default/c: request "gpu": request: selector #0 on device gpu.dra-gpu.io/node-1/gpu-0: '
        "CEL runtime error: no such key: model"
    )


def test_cel_compile_error_names_the_class_and_selector() -> None:
    classes = {"broken": device_class("broken", 'device.driver == "x" &&')}
    alloc = make_allocator(one_node(gpu("gpu-0")), classes)
    with pytest.raises(AllocationError, match=r'device class "broken": selector #0: CEL compile error'):
        alloc.allocate(claim("c", request(device_class="broken")))


def test_bad_quantity_in_a_selector_is_reported() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    sel = [selector(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("lots")) > 0')]
    with pytest.raises(AllocationError, match=r"quantity\(\): 'lots' is not a quantity"):
        alloc.allocate(claim("c", request(selectors=sel)))


# --- exactly: ExactCount and All --------------------------------------------------------------------


def test_exact_count_takes_that_many_devices_in_order() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1"), gpu("gpu-2")))
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, count=2)))
    assert devices_of(got) == ["node-1/gpu-0", "node-1/gpu-1"]
    assert [r["request"] for r in got["devices"]["results"]] == ["gpu", "gpu"]


def test_exact_count_fails_when_too_few_devices_are_free() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1")))
    allocate_and_commit(alloc, claim("first", request(device_class=WHOLE_CLASS)))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, count=2)))
    assert "needs 2 devices, 1 fits" in str(err.value)
    assert "1 in use by another claim (gpu.dra-gpu.io/node-1/gpu-0)" in str(err.value)
    assert err.value.reason == "DevicesInUse", "the metrics reason comes from the refusal, not the words"


def test_allocation_mode_all_takes_every_matching_device() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1"), gpu("gpu-2", shared=True)))
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, allocationMode="All")))
    assert devices_of(got) == ["node-1/gpu-0", "node-1/gpu-1"]


def test_allocation_mode_all_fails_when_one_of_them_is_in_use() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1")))
    allocate_and_commit(alloc, claim("first", request(device_class=WHOLE_CLASS)))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, allocationMode="All")))
    assert 'request "gpu": needs all 2 matching devices, 1 is not usable' in str(err.value)
    assert "1 in use by another claim (gpu.dra-gpu.io/node-1/gpu-0)" in str(err.value)


def test_allocation_mode_all_fails_on_a_tainted_device_it_does_not_tolerate() -> None:
    taint = {"key": "broken", "effect": "NoExecute"}
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1", taints=[taint])))
    with pytest.raises(
        AllocationError, match=r"1 is not usable.*1 tainted, not tolerated \(.*/gpu-1: broken:NoExecute\)"
    ) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, allocationMode="All")))
    assert err.value.reason == "DevicesTainted"


def test_shares_of_one_claim_must_fit_the_gpu_together() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    c = claim("c", request("a", memory="50Gi", cores="10"), request("b", memory="50Gi", cores="10"))
    with pytest.raises(AllocationError, match="each request fits on its own, but not all together") as err:
        alloc.allocate(c)
    assert err.value.reason == "Unsatisfiable"


def test_all_with_more_than_32_devices_fails_and_32_succeed() -> None:
    alloc = make_allocator(one_node(*(gpu(f"gpu-{i:02d}") for i in range(32))))
    assert (
        len(
            alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, allocationMode="All")))["devices"][
                "results"
            ]
        )
        == 32
    )
    alloc = make_allocator(one_node(*(gpu(f"gpu-{i:02d}") for i in range(33))))
    with pytest.raises(AllocationError, match="needs all 33 matching devices, more than one claim can get"):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, allocationMode="All")))


def test_too_many_devices_for_one_claim_is_refused() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0")))
    with pytest.raises(AllocationError, match="asks for 33 devices, more than the 32 one claim can get"):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, count=33)))


# --- firstAvailable ---------------------------------------------------------------------------------


def first_available(*subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "gpu", "firstAvailable": list(subs)}


def whole_gpu_taken_whole_or_share(memory: str) -> tuple[Allocator, dict[str, Any]]:
    """The whole GPU gpu-0 taken by a first claim, and claim `c` for a whole GPU or else `memory` of gpu-1."""
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1", shared=True)))
    allocate_and_commit(alloc, claim("first", request(device_class=WHOLE_CLASS)))
    c = claim(
        "c",
        first_available(
            {"name": "whole", "deviceClassName": WHOLE_CLASS},
            {"name": "share", "deviceClassName": SHARED_CLASS, "capacity": {"requests": {"memory": memory}}},
        ),
    )
    return alloc, c


def test_first_available_takes_the_first_alternative_that_fits() -> None:
    alloc, c = whole_gpu_taken_whole_or_share("10Gi")
    got = alloc.allocate(c)
    result = got["devices"]["results"][0]
    assert result["request"] == "gpu/share" and result["device"] == "gpu-1"
    assert result["consumedCapacity"] == {"cores": "100", "memory": "10Gi"}


def test_first_available_prefers_earlier_alternatives() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1", shared=True)))
    c = claim(
        "c",
        first_available(
            {"name": "whole", "deviceClassName": WHOLE_CLASS},
            {"name": "share", "deviceClassName": SHARED_CLASS},
        ),
    )
    assert alloc.allocate(c)["devices"]["results"][0]["request"] == "gpu/whole"


def test_first_available_fails_with_every_alternatives_reason() -> None:
    alloc, c = whole_gpu_taken_whole_or_share("90Gi")
    with pytest.raises(AllocationError) as err:
        alloc.allocate(c)
    text = str(err.value)
    assert 'request "gpu": no firstAvailable alternative fits' in text
    assert '"gpu/whole" needs 1 device, 0 fit' in text and "in use by another claim" in text
    assert '"gpu/share" needs 1 device, 0 fit' in text
    assert 'capacity "memory": 90Gi rounds to 90Gi, more than the maximum 80Gi' in text


def test_first_available_prefers_the_node_where_the_first_alternative_fits() -> None:
    slices = [
        node_slice("node-1", [gpu("gpu-0", shared=True)]),
        node_slice("node-2", [gpu("gpu-0"), gpu("gpu-1"), gpu("gpu-2", shared=True)]),
    ]
    alloc = make_allocator(slices)
    small = {"requests": {"memory": "1Gi", "cores": "1"}}
    c = claim(
        "c",
        first_available(
            {"name": "two-whole", "deviceClassName": WHOLE_CLASS, "count": 2},
            {"name": "share", "deviceClassName": SHARED_CLASS, "capacity": small},
        ),
        request("extra", memory="1Gi", cores="1"),
    )
    # node-1 comes first and could take the second alternative; node-2 takes the first.
    got = alloc.allocate(c)
    assert [r["request"] for r in got["devices"]["results"]] == ["gpu/two-whole", "gpu/two-whole", "extra"]
    assert got["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-2"]


# --- constraints ------------------------------------------------------------------------------------


def two_gpus_on_one_pcie_root(*roots: str) -> tuple[Allocator, dict[str, Any]]:
    """GPUs gpu-0, gpu-1, ... on the PCIe `roots` in turn, and claim `c` for two whole GPUs on one root."""
    devices = [gpu(f"gpu-{i}", attrs={"pcieRoot": {"string": root}}) for i, root in enumerate(roots)]
    alloc = make_allocator(one_node(*devices))
    c = claim(
        "c",
        request(device_class=WHOLE_CLASS, count=2),
        constraints=[{"matchAttribute": f"{DRIVER}/pcieRoot"}],
    )
    return alloc, c


def test_match_attribute_picks_devices_with_the_same_value() -> None:
    alloc, c = two_gpus_on_one_pcie_root("a", "b", "b")
    assert devices_of(alloc.allocate(c)) == ["node-1/gpu-1", "node-1/gpu-2"]


def test_match_attribute_fails_when_no_two_devices_agree() -> None:
    alloc, c = two_gpus_on_one_pcie_root("a", "b")
    with pytest.raises(AllocationError) as err:
        alloc.allocate(c)
    assert "no set of them on one node satisfies matchAttribute gpu.dra-gpu.io/pcieRoot" in str(err.value)


def test_distinct_attribute_spreads_shares_over_devices() -> None:
    devices = [gpu(f"gpu-{i}", shared=True, attrs={"uuid": {"string": f"GPU-{i}"}}) for i in range(2)]
    alloc = make_allocator(one_node(*devices))
    reqs = [request("a", memory="10Gi", cores="10"), request("b", memory="10Gi", cores="10")]
    without = alloc.allocate(claim("c", *reqs))
    assert devices_of(without) == ["node-1/gpu-0", "node-1/gpu-0"]  # two shares of one GPU
    with_distinct = alloc.allocate(claim("c", *reqs, constraints=[{"distinctAttribute": f"{DRIVER}/uuid"}]))
    assert devices_of(with_distinct) == ["node-1/gpu-0", "node-1/gpu-1"]


def test_one_request_may_take_several_shares_of_one_device_as_kubernetes_does() -> None:
    # Kubernetes' allocator does not mark a multi-allocatable device as in use while it allocates a
    # request, so `count: 2` gets two shares of the first GPU when both fit there.
    devices = [gpu(f"gpu-{i}", shared=True, attrs={"uuid": {"string": f"GPU-{i}"}}) for i in range(2)]
    alloc = make_allocator(one_node(*devices))
    got = alloc.allocate(claim("c", request(memory="30Gi", cores="30", count=2)))
    assert devices_of(got) == ["node-1/gpu-0", "node-1/gpu-0"]
    results = got["devices"]["results"]
    assert results[0]["shareID"] != results[1]["shareID"]
    assert [r["consumedCapacity"] for r in results] == [{"cores": "30", "memory": "30Gi"}] * 2
    # a third share does not fit next to the first two (90Gi of 80Gi): the search moves on
    three = alloc.allocate(claim("c", request(memory="30Gi", cores="30", count=3)))
    assert devices_of(three) == ["node-1/gpu-0", "node-1/gpu-0", "node-1/gpu-1"]
    spread = alloc.allocate(
        claim(
            "c",
            request(memory="30Gi", cores="30", count=2),
            constraints=[{"distinctAttribute": f"{DRIVER}/uuid"}],
        )
    )
    assert devices_of(spread) == ["node-1/gpu-0", "node-1/gpu-1"]


def test_several_shares_of_the_only_device_fail_when_they_do_not_fit_together() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    two = alloc.allocate(claim("c", request(memory="40Gi", cores="40", count=2)))
    assert devices_of(two) == ["node-1/gpu-0"] * 2
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(memory="40Gi", cores="40", count=3)))
    assert "its shares of one GPU must fit that GPU together" in str(err.value)


def test_distinct_attribute_fails_with_a_single_device() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True, attrs={"uuid": {"string": "GPU-0"}})))
    c = claim(
        "c",
        request("a", memory="10Gi", cores="10"),
        request("b", memory="10Gi", cores="10"),
        constraints=[{"distinctAttribute": f"{DRIVER}/uuid", "requests": ["a", "b"]}],
    )
    with pytest.raises(AllocationError, match=r"satisfies distinctAttribute gpu.dra-gpu.io/uuid over a, b"):
        alloc.allocate(c)


def test_constraint_naming_an_unknown_request_is_refused() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0")))
    c = claim(
        "c",
        request(device_class=WHOLE_CLASS),
        constraints=[{"matchAttribute": f"{DRIVER}/x", "requests": ["nope"]}],
    )
    with pytest.raises(AllocationError, match=r"constraint #0 names unknown request\(s\): nope"):
        alloc.allocate(c)


# --- consumable capacity ----------------------------------------------------------------------------


def test_request_without_capacity_gets_the_policy_default() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    got = alloc.allocate(claim("c", request()))
    assert got["devices"]["results"][0]["consumedCapacity"] == {"cores": "100", "memory": "80Gi"}


def test_policy_default_fails_on_a_partly_used_gpu() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    allocate_and_commit(alloc, claim("small", request(memory="1Gi", cores="1")))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request()))
    assert (
        'capacity "cores": needs 100, 99 of 100 left, capacity "memory": needs 80Gi, 79Gi of 80Gi left'
        in str(err.value)
    )


@pytest.mark.parametrize(
    ("asked", "consumed"),
    [("10.5Gi", "11Gi"), ("10752Mi", "11Gi"), ("1", "1Gi"), ("512Mi", "1Gi"), ("80Gi", "80Gi")],
)
def test_valid_range_rounds_up_to_the_step(asked: str, consumed: str) -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    got = alloc.allocate(claim("c", request(memory=asked)))
    assert got["devices"]["results"][0]["consumedCapacity"]["memory"] == consumed


def test_valid_range_maximum_is_enforced() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(memory="81Gi")))
    assert (
        'cannot serve the capacity request (gpu.dra-gpu.io/node-1/gpu-0: capacity "memory": 81Gi rounds to 81Gi, more than the maximum 80Gi)'
        in str(err.value)
    )


def valid_values_gpu() -> dict[str, Any]:
    device = gpu("gpu-0", shared=True)
    device["capacity"]["memory"]["requestPolicy"] = {
        "default": "20Gi",
        "validValues": ["10Gi", "20Gi", "40Gi"],
    }
    return device


def test_valid_values_round_up_to_the_next_value() -> None:
    alloc = make_allocator(one_node(valid_values_gpu()))
    assert (
        alloc.allocate(claim("c", request(memory="11Gi")))["devices"]["results"][0]["consumedCapacity"][
            "memory"
        ]
        == "20Gi"
    )
    assert (
        alloc.allocate(claim("c", request()))["devices"]["results"][0]["consumedCapacity"]["memory"] == "20Gi"
    )


def test_valid_values_refuse_more_than_the_largest() -> None:
    alloc = make_allocator(one_node(valid_values_gpu()))
    with pytest.raises(
        AllocationError, match=r"50Gi rounds to 50Gi, larger than every valid value \(10Gi, 20Gi, 40Gi\)"
    ):
        alloc.allocate(claim("c", request(memory="50Gi")))


def test_request_for_a_capacity_the_device_lacks_fails() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    with pytest.raises(AllocationError, match=r'gpu-0: has no capacity "bandwidth"'):
        alloc.allocate(claim("c", request(capacity={"bandwidth": "10"})))


def test_capacity_request_on_an_exclusive_device_is_a_minimum() -> None:
    alloc = make_allocator(one_node(gpu("small", memory="40Gi"), gpu("big", memory="80Gi")))
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, memory="60Gi")))
    assert devices_of(got) == ["node-1/big"]
    assert "shareID" not in got["devices"]["results"][0]
    assert "consumedCapacity" not in got["devices"]["results"][0]
    with pytest.raises(
        AllocationError,
        match=r'2 cannot serve the capacity request \(e.g. .*/small: capacity "memory": needs 100Gi, the device has 40Gi\)',
    ):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, memory="100Gi")))


def test_invalid_capacity_request_is_reported() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    with pytest.raises(
        AllocationError, match=r'request "gpu": capacity request "memory": \'ten\' is not a quantity'
    ):
        alloc.allocate(claim("c", request(memory="ten")))


# --- shares: shareID and consumedCapacity -----------------------------------------------------------


def test_every_share_gets_a_fresh_share_id_and_all_capacities() -> None:
    alloc = Allocator(one_node(gpu("gpu-0", shared=True)), standard_classes())
    a = allocate_and_commit(alloc, claim("a", request(memory="10Gi", cores="10")))
    b = allocate_and_commit(alloc, claim("b", request(memory="10Gi", cores="10")))
    ra, rb = a["devices"]["results"][0], b["devices"]["results"][0]
    assert re.fullmatch(r"[0-9a-f-]{36}", ra["shareID"]) and ra["shareID"] != rb["shareID"]
    assert ra["consumedCapacity"] == rb["consumedCapacity"] == {"cores": "10", "memory": "10Gi"}


def test_a_full_shared_gpu_takes_no_more_shares() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)))
    for n in range(4):
        allocate_and_commit(alloc, claim(f"s{n}", request(memory="20Gi", cores="10")))
    with pytest.raises(AllocationError, match=r'capacity "memory": needs 1Gi, 0 of 80Gi left'):
        alloc.allocate(claim("c", request(memory="1Gi", cores="1")))


# --- claims already allocated -----------------------------------------------------------------------


def third_party(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    c = claim(name, request())
    c["status"] = {"allocation": {"devices": {"results": results}}}
    return c


def two_shares_of_gpu0() -> list[dict[str, Any]]:
    """Allocation results: two shares of gpu-0 of 30Gi and 30 cores each."""
    return [
        {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0", "shareID": f"s{n}",
         "consumedCapacity": {"memory": "30Gi", "cores": "30"}}
        for n in range(2)
    ]  # fmt: skip


def test_allocated_claims_of_anyone_count_as_in_use() -> None:
    shares = two_shares_of_gpu0()
    whole = [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-1"}]
    alloc = make_allocator(
        one_node(gpu("gpu-0", shared=True), gpu("gpu-1"), gpu("gpu-2")),
        allocated=[third_party("x", shares), third_party("y", whole)],
    )
    got = alloc.allocate(claim("c", request(memory="20Gi", cores="40")))
    assert devices_of(got) == ["node-1/gpu-0"]  # 60Gi/60 cores used, 20Gi/40 left: fits exactly
    assert devices_of(alloc.allocate(claim("w", request(device_class=WHOLE_CLASS)))) == ["node-1/gpu-2"]


def test_summed_shares_of_allocated_claims_block_an_overcommit() -> None:
    shares = two_shares_of_gpu0()
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)), allocated=[third_party("x", shares)])
    with pytest.raises(AllocationError, match=r'capacity "cores": needs 41, 40 of 100 left'):
        alloc.allocate(claim("c", request(memory="1Gi", cores="41")))


def test_a_result_without_share_id_takes_a_shared_gpu_whole() -> None:
    whole = [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}]
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True)), allocated=[third_party("x", whole)])
    with pytest.raises(AllocationError, match=r"1 in use by another claim \(gpu.dra-gpu.io/node-1/gpu-0\)"):
        alloc.allocate(claim("c", request(memory="1Gi", cores="1")))


def test_release_frees_what_a_claim_held() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0")))
    first = claim("first", request(device_class=WHOLE_CLASS))
    allocate_and_commit(alloc, first)
    with pytest.raises(AllocationError, match="in use by another claim"):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))
    alloc.release(first)
    assert devices_of(alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))) == ["node-1/gpu-0"]


def test_allocate_refuses_an_allocated_claim_and_commit_needs_an_allocation() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0")))
    c = claim("c", request(device_class=WHOLE_CLASS))
    allocate_and_commit(alloc, c)
    with pytest.raises(AllocationError, match="claim default/c is already allocated"):
        alloc.allocate(c)
    with pytest.raises(ValueError, match=r"claim default/d has no status\.allocation to commit"):
        alloc.commit(claim("d", request()))


# --- configs ----------------------------------------------------------------------------------------


def test_class_configs_come_first_then_claim_configs() -> None:
    class_cfg = opaque({"apiVersion": "gpu.dra-gpu.io/v1alpha1", "kind": "GpuConfig"})
    classes = standard_classes(shared=[class_cfg], whole=[opaque({"whole": True})])
    alloc = make_allocator(one_node(gpu("gpu-0", shared=True), gpu("gpu-1")), classes)
    c = claim(
        "c",
        request("a", memory="1Gi", cores="1"),
        request("b", memory="1Gi", cores="1"),
        request("w", device_class=WHOLE_CLASS),
        config=[
            opaque({"for": "all"}),
            opaque({"for": "b"}, requests=["b"]),
            opaque({"other": 1}, requests=["x"]),
        ],
    )
    config = alloc.allocate(c)["devices"]["config"]
    assert config == [
        {**class_cfg, "source": "FromClass", "requests": ["a", "b"]},
        {**opaque({"whole": True}), "source": "FromClass", "requests": ["w"]},
        {**opaque({"for": "all"}), "source": "FromClaim"},
        {**opaque({"for": "b"}), "source": "FromClaim", "requests": ["b"]},
    ]


def test_unknown_device_class_fails_naming_it() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0")))
    with pytest.raises(AllocationError, match=r'request "gpu": device class "mps.gpu.dra-gpu.io" not found'):
        alloc.allocate(claim("c", request(device_class="mps.gpu.dra-gpu.io")))


# --- nodes ------------------------------------------------------------------------------------------


def test_node_local_devices_get_a_node_selector_and_stay_on_one_node() -> None:
    slices = [node_slice("node-1", [gpu("gpu-0")]), node_slice("node-2", [gpu("gpu-0"), gpu("gpu-1")])]
    alloc = make_allocator(slices)
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, count=2)))
    assert devices_of(got) == ["node-2/gpu-0", "node-2/gpu-1"]
    assert got["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
        ]
    }


def test_devices_split_over_nodes_cannot_serve_one_claim() -> None:
    slices = [node_slice("node-1", [gpu("gpu-0")]), node_slice("node-2", [gpu("gpu-0")])]
    alloc = make_allocator(slices)
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, count=2)))
    assert "no node has enough for the whole claim" in str(err.value)


def test_all_nodes_devices_need_no_node_selector_and_node_selector_slices_pass_theirs_on() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    slices = [
        node_slice(None, [gpu("gpu-0")], pool="everywhere", allNodes=True),
        node_slice(None, [gpu("gpu-1")], pool="zone-a", nodeSelector={"nodeSelectorTerms": [term]}),
    ]
    alloc = make_allocator(slices)
    first = allocate_and_commit(alloc, claim("a", request(device_class=WHOLE_CLASS)))
    assert devices_of(first) == ["everywhere/gpu-0"] and "nodeSelector" not in first
    second = alloc.allocate(claim("b", request(device_class=WHOLE_CLASS)))
    assert devices_of(second) == ["zone-a/gpu-1"]
    assert second["nodeSelector"] == {"nodeSelectorTerms": [term]}


def test_per_device_node_selection_uses_each_devices_node() -> None:
    devices = [gpu("gpu-0", nodeName="node-7"), gpu("gpu-1", nodeName="node-8")]
    alloc = make_allocator([node_slice(None, devices, pool="pooled", perDeviceNodeSelection=True)])
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)), node_filter=lambda n: n == "node-8")
    assert devices_of(got) == ["pooled/gpu-1"]
    assert got["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-8"]


def test_allocation_input_bundles_the_cluster_state() -> None:
    taken = claim("taken", request(device_class=WHOLE_CLASS))
    taken["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}]}}}  # fmt: skip
    pending = claim("pending", request(device_class=WHOLE_CLASS))  # no allocation: skipped
    data = AllocationInput(one_node(gpu("gpu-0"), gpu("gpu-1")), standard_classes(), [pending, taken])
    got = Allocator.from_input(data).allocate(claim("c", request(device_class=WHOLE_CLASS)))
    assert devices_of(got) == ["node-1/gpu-1"]


def test_node_filter_limits_node_local_devices() -> None:
    slices = [node_slice("node-1", [gpu("gpu-0")]), node_slice("node-2", [gpu("gpu-0")])]
    alloc = make_allocator(slices)
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)), node_filter=lambda n: n == "node-2")
    assert devices_of(got) == ["node-2/gpu-0"]
    with pytest.raises(
        AllocationError,
        match=r"2 on nodes the node filter excludes \(e.g. gpu.dra-gpu.io/node-1/gpu-0: node-1\)",
    ):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)), node_filter=lambda n: False)


def test_allocation_timestamp_is_set() -> None:
    alloc = Allocator(one_node(gpu("gpu-0")), standard_classes())
    stamp = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))["allocationTimestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)


# --- pools ------------------------------------------------------------------------------------------


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = node_slice("node-1", [gpu("old-0")], generation=1)
    new = node_slice("node-1", [gpu("new-0")], generation=2)
    alloc = make_allocator([old, new])
    assert devices_of(alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))) == ["node-1/new-0"]


def test_an_incomplete_pool_is_left_out_and_the_message_says_so() -> None:
    part = node_slice("node-1", [gpu("gpu-0")], count=2, name="node-1-part-0")
    alloc = make_allocator([part])
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))
    assert "pool gpu.dra-gpu.io/node-1 is left out (incomplete: 1 of 2 slices at generation 1)" in str(
        err.value
    )


@pytest.mark.parametrize(
    ("counts", "why"),
    [
        ((1, 1), "incomplete: 2 of 1 slices at generation 1"),  # a slice more than the pool says
        ((2, 1), "incomplete: 2 of 1 or 2 slices at generation 1"),  # slices disagree on the count
    ],
)
def test_a_pool_whose_slices_do_not_add_up_is_left_out(counts: tuple[int, int], why: str) -> None:
    # Kubernetes' poolIsIncomplete: every slice of the newest generation states the same count, and
    # exactly that many are there; anything else is a pool in the middle of an update.
    slices = [
        node_slice("node-1", [gpu(f"gpu-{i}")], count=c, name=f"node-1-part-{i}")
        for i, c in enumerate(counts)
    ]
    alloc = make_allocator(slices)
    with pytest.raises(AllocationError) as err:
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))
    assert f"pool gpu.dra-gpu.io/node-1 is left out ({why})" in str(err.value)


def test_a_pool_listing_a_device_twice_is_left_out() -> None:
    alloc = make_allocator([node_slice("node-1", [gpu("gpu-0"), gpu("gpu-0")])])
    with pytest.raises(
        AllocationError,
        match=r'pool gpu.dra-gpu.io/node-1 is left out \(invalid: device "gpu-0" is listed twice\)',
    ):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))


def test_driver_filter_ignores_other_drivers_slices() -> None:
    other = node_slice("node-1", [gpu("x-0")], driver="other.example.com")
    classes = {"any": device_class("any", "true")}
    alloc = make_allocator([other, node_slice("node-1", [gpu("gpu-0")])], classes, driver_filter=DRIVER)
    assert [d.driver for d in alloc.devices] == [DRIVER]
    assert devices_of(alloc.allocate(claim("c", request(device_class="any")))) == ["node-1/gpu-0"]


# --- taints, adminAccess, malformed requests --------------------------------------------------------


def test_tainted_devices_are_skipped_unless_tolerated() -> None:
    taint = {"key": "maintenance", "value": "true", "effect": "NoSchedule"}
    alloc = make_allocator(one_node(gpu("gpu-0", taints=[taint])))
    with pytest.raises(
        AllocationError,
        match=r"1 tainted, not tolerated \(gpu.dra-gpu.io/node-1/gpu-0: maintenance=true:NoSchedule\)",
    ):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))
    toleration = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}
    got = alloc.allocate(claim("c", request(device_class=WHOLE_CLASS, tolerations=[toleration])))
    assert got["devices"]["results"][0]["tolerations"] == [toleration]


def test_informational_taints_do_not_block() -> None:
    alloc = make_allocator(one_node(gpu("gpu-0", taints=[{"key": "note", "effect": "None"}])))
    assert devices_of(alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))) == ["node-1/gpu-0"]


def test_admin_access_ignores_other_claims_and_holds_nothing() -> None:
    """The API's definition (kubernetes/kubernetes `staging/src/k8s.io/api/resource/v1/types.go`,
    `DeviceRequest.AdminAccess`): claims with admin access "ignore all ordinary claims to the device with
    respect to access modes and any resource allocations"; their results say `adminAccess: true`
    (`DeviceRequestAllocationResult.AdminAccess`), and the allocator does not count them as allocated."""
    alloc = make_allocator(one_node(gpu("gpu-0"), gpu("gpu-1", shared=True)))
    allocate_and_commit(alloc, claim("whole", request(device_class=WHOLE_CLASS)))
    allocate_and_commit(alloc, claim("share", request(device_class=SHARED_CLASS, memory="80Gi", cores="100")))
    with pytest.raises(AllocationError):
        alloc.allocate(claim("more", request(device_class=WHOLE_CLASS)))
    admin = claim("monitor", request(device_class=WHOLE_CLASS, adminAccess=True, allocationMode="All"))
    got = allocate_and_commit(alloc, admin)
    assert devices_of(got) == ["node-1/gpu-0"]
    (result,) = got["devices"]["results"]
    assert result["adminAccess"] is True and "shareID" not in result
    shared = allocate_and_commit(
        alloc, claim("monitor-shared", request(device_class=SHARED_CLASS, adminAccess=True))
    )
    assert devices_of(shared) == ["node-1/gpu-1"], "a share taken in full is still the admin's to see"
    fresh = make_allocator(one_node(gpu("gpu-0")))
    allocate_and_commit(fresh, claim("monitor", request(device_class=WHOLE_CLASS, adminAccess=True)))
    assert devices_of(fresh.allocate(claim("user", request(device_class=WHOLE_CLASS)))) == ["node-1/gpu-0"], (
        "an admin-access allocation holds nothing"
    )


@pytest.mark.parametrize(
    ("req", "message"),
    [
        ({"name": "gpu"}, 'request "gpu": set exactly one of "exactly" and "firstAvailable"'),
        (
            {"name": "gpu", "exactly": {"deviceClassName": WHOLE_CLASS, "count": 0}},
            "count must be at least 1, got 0",
        ),
        (
            {"name": "gpu", "exactly": {"deviceClassName": WHOLE_CLASS, "allocationMode": "Some"}},
            "unknown allocationMode 'Some'; allowed: ExactCount, All",
        ),
        ({"name": "gpu", "exactly": {"count": 1}}, 'request "gpu": deviceClassName is missing'),
        (
            {"name": "gpu", "exactly": {"deviceClassName": WHOLE_CLASS, "count": "2"}},
            "count must be an integer, got '2'",
        ),
    ],
)
def test_malformed_requests_are_named(req: dict[str, Any], message: str) -> None:
    alloc = make_allocator(one_node(gpu("gpu-0")))
    with pytest.raises(AllocationError, match=re.escape(message)):
        alloc.allocate(claim("c", req))


def test_a_device_consuming_a_counter_set_the_pool_lacks_leaves_the_pool_out() -> None:
    partition = gpu(
        "mig-0", consumesCounters=[{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}]
    )
    alloc = make_allocator(one_node(partition))
    with pytest.raises(AllocationError, match=r'counter set "gpu-0", which the pool does not have'):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))
