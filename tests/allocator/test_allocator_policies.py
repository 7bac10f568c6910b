"""Placement policies on small hand-made clusters: the GPU each policy picks, and why.

The cluster in most tests is one node with three shareable 80Gi GPUs where
gpu-0 holds a 40Gi share, gpu-1 a 70Gi share and gpu-2 is idle.
"""

from __future__ import annotations

from typing import Any

import pytest
from allocator_support import (
    DRIVER,
    SHARED_CLASS,
    WHOLE_CLASS,
    allocate_and_commit,
    claim,
    devices_of,
    gpu,
    make_allocator,
    node_slice,
    opaque,
    request,
    standard_classes,
)

from dra_gpu.allocator import AllocationError, Allocator, placement_for_claim
from dra_gpu.config import ConfigError, Placement, PlacementPolicy

BIN_PACK = Placement(policy=PlacementPolicy.BIN_PACK)
SPREAD = Placement(policy=PlacementPolicy.SPREAD)


def share(name: str, memory: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return claim(name, request(memory=memory, cores="1"), labels=labels)


def three_gpus() -> Allocator:
    alloc = make_allocator([node_slice("node-1", [gpu(f"gpu-{i}", shared=True) for i in range(3)])])
    allocate_and_commit(alloc, share("forty", "40Gi"))  # first fit: gpu-0
    allocate_and_commit(alloc, share("seventy", "70Gi"), policy=SPREAD)  # the emptiest: gpu-1
    return alloc


def test_the_hand_made_cluster_is_what_the_tests_say() -> None:
    alloc = three_gpus()
    used = {d.name: alloc.usage.used[d.index] for d in alloc.devices}
    assert used == {"gpu-0": (1, 40 * 2**30), "gpu-1": (1, 70 * 2**30), "gpu-2": None}


def test_first_fit_takes_the_first_gpu_with_room() -> None:
    assert devices_of(three_gpus().allocate(share("c", "10Gi"))) == ["node-1/gpu-0"]


def test_bin_pack_takes_the_fullest_gpu_that_fits() -> None:
    # gpu-1 has 10Gi left, exactly enough: after placement nothing is left there.
    assert devices_of(three_gpus().allocate(share("c", "10Gi"), policy=BIN_PACK)) == ["node-1/gpu-1"]


def test_bin_pack_skips_a_fuller_gpu_without_room() -> None:
    # 20Gi does not fit gpu-1 (10Gi left); gpu-0 (40Gi left) is fuller than the idle gpu-2.
    assert devices_of(three_gpus().allocate(share("c", "20Gi"), policy=BIN_PACK)) == ["node-1/gpu-0"]


def test_bin_pack_uses_an_idle_gpu_last() -> None:
    # 50Gi fits only the idle gpu-2.
    assert devices_of(three_gpus().allocate(share("c", "50Gi"), policy=BIN_PACK)) == ["node-1/gpu-2"]


def test_spread_takes_the_emptiest_gpu() -> None:
    alloc = three_gpus()
    assert devices_of(alloc.allocate(share("c", "10Gi"), policy=SPREAD)) == ["node-1/gpu-2"]
    allocate_and_commit(alloc, share("idle-taken", "60Gi"), policy=SPREAD)  # gpu-2 now has 20Gi left
    # gpu-0 (40Gi left) is now the emptiest.
    assert devices_of(alloc.allocate(share("c", "10Gi"), policy=SPREAD)) == ["node-1/gpu-0"]


def test_bin_pack_keeps_whole_gpus_free_where_spread_does_not() -> None:
    """Four 20Gi shares, then a claim that asks for no capacity (the policy default: a whole GPU)."""

    def run(policy: Placement) -> str:
        alloc = make_allocator([node_slice("node-1", [gpu("gpu-0", shared=True), gpu("gpu-1", shared=True)])])
        for n in range(4):
            allocate_and_commit(alloc, share(f"s{n}", "20Gi"), policy=policy)
        try:
            return devices_of(alloc.allocate(claim("whole", request()), policy=policy))[0]
        except AllocationError as exc:
            return str(exc)

    assert run(BIN_PACK) == "node-1/gpu-1"
    assert 'capacity "memory": needs 80Gi, 40Gi of 80Gi left' in run(SPREAD)


def test_policies_order_nodes_for_multi_gpu_claims() -> None:
    """Two whole GPUs: BinPack fills the node that is already busy, Spread takes the idle node."""
    slices = [node_slice(f"node-{n}", [gpu(f"gpu-{i}") for i in range(4)]) for n in (1, 2)]
    alloc = make_allocator(slices)
    # Busy node-2 (two of its four GPUs) by hand, whatever order the policies would choose.
    busy = claim("busy", request(device_class=WHOLE_CLASS, count=2))
    busy["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "node-2", "device": f"gpu-{i}"}
                    for i in (0, 1)
                ]
            }
        }
    }
    alloc.commit(busy)
    two = claim("two", request(device_class=WHOLE_CLASS, count=2))
    assert devices_of(alloc.allocate(two)) == ["node-1/gpu-0", "node-1/gpu-1"]  # first fit
    assert devices_of(alloc.allocate(two, policy=BIN_PACK)) == ["node-2/gpu-2", "node-2/gpu-3"]
    assert devices_of(alloc.allocate(two, policy=SPREAD)) == ["node-1/gpu-0", "node-1/gpu-1"]


# --- label rules ------------------------------------------------------------------------------------


def labelled_cluster() -> Allocator:
    """gpu-0 holds app=web (20Gi), gpu-1 holds app=db (20Gi), gpu-2 is idle."""
    alloc = make_allocator([node_slice("node-1", [gpu(f"gpu-{i}", shared=True) for i in range(3)])])
    allocate_and_commit(alloc, share("web", "20Gi", {"app": "web", "tenant": "a"}), policy=SPREAD)
    allocate_and_commit(alloc, share("db", "20Gi", {"app": "db", "tenant": "b"}), policy=SPREAD)
    return alloc


def test_affinity_joins_the_gpu_holding_the_same_label_value() -> None:
    alloc = labelled_cluster()
    rule = Placement(policy=PlacementPolicy.SPREAD, affinityLabel="app")
    # Spread alone would pick the idle gpu-2; affinity puts the second db share next to the first.
    assert devices_of(alloc.allocate(share("db-2", "10Gi", {"app": "db"}), policy=SPREAD)) == ["node-1/gpu-2"]
    assert devices_of(alloc.allocate(share("db-2", "10Gi", {"app": "db"}), policy=rule)) == ["node-1/gpu-1"]


def test_affinity_falls_back_to_the_policy_when_the_gpu_is_full() -> None:
    alloc = labelled_cluster()
    rule = Placement(policy=PlacementPolicy.SPREAD, affinityLabel="app")
    # 70Gi does not fit next to db (60Gi left): Spread's choice, the idle gpu-2.
    assert devices_of(alloc.allocate(share("db-2", "70Gi", {"app": "db"}), policy=rule)) == ["node-1/gpu-2"]


def test_affinity_applies_to_multi_device_claims_too() -> None:
    alloc = labelled_cluster()
    rule = Placement(policy=PlacementPolicy.SPREAD, affinityLabel="app")
    c = claim("db-2", request("a", memory="10Gi", cores="1"), request("b", memory="10Gi", cores="1"))
    c["metadata"]["labels"] = {"app": "db"}
    assert devices_of(alloc.allocate(c, policy=rule)) == ["node-1/gpu-1", "node-1/gpu-1"]


def test_anti_affinity_never_shares_a_gpu_with_the_same_value() -> None:
    alloc = labelled_cluster()
    rule = Placement(policy=PlacementPolicy.BIN_PACK, antiAffinityLabel="app")
    # BinPack alone would join gpu-0 (first of the fullest); web is already there.
    assert devices_of(alloc.allocate(share("web-2", "10Gi", {"app": "web"}), policy=BIN_PACK)) == [
        "node-1/gpu-0"
    ]
    assert devices_of(alloc.allocate(share("web-2", "10Gi", {"app": "web"}), policy=rule)) == ["node-1/gpu-1"]
    # A claim without the label is not constrained.
    assert devices_of(alloc.allocate(share("other", "10Gi"), policy=rule)) == ["node-1/gpu-0"]


def test_anti_affinity_fails_when_every_gpu_holds_the_value() -> None:
    alloc = make_allocator([node_slice("node-1", [gpu("gpu-0", shared=True)])])
    rule = Placement(antiAffinityLabel="app")
    allocate_and_commit(alloc, share("web", "10Gi", {"app": "web"}), policy=rule)
    with pytest.raises(AllocationError) as err:
        alloc.allocate(share("web-2", "10Gi", {"app": "web"}), policy=rule)
    assert (
        "1 excluded by placement rules (gpu.dra-gpu.io/node-1/gpu-0: anti-affinity: holds a claim with app=web)"
        in str(err.value)
    )


def test_exclusion_keeps_tenants_apart() -> None:
    alloc = labelled_cluster()
    rule = Placement(policy=PlacementPolicy.BIN_PACK, exclusionLabel="tenant")
    # tenant a may join its own gpu-0, never tenant b's gpu-1.
    assert devices_of(alloc.allocate(share("a-2", "10Gi", {"tenant": "a"}), policy=rule)) == ["node-1/gpu-0"]
    assert devices_of(alloc.allocate(share("b-2", "10Gi", {"tenant": "b"}), policy=rule)) == ["node-1/gpu-1"]
    # A third tenant only gets the idle GPU; so does a claim without the label.
    assert devices_of(alloc.allocate(share("c-1", "10Gi", {"tenant": "c"}), policy=rule)) == ["node-1/gpu-2"]
    assert devices_of(alloc.allocate(share("none", "10Gi"), policy=rule)) == ["node-1/gpu-2"]


def test_exclusion_fails_naming_the_other_tenant() -> None:
    alloc = make_allocator([node_slice("node-1", [gpu("gpu-0", shared=True)])])
    rule = Placement(exclusionLabel="tenant")
    allocate_and_commit(alloc, share("a", "10Gi", {"tenant": "a"}), policy=rule)
    with pytest.raises(AllocationError, match=r"gpu-0: exclusion: holds a claim with tenant=a"):
        alloc.allocate(share("b", "10Gi", {"tenant": "b"}), policy=rule)
    with pytest.raises(AllocationError, match=r"gpu-0: exclusion: holds a claim with tenant=a"):
        alloc.allocate(share("unlabelled", "10Gi"), policy=rule)


def test_exclusion_holds_after_a_release() -> None:
    alloc = make_allocator([node_slice("node-1", [gpu("gpu-0", shared=True)])])
    rule = Placement(exclusionLabel="tenant")
    a = share("a", "10Gi", {"tenant": "a"})
    allocate_and_commit(alloc, a, policy=rule)
    alloc.release(a)
    assert devices_of(alloc.allocate(share("b", "10Gi", {"tenant": "b"}), policy=rule)) == ["node-1/gpu-0"]


# --- choosing the policy per DeviceClass ------------------------------------------------------------


def gpu_config(**placement: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.dra-gpu.io/v1alpha1", "kind": "GpuConfig", "placement": placement}


def test_placement_comes_from_the_device_class_config() -> None:
    classes = standard_classes(shared=[opaque(gpu_config(policy="Spread", exclusionLabel="tenant"))])
    got = placement_for_claim(claim("c", request()), classes)
    assert got == Placement(policy=PlacementPolicy.SPREAD, exclusionLabel="tenant")
    assert placement_for_claim(claim("c", request(device_class=WHOLE_CLASS)), classes) is None


def test_placement_ignores_other_drivers_configs_and_reads_first_available_classes() -> None:
    classes = standard_classes(
        shared=[
            opaque(gpu_config(policy="Spread"), driver="other.example.com"),
            opaque(gpu_config(policy="BinPack")),
        ]
    )
    c = claim("c", {"name": "gpu", "firstAvailable": [{"name": "s", "deviceClassName": SHARED_CLASS}]})
    assert placement_for_claim(c, classes) == Placement(policy=PlacementPolicy.BIN_PACK)


def test_invalid_class_placement_names_the_class() -> None:
    classes = standard_classes(shared=[opaque(gpu_config(policy="Random"))])
    with pytest.raises(
        ConfigError, match=r"DeviceClass limiter.gpu.dra-gpu.io: invalid GpuConfig: placement.policy"
    ):
        placement_for_claim(claim("c", request()), classes)
