"""Pools split into ordered slices and move from one generation to the next as Kubernetes' publisher does."""

from __future__ import annotations

import pytest

from dra_gpu.config import NodeSharing
from dra_gpu.inventory.simulated import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.slices import SlicePublisher, split_devices
from dra_gpu.slices.pool import decode_index, generate_name, index_length, plan_pool

SELECTOR = "spec.nodeName=node-1,spec.driver=gpu.dra-gpu.io"


def publisher(api: FakeKube, per_slice: int = 3) -> tuple[SlicePublisher, SimulatedInventory]:
    api.create("Node", {"metadata": {"name": "node-1"}})
    inventory = SimulatedInventory("8xH100-80GB", seed="node-1")
    pub = SlicePublisher(api, "node-1", inventory, NodeSharing.parse("*=Shared"), devices_per_slice=per_slice)
    return pub, inventory


def test_split_keeps_order_and_publishes_an_empty_slice_for_no_gpus() -> None:
    devices = [{"name": f"gpu-{i}"} for i in range(130)]
    chunks = split_devices(devices, 64)
    assert [len(c) for c in chunks] == [64, 64, 2]
    assert [d["name"] for c in chunks for d in c] == [d["name"] for d in devices]
    assert split_devices([], 64) == [[]]
    with pytest.raises(ValueError, match="devices per slice must be at least 1, got 0"):
        split_devices(devices, 0)


def test_names_carry_the_index_first_so_that_name_order_is_publish_order() -> None:
    assert generate_name(0, 1, "gpu.dra-gpu.io", "node-1") == "00000-gpu.dra-gpu.io-node-1-"
    assert generate_name(10, 11, "gpu.dra-gpu.io", "n") == "0000a-gpu.dra-gpu.io-n-"
    assert index_length(0x100001) == 6
    assert decode_index("0000a-gpu.dra-gpu.io-n-x1y2z", 5) == 10
    assert decode_index("node-1-gpu.dra-gpu.io-abcde", 5) is None  # a pre-1.36 name: obsolete
    assert decode_index("zzzzz-gpu", 5) is None


def test_a_pool_of_several_slices_shares_one_generation_and_count() -> None:
    api = FakeKube()
    slices = publisher(api)[0].sync()
    assert len(slices) == 3
    assert [s["metadata"]["name"][:6] for s in slices] == ["00000-", "00001-", "00002-"]
    assert [len(s["spec"]["devices"]) for s in slices] == [3, 3, 2]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (1, 3)
    }
    assert all(s["spec"]["nodeName"] == "node-1" and s["spec"]["pool"]["name"] == "node-1" for s in slices)


def test_one_changed_slice_keeps_the_generation_and_two_bump_it() -> None:
    api = FakeKube()
    pub, inventory = publisher(api)
    pub.sync()
    inventory.set_health(4, False, "XID 79")
    after_one = pub.sync()
    assert pub.stats.updates == 1 and pub.stats.creates == 3
    assert {s["spec"]["pool"]["generation"] for s in after_one} == {1}

    inventory.set_health(0, False, "XID 48")
    inventory.set_health(7, False, "XID 48")
    after_two = pub.sync()
    assert {s["spec"]["pool"]["generation"] for s in after_two} == {2}
    assert pub.stats.updates == 1 + 3  # a bump rewrites every slice of the pool


def test_shrinking_the_pool_deletes_obsolete_slices_and_recounts() -> None:
    api = FakeKube()
    pub, _ = publisher(api)
    pub.sync()
    pub.devices_per_slice = 8
    slices = pub.sync()
    assert len(slices) == 1 and len(slices[0]["spec"]["devices"]) == 8
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
    stored, _ = api.list("ResourceSlice", field_selector=SELECTOR)
    assert [s["metadata"]["name"] for s in stored] == [slices[0]["metadata"]["name"]]


def test_slices_of_an_older_generation_or_naming_are_replaced() -> None:
    api = FakeKube()
    api.create(
        "ResourceSlice",
        {
            "metadata": {"name": "node-1-gpu.dra-gpu.io-old"},
            "spec": {
                "driver": "gpu.dra-gpu.io",
                "nodeName": "node-1",
                "pool": {"name": "node-1", "generation": 7, "resourceSliceCount": 1},
                "devices": [],
            },
        },
    )
    slices = publisher(api, per_slice=64)[0].sync()
    assert [s["metadata"]["name"][:6] for s in slices] == ["00000-"]
    assert slices[0]["spec"]["pool"]["generation"] == 8  # above every generation consumers have seen
    stored, _ = api.list("ResourceSlice", field_selector=SELECTOR)
    assert len(stored) == 1


def test_plan_is_empty_when_the_pool_already_matches() -> None:
    api = FakeKube()
    slices = publisher(api)[0].sync()
    specs = [
        {k: v for k, v in s["spec"].items() if k != "pool"} | {"pool": {"name": "node-1"}} for s in slices
    ]
    plan = plan_pool(slices, specs)
    assert plan.writes == 0 and sorted(plan.keep) == [0, 1, 2]
