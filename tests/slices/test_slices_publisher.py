"""The publisher keeps the node's pool published: owner, republish after wipes, health taints, fallbacks."""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from plugin_harness import Alloc, add_claim
from repo_paths import TESTS
from waiting import wait_for

from dra_gpu.config import GpuSharingMode, NodeSharing
from dra_gpu.inventory import open_inventory
from dra_gpu.inventory.simulated import SimulatedInventory
from dra_gpu.kube import Forbidden, objects
from dra_gpu.kube.errors import Invalid
from dra_gpu.kube.fake import FakeKube
from dra_gpu.slices import SliceError, SlicePublisher

NODE = "node-1"
SELECTOR = f"spec.nodeName={NODE},spec.driver=gpu.dra-gpu.io"


def make(
    api: FakeKube, profile: str = "8xH100-80GB", sharing: str = "*=Shared", node: bool = True
) -> tuple[SlicePublisher, SimulatedInventory]:
    if node:
        api.create("Node", {"metadata": {"name": NODE}})
    inventory = open_inventory(f"simulated:{profile}", seed=NODE)
    assert isinstance(inventory, SimulatedInventory)
    return SlicePublisher(
        api, NODE, inventory, NodeSharing.parse(sharing), debounce_s=0.05, health_poll_s=0.1
    ), inventory


def stored(api: FakeKube) -> list[dict[str, Any]]:
    return api.list("ResourceSlice", field_selector=SELECTOR)[0]


def devices(api: FakeKube) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in stored(api) for d in s["spec"]["devices"]}


Running = tuple[FakeKube, SlicePublisher, SimulatedInventory]


@pytest.fixture
def running() -> Iterator[Running]:
    api = FakeKube()
    pub, inventory = make(api)
    pub.start()
    try:
        assert pub.published.wait(5), "the first publish never happened"
        yield api, pub, inventory
    finally:
        pub.stop()


def test_slices_are_owned_by_the_node_and_a_second_sync_writes_nothing() -> None:
    api = FakeKube()
    pub, _ = make(api)
    first = pub.sync()
    node_uid = api.get("Node", NODE)["metadata"]["uid"]
    assert first[0]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert first[0]["metadata"]["name"].startswith(f"00000-gpu.dra-gpu.io-{NODE}-")
    writes = [c for c in api.calls if c[0] in ("create", "update", "delete")]
    assert pub.sync() == first
    assert [c for c in api.calls if c[0] in ("create", "update", "delete")] == writes


def test_without_a_node_object_it_publishes_unowned_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKube()
    pub, _ = make(api, node=False)
    with caplog.at_level(logging.WARNING, logger="dra_gpu.slices.publisher"):
        slices = pub.sync()
    assert "ownerReferences" not in slices[0]["metadata"]
    assert any("publishing without an owner reference" in r.getMessage() for r in caplog.records)
    api.create("Node", {"metadata": {"name": NODE}})
    assert pub.sync()[0]["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_a_node_without_gpus_publishes_one_empty_slice() -> None:
    api = FakeKube()
    api.create("Node", {"metadata": {"name": NODE}})

    class NoGpus(SimulatedInventory):
        def gpus(self):
            return []

    pub = SlicePublisher(api, NODE, NoGpus("1xL4-24GB", seed=NODE), NodeSharing.parse("*=Shared"))
    slices = pub.sync()
    assert len(slices) == 1 and slices[0]["spec"]["devices"] == []
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_slices_come_back_after_the_kubelet_wipes_them(running: Running) -> None:
    api, _, _ = running
    before = {d["name"] for d in devices(api).values()}
    api.delete_collection(
        "ResourceSlice", field_selector=f"spec.nodeName={NODE}"
    )  # what a starting kubelet does
    wait_for(lambda: set(devices(api)) == before, what="the slices to be republished")
    assert len(stored(api)) == 1


def test_a_foreign_edit_is_undone(running: Running) -> None:
    api, _, _ = running
    original = stored(api)[0]
    edited = copy.deepcopy(original)
    edited["spec"]["devices"] = edited["spec"]["devices"][:2]
    api.update("ResourceSlice", edited)
    wait_for(lambda: len(devices(api)) == 8, what="the foreign edit to be undone")


def test_unhealthy_gpu_is_tainted_and_untainted_on_recovery(running: Running) -> None:
    api, _, inventory = running
    inventory.set_health(3, False, "XID 79: GPU has fallen off the bus")
    wait_for(lambda: "taints" in devices(api)["gpu-3"], what="a taint after the health event")
    taint = devices(api)["gpu-3"]["taints"][0]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "gpu.dra-gpu.io/unhealthy",
        "XID-79-GPU-has-fallen-off-the-bus",
        "NoSchedule",
    )
    assert all("taints" not in d for name, d in devices(api).items() if name != "gpu-3")
    inventory.set_health(3, True)
    wait_for(lambda: "taints" not in devices(api)["gpu-3"], what="the taint to go after recovery")


def test_taint_time_stays_put_while_the_gpu_stays_unhealthy() -> None:
    api = FakeKube()
    pub, inventory = make(api)
    inventory.set_health(1, False, "XID 48")
    first = devices(api) if pub.sync() else {}
    writes = pub.stats.creates + pub.stats.updates
    pub.sync()
    assert devices(api)["gpu-1"]["taints"] == first["gpu-1"]["taints"]
    assert pub.stats.creates + pub.stats.updates == writes


def test_dropped_consumable_capacity_falls_back_to_unshared_devices(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKube(consumable_capacity=False)  # an API server with DRAConsumableCapacity off
    pub, _ = make(api)
    with caplog.at_level(logging.WARNING, logger="dra_gpu.slices.publisher"):
        slices = pub.sync()
    assert pub.consumable_capacity is False
    assert any("DRAConsumableCapacity is off" in r.getMessage() for r in caplog.records)
    for device in slices[0]["spec"]["devices"]:
        assert "allowMultipleAllocations" not in device
        assert all("requestPolicy" not in c for c in device["capacity"].values())
        assert device["attributes"]["sharing"] == {"string": "Shared"}
    writes = pub.stats.creates + pub.stats.updates
    pub.sync()
    assert pub.stats.creates + pub.stats.updates == writes, "the fallback must not rewrite the pool forever"


class NoTaintsKube(FakeKube):
    """An API server with DRADeviceTaints off: taints vanish from slices on write, silently."""

    @staticmethod
    def _strip(obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        for device in obj.get("spec", {}).get("devices") or []:
            device.pop("taints", None)
        return obj

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return super().create(kind, self._strip(obj) if kind == "ResourceSlice" else obj)

    def update(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return super().update(kind, self._strip(obj) if kind == "ResourceSlice" else obj)


def test_dropped_taints_leave_the_unhealthy_gpu_out_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = NoTaintsKube()
    pub, inventory = make(api)
    pub.sync()
    inventory.set_health(5, False, "XID 79")
    with caplog.at_level(logging.WARNING, logger="dra_gpu.slices.publisher"):
        pub.sync()
    assert pub.device_taints is False
    assert any("DRADeviceTaints is off" in r.getMessage() for r in caplog.records)
    assert "gpu-5" not in devices(api) and len(devices(api)) == 7
    assert pub.consumable_capacity is True  # only what was dropped falls back
    inventory.set_health(5, True)
    pub.sync()
    assert "gpu-5" in devices(api)


def test_a_slice_the_api_server_would_refuse_is_not_sent() -> None:
    api = FakeKube()
    pub, _ = make(api, profile="1xH100-80GB")

    class Broken(SimulatedInventory):
        def gpus(self):
            from dataclasses import replace

            return [replace(g, memory_bytes=-(2**30)) for g in super().gpus()]

    pub.inventory = Broken("1xH100-80GB", seed=NODE)
    with pytest.raises(
        SliceError, match=r"slice 0 of pool 'node-1' would be refused: .*must not be negative"
    ):
        pub.sync()
    assert stored(api) == []


def test_an_attribute_named_with_the_drivers_own_domain_is_refused_at_build_time() -> None:
    """Kubernetes 1.38's publishing helpers refuse `<driver>/<name>`; so do we, before sending."""
    api = FakeKube()
    pub, _ = make(api, profile="1xH100-80GB")
    real_devices = pub._devices

    def qualified(published: Any) -> list[dict[str, Any]]:
        out = real_devices(published)
        for device in out:
            device["attributes"]["gpu.dra-gpu.io/model"] = {"string": "H100"}
            device["capacity"]["gpu.dra-gpu.io/memory"] = device["capacity"].pop("memory")
        return out

    pub._devices = qualified  # type: ignore[method-assign]
    with pytest.raises(SliceError) as refused:
        pub.sync()
    message = str(refused.value)
    assert message.startswith("slice 0 of pool 'node-1' would be refused: ")
    assert (
        'spec.devices[0].attributes: Invalid value: "gpu.dra-gpu.io/model": must not carry the '
        'driver\'s own domain "gpu.dra-gpu.io/" (write "model"' in message
    )
    assert 'spec.devices[0].capacity: Invalid value: "gpu.dra-gpu.io/memory"' in message
    assert "resource.kubernetes.io/pciBusID" not in message, "another domain is fine"
    assert stored(api) == []


def test_stop_ends_every_thread() -> None:
    api = FakeKube()
    pub, _ = make(api)
    before = set(threading.enumerate())
    pub.start()
    assert pub.published.wait(5)
    pub.stop()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_retaints_even_when_another_reader_consumed_the_health_event(running: Running) -> None:
    api, _, inventory = running
    inventory.set_health(2, False, "XID 48: double-bit ECC error")
    inventory.refresh_health()  # another reader (the kubelet's health stream) got there first
    wait_for(lambda: "taints" in devices(api)["gpu-2"], what="a taint for the health change")


# --- a sharing mode change never flips allowMultipleAllocations under live shares -------------------


def _restart(api: FakeKube, sharing: str, **kwargs: Any) -> SlicePublisher:
    """The node agent started again with another `--sharing` (how a GPU's mode changes)."""
    inventory = open_inventory("simulated:8xH100-80GB", seed=NODE)
    return SlicePublisher(
        api, NODE, inventory, NodeSharing.parse(sharing), debounce_s=0.05, health_poll_s=0.1, **kwargs
    )


def test_mode_change_keeps_shareability_while_shares_exist(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKube()
    pub, _ = make(api, sharing="*=Shared")
    pub.sync()
    assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
    share = Alloc(
        device="gpu-0",
        share_id="0f6e3a4e-5d2c-4b8a-9d55-1c0e7f3a9b01",
        consumed={"memory": "1Gi", "cores": "50"},
    )
    add_claim(api, "share-a", [share], namespace="team")

    # gpu-0 (one share) and gpu-1 (none) become Exclusive: only gpu-0 has to wait.
    pub = _restart(api, "*=Shared,0=Exclusive,1=Exclusive")
    with caplog.at_level(logging.INFO, logger="dra_gpu.slices.publisher"):
        pub.sync()
    published = devices(api)
    assert published["gpu-0"]["allowMultipleAllocations"] is True
    assert published["gpu-0"]["attributes"]["sharing"] == {"string": "Shared"}
    assert "requestPolicy" in published["gpu-0"]["capacity"]["memory"]
    assert "allowMultipleAllocations" not in published["gpu-1"]
    assert published["gpu-1"]["attributes"]["sharing"] == {"string": "Exclusive"}
    waits = [r for r in caplog.records if "sharing mode change waits" in r.getMessage()]
    assert len(waits) == 1
    assert getattr(waits[0], "device", None) == "gpu-0"
    assert getattr(waits[0], "claims", None) == ["team/share-a"]
    assert getattr(waits[0], "configured_mode", None) == "Exclusive"
    assert set(pub.pending) == {"gpu-0"}

    # A republish (resync, or the kubelet wiping the slices) still keeps it while the share lives.
    for item in stored(api):
        api.delete("ResourceSlice", item["metadata"]["name"])
    pub.sync()
    assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
    assert len([r for r in caplog.records if "sharing mode change waits" in r.getMessage()]) == 1
    # Even a restarted agent facing a wiped pool: the claim's share ID says the GPU was shareable.
    for item in stored(api):
        api.delete("ResourceSlice", item["metadata"]["name"])
    pub = _restart(api, "*=Shared,0=Exclusive,1=Exclusive")
    pub.sync()
    assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in devices(api)["gpu-1"]

    api.delete("ResourceClaim", "share-a", "team")
    with caplog.at_level(logging.INFO, logger="dra_gpu.slices.publisher"):
        pub.sync()
    assert "allowMultipleAllocations" not in devices(api)["gpu-0"]
    assert devices(api)["gpu-0"]["attributes"]["sharing"] == {"string": "Exclusive"}
    assert pub.pending == {}
    assert any("sharing mode change applied" in r.getMessage() for r in caplog.records)


def test_mode_change_waits_for_claims_still_prepared_on_the_node() -> None:
    """A claim gone from the API whose pod still runs here (not unprepared yet) holds the GPU too."""
    api = FakeKube()
    pub, _ = make(api, sharing="*=Exclusive")
    pub.sync()
    assert "allowMultipleAllocations" not in devices(api)["gpu-2"]
    prepared: dict[str, dict[str, bool]] = {"gpu-2": {"team/whole": False}}
    pub = _restart(api, "*=Exclusive,2=MPS", prepared_claims=lambda: prepared)
    pub.sync()
    assert "allowMultipleAllocations" not in devices(api)["gpu-2"]
    assert devices(api)["gpu-2"]["attributes"]["sharing"] == {"string": "Exclusive"}
    prepared = {}
    pub.sync()
    assert devices(api)["gpu-2"]["allowMultipleAllocations"] is True
    assert devices(api)["gpu-2"]["attributes"]["sharing"] == {"string": "MPS"}


def test_a_mode_change_within_shareable_modes_does_not_wait() -> None:
    api = FakeKube()
    pub, _ = make(api, sharing="*=Shared")
    pub.sync()
    add_claim(api, "share-a", [Alloc(device="gpu-0", share_id="7a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d")])
    pub = _restart(api, "*=Shared,0=MPS")
    pub.sync()
    assert devices(api)["gpu-0"]["attributes"]["sharing"] == {"string": "MPS"}
    assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
    assert pub.pending == {}


class NoClaimsKube(FakeKube):
    """An API server that refuses to list ResourceClaims (RBAC without `list`)."""

    def list(self, kind: str, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        if kind == "ResourceClaim":
            raise Forbidden(
                'resourceclaims.resource.k8s.io is forbidden: cannot list resource "resourceclaims"'
            )
        return super().list(kind, *args, **kwargs)


def test_unreadable_claims_keep_every_changed_gpu_as_published() -> None:
    api = NoClaimsKube()
    pub, _ = make(api, sharing="*=Shared")
    pub.sync()
    pub = _restart(api, "*=Exclusive")
    pub.sync()
    assert all(d["allowMultipleAllocations"] is True for d in devices(api).values())
    assert set(pub.pending) == {f"gpu-{i}" for i in range(8)}


def test_the_running_publisher_applies_a_waiting_change_once_the_shares_are_gone() -> None:
    api = FakeKube()
    pub, _ = make(api, sharing="*=Shared")
    pub.sync()
    add_claim(api, "share-a", [Alloc(device="gpu-0", share_id="0f6e3a4e-5d2c-4b8a-9d55-1c0e7f3a9b01")])
    pub = _restart(api, "*=Exclusive", pending_poll_s=0.1, resync_s=600.0)
    pub.start()
    try:
        assert pub.published.wait(5)
        assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
        assert "allowMultipleAllocations" not in devices(api)["gpu-1"]
        api.delete("ResourceClaim", "share-a", "default")
        assert wait_for(lambda: "allowMultipleAllocations" not in devices(api)["gpu-0"], timeout_s=20)
    finally:
        pub.stop()


FIXTURES = TESTS / "fixtures" / "k8s-1.36-real"


def _real_cluster() -> FakeKube:
    """The slice and claims a real 1.36 control plane stored (node-1: gpu-0 shared, gpu-1 whole)."""
    api = FakeKube()
    api.create("Node", {"metadata": {"name": NODE}})
    api.create("ResourceSlice", json.loads((FIXTURES / "resourceslice-as-stored.json").read_text()))
    for recorded in json.loads((FIXTURES / "resourceclaims-after-scheduling.json").read_text())["items"]:
        created = api.create("ResourceClaim", {k: v for k, v in recorded.items() if k != "status"})
        if recorded.get("status"):
            api.update_status("ResourceClaim", {**created, "status": recorded["status"]})
    return api


@pytest.mark.parametrize("wiped", [False, True], ids=["pool-published", "pool-wiped"])
def test_real_136_pool_and_claims_keep_their_shareability_across_a_mode_swap(wiped: bool) -> None:
    """Both GPUs swap modes while the recorded claims live: neither flips, whether the agent reads the
    published pool or (after the kubelet wiped it) only the claims' share IDs."""
    api = _real_cluster()
    assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in devices(api)["gpu-1"]
    if wiped:
        for item in stored(api):
            api.delete("ResourceSlice", item["metadata"]["name"])
    pub = SlicePublisher(
        api,
        NODE,
        open_inventory("simulated:2xH100-80GB", seed=NODE),
        NodeSharing.parse("*=Shared,0=Exclusive"),
    )
    pub.sync()
    assert devices(api)["gpu-0"]["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in devices(api)["gpu-1"]
    assert pub.pending["gpu-0"].claims == (
        "default/ctrl-alloc",
        "default/ctrl-alloc-ts",
        "default/rbac-probe",
        "default/share-a",
        "default/share-b",
        "default/shared",
    )
    assert pub.pending["gpu-1"].claims == ("default/pod-t-gpu-fmmjp",)
    assert (pub.pending["gpu-1"].published, pub.pending["gpu-1"].wanted) == (
        GpuSharingMode.EXCLUSIVE,
        GpuSharingMode.SHARED,
    )


class NoCountersKube(FakeKube):
    """An API server with DRAPartitionableDevices off (default on 1.34 and 1.35): it drops shared counters and
    counter consumption from slices on write, silently. `written` keeps every device it stored."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[dict[str, Any]] = []

    def _admit(self, res: Any, obj: dict[str, Any]) -> None:
        super()._admit(res, obj)
        if res.kind == "ResourceSlice":
            self.written.extend(obj["spec"].get("devices") or [])

    @staticmethod
    def _strip(obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj.get("spec", {}).pop("sharedCounters", None)
        for device in obj.get("spec", {}).get("devices") or []:
            device.pop("consumesCounters", None)
        return obj

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return super().create(kind, self._strip(obj) if kind == "ResourceSlice" else obj)

    def update(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return super().update(kind, self._strip(obj) if kind == "ResourceSlice" else obj)


class Kube134(FakeKube):
    """A 1.34 API server with DRAPartitionableDevices on: a device consumes counters only from a set of its own
    slice (1.34 validation, "missing-counterset-consumes-counter"; 1.35 moved counters to slices of their own)."""

    def _admit(self, res: Any, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        if res.kind == "ResourceSlice":
            own = {s["name"] for s in spec.get("sharedCounters") or []}
            for i, device in enumerate(spec.get("devices") or []):
                for j, entry in enumerate(device.get("consumesCounters") or []):
                    if entry["counterSet"] not in own:
                        raise Invalid(
                            f'ResourceSlice.resource.k8s.io "{objects.name(obj)}" is invalid: '
                            f"spec.devices[{i}].consumesCounters[{j}].counterSet: Invalid value: "
                            f'"{entry["counterSet"]}": must reference a counter set defined in the ResourceSlice '
                            "sharedCounters"
                        )
        super()._admit(res, obj)


@pytest.mark.parametrize("kube", [NoCountersKube, Kube134], ids=["counters-dropped", "1.34-counter-rules"])
def test_without_counters_a_dynamic_mig_gpu_offers_one_instance_and_says_why(
    kube: type[FakeKube], caplog: pytest.LogCaptureFixture
) -> None:
    """Uncounted placements would let 7g.80gb@0, 1g.10gb@3 and 4g.40gb@0 all be allocated on one GPU."""
    api = kube()
    pub, _ = make(api, profile="2xH100-80GB:mig")
    with caplog.at_level(logging.WARNING, logger="dra_gpu.slices.publisher"):
        slices = pub.sync()
    assert pub.partitionable_devices is False
    published = [d for s in slices for d in s["spec"].get("devices") or []]
    assert sorted(d["name"] for d in published) == ["gpu-0-mig-7g80gb-0", "gpu-1-mig-7g80gb-0"]
    assert all("consumesCounters" not in d for d in published)
    assert not any(s["spec"].get("sharedCounters") for s in slices)
    (reason,) = pub.fallbacks.values()
    assert "full profile only" in reason and any(reason == r.getMessage() for r in caplog.records)
    (event,) = api.objects("Event")
    assert (event["reason"], event["type"], event["involvedObject"]["kind"]) == (
        "DynamicMigWithoutCounters",
        "Warning",
        "Node",
    )
    writes = pub.stats.creates + pub.stats.updates
    pub.sync()
    assert pub.stats.creates + pub.stats.updates == writes, "the fallback must not rewrite the pool forever"
    written = api.written if isinstance(api, NoCountersKube) else []
    assert all(d["name"].endswith("7g80gb-0") for d in written), "an uncounted placement was offered"


def test_a_server_that_keeps_counters_gets_every_placement() -> None:
    api = FakeKube()
    pub, _ = make(api, profile="1xH100-80GB:mig")
    slices = pub.sync()
    assert pub.partitionable_devices is True and pub.fallbacks == {}
    assert len([d for s in slices for d in s["spec"].get("devices") or []]) == 25
