"""KEP-5963 compatibility groups (`consumesCounters[].compatibilityGroups`, DRADeviceCompatibilityGroups): the
in-tree allocator co-allocates two devices consuming one counter set only where neither names groups or their
groups intersect, as the scheduler does; a device naming groups never goes beside one naming none."""

from __future__ import annotations

from typing import Any

import pytest
from allocator_support import (
    DRIVER,
    allocate_and_commit,
    claim,
    device_class,
    make_allocator,
    node_slice,
    request,
    selector,
)

from dra_gpu.allocator import AllocationError

Obj = dict[str, Any]
CLASS = "parts"
GROUPS: dict[str, list[str] | None] = {
    "full": ["gpu-full"],
    "mig-a": ["mig"],
    "mig-b": ["mig", "vgpu"],
    "vgpu": ["vgpu"],
    "plain": None,
}


def part(name: str) -> Obj:
    entry: Obj = {"counterSet": "gpu-0", "counters": {"slots": {"value": "1"}}}
    if GROUPS[name] is not None:
        entry["compatibilityGroups"] = GROUPS[name]
    return {"name": name, "attributes": {"part": {"string": name}}, "consumesCounters": [entry]}


def slices() -> list[Obj]:
    counters = {"name": "gpu-0", "counters": {"slots": {"value": "8"}}}
    pool: Obj = {"name": "node-1", "generation": 1, "resourceSliceCount": 2}
    sets = node_slice("node-1", [], name="node-1-counters", count=2)
    sets["spec"].pop("devices")
    sets["spec"]["sharedCounters"] = [counters]
    sets["spec"]["pool"] = pool
    parts = node_slice("node-1", [part(n) for n in GROUPS], name="node-1-parts", count=2)
    parts["spec"]["pool"] = pool
    return [sets, parts]


def ask(*names: str) -> Obj:
    requests = [
        request(f"r{i}", CLASS, selectors=[selector(f'device.attributes["{DRIVER}"].part == "{n}"')])
        for i, n in enumerate(names)
    ]
    return claim("-".join(names), *requests)


def allocator() -> Any:
    return make_allocator(slices(), {CLASS: device_class(CLASS, f'device.driver == "{DRIVER}"')})


@pytest.mark.parametrize(
    ("held", "asked", "fits"),
    [
        ("full", "mig-a", False),  # disjoint groups
        ("full", "plain", False),  # groups beside none
        ("plain", "mig-a", False),  # none beside groups
        ("mig-a", "mig-b", True),  # they share "mig"
        ("mig-b", "vgpu", True),  # they share "vgpu"
    ],
)
def test_a_device_is_allocated_beside_another_on_its_counter_set_only_if_their_groups_meet(
    held: str, asked: str, fits: bool
) -> None:
    alloc = allocator()
    allocate_and_commit(alloc, ask(held))
    if fits:
        alloc.allocate(ask(asked))
    else:
        with pytest.raises(AllocationError, match="compatibility groups"):
            alloc.allocate(ask(asked))


def test_every_device_in_use_must_meet_the_groups_and_releasing_one_frees_the_set() -> None:
    alloc = allocator()
    mig = ask("mig-a")
    allocate_and_commit(alloc, mig)
    allocate_and_commit(alloc, ask("mig-b"))
    with pytest.raises(AllocationError, match="compatibility groups"):
        alloc.allocate(ask("vgpu"))  # meets mig-b's vgpu, not mig-a's mig
    alloc.release(mig)
    alloc.allocate(ask("vgpu"))


def test_one_claim_cannot_take_two_devices_whose_groups_do_not_meet() -> None:
    alloc = allocator()
    with pytest.raises(AllocationError):
        alloc.allocate(ask("mig-a", "vgpu"))
    results = alloc.allocate(ask("mig-a", "mig-b"))["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["mig-a", "mig-b"]
