"""KEP-5963 compatibility groups on dynamic MIG placements: published only where the server's release has
DRADeviceCompatibilityGroups on by default (1.38+), and dropped again, said once, where the server drops
them (the gate switched off); a 1.36 or 1.37 server gets today's slices."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dra_gpu.config import NodeSharing
from dra_gpu.inventory import open_inventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.versions import COMPATIBILITY_GROUPS, SHARED_CONSUMABLE_CAPACITY
from dra_gpu.slices import SlicePublisher
from dra_gpu.slices.dropped import dropped_fields

NODE = "node-1"
Obj = dict[str, Any]


def publisher(api: FakeKube) -> SlicePublisher:
    api.create("Node", {"metadata": {"name": NODE}})
    inventory = open_inventory("simulated:1xH100-80GB:mig", seed=NODE)
    return SlicePublisher(api, NODE, inventory, NodeSharing.parse("*=Shared"))


def consumptions(slices: list[Obj]) -> list[Obj]:
    return [
        e for s in slices for d in s["spec"].get("devices") or [] for e in d.get("consumesCounters") or []
    ]


def writes(pub: SlicePublisher) -> int:
    return pub.stats.creates + pub.stats.updates + pub.stats.deletes


@pytest.mark.parametrize("version", [(1, 36), (1, 37)])
def test_a_server_before_1_38_gets_todays_slices_in_one_pass(version: tuple[int, int]) -> None:
    pub = publisher(FakeKube(version=version))
    slices = pub.sync()
    entries = consumptions(slices)
    assert len(entries) == 25, "one per placement of the H100"
    assert all("compatibilityGroups" not in e for e in entries)
    assert pub.fallbacks == {} and writes(pub) == len(slices), "nothing written twice"


def test_a_1_38_server_keeps_the_groups_every_placement_is_published_with() -> None:
    api = FakeKube(version=(1, 38))
    pub = publisher(api)
    slices = pub.sync()
    entries = consumptions(slices)
    assert len(entries) == 25 and all(e["compatibilityGroups"] == ["mig"] for e in entries)
    assert pub.fallbacks == {} and writes(pub) == len(slices)
    assert consumptions(api.list("ResourceSlice")[0]) == entries, "what the server stored"


def test_a_1_38_server_with_the_gate_off_drops_the_groups_and_the_publisher_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeKube(version=(1, 38), gates={COMPATIBILITY_GROUPS: False})
    pub = publisher(api)
    with caplog.at_level(logging.WARNING, logger="dra_gpu.slices.publisher"):
        slices = pub.sync()
        before = writes(pub)
        assert pub.sync() == slices
    assert writes(pub) == before, "the fallback must not rewrite the pool forever"
    entries = consumptions(slices)
    assert len(entries) == 25 and all("compatibilityGroups" not in e for e in entries)
    assert pub.compatibility_groups is False and pub.partitionable_devices is True, "counters are kept"
    (reason,) = pub.fallbacks.values()
    assert "compatibilityGroups" in reason and COMPATIBILITY_GROUPS in reason
    assert [r.getMessage() for r in caplog.records].count(reason) == 1


def test_a_server_whose_version_cannot_be_read_gets_todays_slices_until_it_can(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class VersionLate(FakeKube):
        refusals = 1

        def server_version(self) -> tuple[int, int]:
            from dra_gpu.kube.errors import Forbidden

            if self.refusals:
                self.refusals -= 1
                raise Forbidden("version is forbidden")
            return super().server_version()

    api = VersionLate(version=(1, 38))
    pub = publisher(api)
    with caplog.at_level(logging.WARNING, logger="dra_gpu.kube.versions"):
        entries = consumptions(pub.sync())
    assert entries and all("compatibilityGroups" not in e for e in entries)
    assert any("version" in r.getMessage() for r in caplog.records)
    assert all(e.get("compatibilityGroups") == ["mig"] for e in consumptions(pub.sync())), (
        "once the version can be read, a 1.38 server gets the groups (one error at start must not last)"
    )


def test_each_dropped_1_38_field_names_its_gate() -> None:
    entry = {"counterSet": "s", "counters": {"c": {"valueFrom": {"capacityName": "memory"}}}}
    sent = {
        "spec": {
            "sharedCounters": [
                {"name": "s", "counters": {"c": {"value": "1", "requestPolicy": {"default": "1"}}}}
            ],
            "devices": [{"name": "d", "consumesCounters": [{**entry, "compatibilityGroups": ["mig"]}]}],
        }
    }
    returned = {
        "spec": {
            "sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}],
            "devices": [{"name": "d", "consumesCounters": [{"counterSet": "s", "counters": {"c": {}}}]}],
        }
    }
    dropped = dropped_fields(sent, returned)
    assert dropped.features == {COMPATIBILITY_GROUPS, SHARED_CONSUMABLE_CAPACITY}, dropped.paths
    assert len(dropped.paths) == 3
