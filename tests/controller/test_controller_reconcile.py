"""The controller's decisions on the in-memory API server: allocate, release, retry, respect others."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from allocator_support import gpu, node_slice

from dra_gpu import DRIVER_NAME, SCHEDULER_FINALIZER
from dra_gpu.allocator import AllocationError, Allocator
from dra_gpu.controller import FINALIZER, MANAGED_SELECTOR, Reconciler, Snapshot
from dra_gpu.controller.metrics import ControllerMetrics
from dra_gpu.controller.owned_classes import with_marker
from dra_gpu.demo.scheduler import SchedulerStandIn
from dra_gpu.kube import Conflict, builders
from dra_gpu.kube.events import EventRecorder
from dra_gpu.kube.fake import FakeKube

Obj = dict[str, Any]
SHARED = f'device.driver == "{DRIVER_NAME}" && device.attributes["{DRIVER_NAME}"].sharing == "Shared"'
LIMITER = "limiter.gpu.dra-gpu.io"
BINPACK = "binpack.limiter.gpu.dra-gpu.io"
SPREAD = "spread.limiter.gpu.dra-gpu.io"
APART = "apart.limiter.gpu.dra-gpu.io"


def gpu_slice(node: str, gpus: int = 2) -> Obj:
    """The node's slice of `gpus` shareable H100s (sharing `Shared`, the attribute SHARED selects)."""
    shared = {"sharing": {"string": "Shared"}}
    devices = [gpu(f"gpu-{i}", shared=True, attrs={"index": {"int": i}, **shared}) for i in range(gpus)]
    return node_slice(node, devices, name=f"{node}-{DRIVER_NAME}")


def device_class(name: str, *, placement: Obj | None = None, managed: bool = True) -> Obj:
    parameters: Obj = {
        "apiVersion": "gpu.dra-gpu.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Limiter"},
    }
    if placement is not None:
        parameters["placement"] = placement
    selectors = [{"cel": {"expression": SHARED}}]
    if managed:
        selectors.append(copy.deepcopy(MANAGED_SELECTOR))
    return {
        "metadata": {"name": name},
        "spec": {
            "selectors": selectors,
            "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": parameters}}],
        },
    }


class Cluster:
    """A FakeKube with nodes, slices, one scheduler class and three controller-managed classes."""

    def __init__(
        self, nodes: int = 1, gpus: int = 2, api: FakeKube | None = None, classes: bool = True
    ) -> None:
        self.api = api or FakeKube()
        for n in range(nodes):
            self.api.create("Node", builders.node(f"node-{n}"))
            self.api.create("ResourceSlice", gpu_slice(f"node-{n}", gpus))
        if classes:
            self.api.create("DeviceClass", device_class(LIMITER, managed=False))
            self.api.create("DeviceClass", device_class(BINPACK, placement={"policy": "BinPack"}))
            self.api.create("DeviceClass", device_class(SPREAD, placement={"policy": "Spread"}))
            self.api.create("DeviceClass", device_class(APART, placement={"antiAffinityLabel": "app"}))
        self.metrics = ControllerMetrics()
        self.reconciler = self.new_reconciler()

    def new_reconciler(self, **kwargs: Any) -> Reconciler:
        recorder = EventRecorder(self.api, "test", lambda: datetime.now(UTC))
        return Reconciler(self.api, recorder=recorder, metrics=self.metrics, **kwargs)

    def claim(self, name: str, cls: str, cores: int, memory: str = "4Gi", **kwargs: Any) -> Obj:
        return self.api.create(
            "ResourceClaim",
            builders.claim(name, cls, capacity={"cores": str(cores), "memory": memory}, **kwargs),
        )

    def pod(self, name: str, *claims: str, **kwargs: Any) -> Obj:
        return self.api.create("Pod", builders.pod(name, list(claims), **kwargs))

    def run(self) -> Any:
        return self.reconciler.reconcile(Snapshot.read(self.api))

    def get(self, name: str) -> Obj:
        return self.api.get("ResourceClaim", name, "default")

    def events(self, name: str, reason: str) -> list[Obj]:
        return [
            e
            for e in self.api.objects("Event")
            if e["involvedObject"]["name"] == name and e["reason"] == reason
        ]

    def device_of(self, name: str) -> tuple[str, str]:
        result = self.get(name)["status"]["allocation"]["devices"]["results"][0]
        return result["pool"], result["device"]

    def counter(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return value or 0.0


def test_allocates_a_waiting_claim_with_finalizer_timestamp_and_node_selector() -> None:
    c = Cluster()
    c.claim("share", BINPACK, 30, "10Gi")
    c.pod("p", "share")
    result = c.run()
    claim = c.get("share")
    allocation = claim["status"]["allocation"]
    assert "default/share" in result.allocated
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert allocation["allocationTimestamp"]
    assert allocation["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}
        ]
    }
    (res,) = allocation["devices"]["results"]
    assert res["consumedCapacity"] == {"cores": "30", "memory": "10Gi"} and res["shareID"]
    # The class's config travels with the allocation, as the scheduler copies it.
    assert allocation["devices"]["config"][0]["source"] == "FromClass"
    (event,) = c.events("share", "Allocated")
    assert "node-0" in event["message"] and "BinPack" in event["message"]
    assert c.counter("dra_gpu_controller_allocations_total") == 1
    assert c.metrics.registry.get_sample_value("dra_gpu_controller_time_to_allocate_seconds_count") == 1


def test_claims_of_scheduler_classes_and_claims_without_pods_are_left_alone() -> None:
    c = Cluster()
    c.claim("for-scheduler", LIMITER, 10)
    c.pod("p", "for-scheduler")
    c.claim("no-pod-yet", BINPACK, 10)
    result = c.run()
    assert not result.allocated
    assert result.waiting == ["default/no-pod-yet"]
    assert "allocation" not in c.get("for-scheduler").get("status", {})
    assert FINALIZER not in (c.get("no-pod-yet")["metadata"].get("finalizers") or [])


def test_the_scheduler_cannot_allocate_a_controller_managed_claim() -> None:
    """The marker selector matches no device: the scheduler's allocation fails, ours succeeds."""
    c = Cluster()
    claim = c.claim("share", BINPACK, 30)
    classes = {k["metadata"]["name"]: k for k in c.api.objects("DeviceClass")}
    scheduler = Allocator(c.api.objects("ResourceSlice"), classes)
    with pytest.raises(AllocationError, match="0 match class"):
        scheduler.allocate(claim)
    # The stand-in scheduler, which evaluates the classes as published, leaves the pod pending ...
    c.pod("p", "share")
    assert "cannot allocate all claims" in SchedulerStandIn(c.api).schedule().pending["p"]
    # ... until the controller has allocated the claim; then it binds the pod to the claim's node.
    c.run()
    assert SchedulerStandIn(c.api).schedule().bound == {"p": "node-0"}
    assert [r["name"] for r in c.get("share")["status"]["reservedFor"]] == ["p"]


def test_scheduler_allocations_on_the_same_gpu_are_counted() -> None:
    c = Cluster(gpus=2)
    c.claim("by-scheduler", LIMITER, 70)
    c.pod("sched-pod", "by-scheduler")
    assert SchedulerStandIn(c.api).schedule().bound == {"sched-pod": "node-0"}
    assert SCHEDULER_FINALIZER in c.get("by-scheduler")["metadata"]["finalizers"]
    assert c.device_of("by-scheduler") == ("node-0", "gpu-0")
    # Bin-packing prefers the fullest GPU, but 70 + 40 cores would over-commit gpu-0 ...
    c.claim("big", BINPACK, 40)
    c.pod("p1", "big")
    # ... while 30 more cores fill it exactly.
    c.claim("small", BINPACK, 30)
    c.pod("p2", "small")
    c.run()
    assert c.device_of("big") == ("node-0", "gpu-1")
    assert c.device_of("small") == ("node-0", "gpu-0")
    # The scheduler's claim is counted, never touched.
    assert FINALIZER not in c.get("by-scheduler")["metadata"]["finalizers"]


def test_a_claim_that_fits_nowhere_stays_pending_with_an_event_saying_why() -> None:
    c = Cluster(gpus=2)
    c.claim("a", BINPACK, 60)
    c.claim("b", BINPACK, 60)
    c.claim("too-big", BINPACK, 50)
    c.pod("p", "a", "b")
    c.pod("q", "too-big")
    result = c.run()
    assert set(result.allocated) == {"default/a", "default/b"}
    assert "allocation" not in c.get("too-big").get("status", {})
    (event,) = c.events("too-big", "AllocationFailed")
    assert event["type"] == "Warning"
    assert 'capacity "cores": needs 50, 40 of 100 left' in event["message"]
    assert c.counter("dra_gpu_controller_allocation_failures_total", reason="InsufficientCapacity") == 1
    # A second pass with the same outcome does not pile up events.
    c.run()
    assert len(c.events("too-big", "AllocationFailed")) == 1
    # Once capacity frees up, the claim is placed.
    c.api.delete("Pod", "p", "default")
    result = c.run()
    assert set(result.released) == {"default/a", "default/b"}
    assert "default/too-big" in result.allocated


def test_release_after_the_last_consumer_is_gone() -> None:
    c = Cluster()
    c.claim("share", BINPACK, 30)
    c.pod("p", "share")
    c.run()
    SchedulerStandIn(c.api).schedule()  # binds the pod and reserves the claim for it
    assert c.run().released == {}  # in use: kept
    # The pod finishes; Kubernetes' claim controller removes it from reservedFor.
    c.api.delete("Pod", "p", "default")
    assert c.run().released == {}  # still reserved: kept
    claim = c.get("share")
    claim["status"]["reservedFor"] = []
    c.api.update_status("ResourceClaim", claim)
    result = c.run()
    assert result.released == {"default/share": "no pod uses the claim any more"}
    claim = c.get("share")
    assert "allocation" not in claim.get("status", {})
    assert FINALIZER not in (claim["metadata"].get("finalizers") or [])
    assert c.events("share", "Released")
    assert c.counter("dra_gpu_controller_releases_total") == 1


def test_a_deleted_claim_is_released_and_its_finalizer_lets_it_go() -> None:
    c = Cluster()
    c.claim("share", BINPACK, 30)
    c.pod("p", "share")
    c.run()
    c.api.delete("ResourceClaim", "share", "default")
    assert c.get("share")["metadata"]["deletionTimestamp"]  # held by our finalizer
    result = c.run()
    assert result.released == {"default/share": "the claim is being deleted"}
    assert not [o for o in c.api.objects("ResourceClaim") if o["metadata"]["name"] == "share"]


def test_a_claim_deleted_while_it_is_being_placed_is_dropped_quietly() -> None:
    """The snapshot still shows the claim; the user deleted it (no finalizer yet) before our write."""
    c = Cluster()
    c.claim("share", BINPACK, 30)
    c.pod("p", "share")
    stale = Snapshot.read(c.api)
    c.api.delete("ResourceClaim", "share", "default")
    result = c.reconciler.reconcile(stale)
    assert (result.allocated, result.failed) == ({}, {})
    assert not c.events("share", "AllocationFailed")
    assert c.counter("dra_gpu_controller_allocation_failures_total", reason="ApiError") == 0
    assert not c.api.objects("ResourceClaim")


class ConflictOnce(FakeKube):
    """Someone else writes the claim just before our first status write, so that write gets a 409."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0

    def update_status(self, kind: str, obj: Obj) -> Obj:
        if kind == "ResourceClaim" and not self.conflicts:
            self.conflicts += 1
            other = self.get(kind, obj["metadata"]["name"], obj["metadata"]["namespace"])
            other["metadata"].setdefault("labels", {})["touched"] = "yes"
            self.update(kind, other)
        return super().update_status(kind, obj)


def test_a_409_conflict_is_re_read_and_retried() -> None:
    c = Cluster(api=ConflictOnce())
    c.claim("share", BINPACK, 30)
    c.pod("p", "share")
    result = c.run()
    assert "default/share" in result.allocated
    claim = c.get("share")
    assert claim["metadata"]["labels"] == {"touched": "yes"}  # the other writer's change survived
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert c.counter("dra_gpu_controller_conflicts_total") == 1


def test_a_conflict_from_the_scheduler_reserving_the_claim_stops_the_release() -> None:
    """The claim looked unused in the snapshot, but a pod got it reserved before our write."""
    c = Cluster()
    c.claim("share", BINPACK, 30)
    c.pod("p", "share")
    c.run()
    stale = Snapshot.read(c.api)
    c.api.delete("Pod", "p", "default")
    stale_without_pod = Snapshot(stale.slices, stale.classes, stale.claims, [], stale.nodes)
    claim = c.get("share")
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "q", "uid": "1234"}]
    c.api.update_status("ResourceClaim", claim)
    result = c.reconciler.reconcile(stale_without_pod)
    assert result.released == {}
    assert c.get("share")["status"]["allocation"]
    assert c.counter("dra_gpu_controller_conflicts_total") == 1


def test_only_nodes_the_pod_can_land_on_are_used() -> None:
    c = Cluster(nodes=3, gpus=1)
    cordoned = c.api.get("Node", "node-0")
    cordoned["spec"]["unschedulable"] = True
    c.api.update("Node", cordoned)
    tainted = c.api.get("Node", "node-1")
    tainted["spec"]["taints"] = [{"key": "team", "value": "ml", "effect": "NoSchedule"}]
    c.api.update("Node", tainted)
    c.claim("share", BINPACK, 10)
    c.pod("p", "share")
    c.run()
    assert c.device_of("share")[0] == "node-2"
    # A pod that tolerates the taint may go there; a node without a Node object is never used.
    c.api.delete("Node", "node-2")
    c.claim("tolerant", BINPACK, 10)
    c.pod(
        "q",
        "tolerant",
        tolerations=[{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    )
    c.run()
    assert c.device_of("tolerant")[0] == "node-1"
    c.claim("stuck", BINPACK, 10)
    c.pod("r", "stuck")
    result = c.run()
    message = result.failed["default/stuck"]
    assert "node-0: node is unschedulable (cordoned)" in message
    assert "node-1: untolerated taint team=ml:NoSchedule" in message
    assert "node-2: no such Node" in message
    assert c.counter("dra_gpu_controller_allocation_failures_total", reason="NoEligibleNode") == 1


def test_policies_spread_and_anti_affinity_through_the_controller() -> None:
    c = Cluster(nodes=1, gpus=3)
    for i in range(2):
        c.claim(f"s{i}", SPREAD, 10)
        c.pod(f"ps{i}", f"s{i}")
    for i in range(2):
        c.claim(f"web-{i}", APART, 10, labels={"app": "web"})
        c.pod(f"pw{i}", f"web-{i}")
    c.run()
    assert c.device_of("s0") != c.device_of("s1")
    assert c.device_of("web-0") != c.device_of("web-1")
    c.claim("web-2", APART, 10, labels={"app": "web"})
    c.claim("web-3", APART, 10, labels={"app": "web"})
    c.pod("pw2", "web-2")
    c.pod("pw3", "web-3")
    result = c.run()
    assert "default/web-2" in result.allocated  # the third GPU
    assert "anti-affinity" in result.failed["default/web-3"]
    assert c.counter("dra_gpu_controller_allocation_failures_total", reason="PlacementRules") == 1


def test_a_pod_bound_without_the_scheduler_is_added_to_reserved_for() -> None:
    c = Cluster()
    c.claim("share", BINPACK, 10)
    c.pod("bound", "share", node_name="node-0")
    c.run()
    result = c.run()
    assert result.reserved == {"default/share": ["bound"]}
    assert [r["name"] for r in c.get("share")["status"]["reservedFor"]] == ["bound"]


def test_a_claim_reserved_for_a_pod_group_is_neither_mixed_with_pods_nor_released() -> None:
    """A workload claim: `reservedFor` names a PodGroup, never the pods themselves."""
    c = Cluster()
    c.claim("train", BINPACK, 10)
    c.pod("worker-0", "train")
    assert "default/train" in c.run().allocated
    claim = c.get("train")
    group = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers", "uid": "uid-g"}
    claim["status"]["reservedFor"] = [group]
    c.api.update_status("ResourceClaim", claim)
    c.pod("worker-1", "train", node_name="node-0")  # bound without the scheduler, a member of the group
    result = c.run()
    assert result.reserved == {} and result.released == {}
    assert c.get("train")["status"]["reservedFor"] == [group]
    # Every pod gone, the group still holds the claim: kept.
    c.api.delete("Pod", "worker-0", "default")
    c.api.delete("Pod", "worker-1", "default")
    assert c.run().released == {}
    assert "allocation" in c.get("train")["status"]
    claim = c.get("train")
    claim["status"]["reservedFor"] = []
    c.api.update_status("ResourceClaim", claim)
    assert c.run().released == {"default/train": "no pod uses the claim any more"}


def test_an_allocation_cleared_by_the_scheduler_is_placed_on_another_node() -> None:
    c = Cluster(nodes=2, gpus=1)
    c.claim("share", BINPACK, 10)
    c.pod("p", "share")
    c.run()
    first = c.device_of("share")[0]
    claim = c.get("share")
    claim["status"] = {}  # the scheduler's PostFilter clears allocations its pod cannot use
    c.api.update_status("ResourceClaim", claim)
    c.run()
    assert c.device_of("share")[0] != first
    assert c.events("share", "AllocationCleared")


def test_an_invalid_placement_in_a_class_is_reported_on_the_claim() -> None:
    c = Cluster()
    bad = device_class("bad.limiter.gpu.dra-gpu.io", placement={"policy": "Random"})
    c.api.create("DeviceClass", bad)
    c.claim("share", "bad.limiter.gpu.dra-gpu.io", 10)
    c.pod("p", "share")
    result = c.run()
    assert "unknown placement policy 'Random'" in result.failed["default/share"]
    assert "bad.limiter.gpu.dra-gpu.io" in result.failed["default/share"]
    assert c.counter("dra_gpu_controller_allocation_failures_total", reason="InvalidClassConfig") == 1


def test_a_standby_replica_writes_nothing() -> None:
    c = Cluster()
    c.claim("share", BINPACK, 10)
    c.pod("p", "share")
    standby = c.new_reconciler(is_leader=lambda: False)
    assert not standby.reconcile(Snapshot.read(c.api)).changed
    assert "allocation" not in c.get("share").get("status", {})


def test_the_same_claim_is_not_allocated_twice_from_a_stale_cache() -> None:
    """Our own write is assumed at once; a later pass on a stale list must not place it again."""
    c = Cluster()
    c.claim("share", BINPACK, 10)
    c.pod("p", "share")
    stale = Snapshot.read(c.api)
    c.run()
    before = c.get("share")["status"]["allocation"]
    c.reconciler.reconcile(stale)  # the claim still looks unallocated here
    assert c.get("share")["status"]["allocation"] == before


def test_conflict_retry_gives_up_when_someone_else_allocated() -> None:
    class AllocatedMeanwhile(FakeKube):
        def update(self, kind: str, obj: Obj) -> Obj:
            if kind == "ResourceClaim" and FINALIZER in (obj["metadata"].get("finalizers") or []):
                current = self.get(kind, obj["metadata"]["name"], obj["metadata"]["namespace"])
                if "allocation" not in current.get("status", {}):
                    current["status"] = {
                        "allocation": {"devices": {"results": []}, "allocationTimestamp": "x"}
                    }
                    super().update_status(kind, current)
                    raise Conflict("the object has been modified")
            return super().update(kind, obj)

    c = Cluster(api=AllocatedMeanwhile())
    c.claim("share", BINPACK, 10)
    c.pod("p", "share")
    result = c.run()
    assert not result.allocated and not result.failed
    assert c.get("share")["status"]["allocation"]["devices"]["results"] == []


def test_a_gpu_over_committed_by_a_concurrent_scheduler_allocation_is_repaired() -> None:
    """Both allocators decide from views that miss the other's write; the controller moves its claim."""
    c = Cluster(gpus=2)
    c.claim("mine", BINPACK, 40)
    c.pod("p", "mine")
    c.claim("theirs", LIMITER, 70)
    c.pod("q", "theirs")
    before_scheduler = Snapshot.read(c.api)
    SchedulerStandIn(c.api).schedule()  # places "theirs" (70 cores) on gpu-0 and binds q
    c.reconciler.reconcile(before_scheduler)  # our pass did not see it: "mine" lands on gpu-0 as well
    assert c.device_of("mine") == c.device_of("theirs") == ("node-0", "gpu-0")
    result = c.run()
    assert "over-committed" in result.released["default/mine"]
    assert c.device_of("mine") == ("node-0", "gpu-1")
    assert c.device_of("theirs") == ("node-0", "gpu-0")  # the scheduler's allocation is never moved
    (event,) = c.events("mine", "Released")
    assert 'capacity "cores" is over-committed (110 of 100)' in event["message"]


FIXTURES = Path("tests/fixtures/k8s-1.36-real")


def test_our_allocation_has_the_shape_a_real_scheduler_accepted() -> None:
    """Replay the real cluster's slice and class (made controller-managed) and compare with the
    third-party allocation that a real 1.36 scheduler reserved and bound (`ctrl-alloc-ts`)."""
    c = Cluster(nodes=0, classes=False)
    api = c.api
    api.create("Node", builders.node("node-1"))
    api.create("ResourceSlice", yaml.safe_load((FIXTURES / "slice.yaml").read_text()))
    for cls in yaml.safe_load_all((FIXTURES / "classes.yaml").read_text()):
        api.create("DeviceClass", with_marker(cls))
    claim = yaml.safe_load((FIXTURES / "ctrl2.yaml").read_text())
    del claim["metadata"]["finalizers"]
    api.create("ResourceClaim", claim)
    api.create("Pod", builders.pod("pod-ctrl-ts", ["ctrl-alloc-ts"]))
    c.run()
    ours = c.get("ctrl-alloc-ts")
    accepted = next(
        item
        for item in json.loads((FIXTURES / "resourceclaims-after-scheduling.json").read_text())["items"]
        if item["metadata"]["name"] == "ctrl-alloc-ts"
    )
    assert ours["metadata"]["finalizers"] == accepted["metadata"]["finalizers"]

    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items() if k not in ("shareID", "allocationTimestamp")}
        if isinstance(value, list):
            return [shape(v) for v in value]
        return value

    allocation = ours["status"]["allocation"]
    assert set(allocation) == set(accepted["status"]["allocation"])
    assert allocation["allocationTimestamp"] and allocation["devices"]["results"][0]["shareID"]
    assert shape(allocation["devices"]["results"]) == shape(
        accepted["status"]["allocation"]["devices"]["results"]
    )
    assert allocation["nodeSelector"] == accepted["status"]["allocation"]["nodeSelector"]
    # The class's config travels too (the hand-written allocation above had left it out).
    assert allocation["devices"]["config"][0]["source"] == "FromClass"
