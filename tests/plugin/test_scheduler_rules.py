"""Every rule the node enforces at prepare is one the scheduler already follows: claims the allocator
places (the project's allocator, held to the real 1.36 scheduler by test_allocator_replay) on the
slices the node agent publishes, with the DeviceClasses it installs, always prepare.

Each test allocates a sequence of claims as the scheduler would, checks which ones the scheduler
refuses and where the others land, then prepares every allocated claim on the node agent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from plugin_harness import NODE, PROFILE, Kubelet, PluginDirs, running_plugin, uid_of

from dra_gpu import DRIVER_NAME
from dra_gpu.allocator import AllocationError, Allocator
from dra_gpu.config import NodeSharing
from dra_gpu.inventory import GpuInfo, SimulatedInventory
from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.manifests import load_values
from dra_gpu.manifests.classes import device_classes
from dra_gpu.slices import SlicePublisher

Obj = dict[str, Any]
WHOLE = DRIVER_NAME
LIMITER = f"limiter.{DRIVER_NAME}"
TIMESLICE = f"timeslice.{DRIVER_NAME}"
MPS = f"mps.{DRIVER_NAME}"


class MigInventory(SimulatedInventory):
    """The simulated node, with MIG mode on for some GPUs."""

    def __init__(self, mig: set[int]) -> None:
        super().__init__(PROFILE, seed=NODE)
        self.mig = mig

    def gpus(self) -> list[GpuInfo]:
        return [replace(g, mig_enabled=g.index in self.mig) for g in super().gpus()]


class Cluster:
    """The API server, the node's published slices and the installed classes, and the scheduler."""

    def __init__(self, inventory: SimulatedInventory, sharing: str) -> None:
        self.api = FakeKube()
        self.api.create("Node", {"metadata": {"name": NODE}})
        self.inventory, self.sharing = inventory, sharing
        slices = SlicePublisher(self.api, NODE, inventory, NodeSharing.parse(sharing)).sync()
        for device_class in device_classes(load_values()):
            self.api.create("DeviceClass", device_class)
        self.scheduler = Allocator(slices, device_classes(load_values()))
        self.allocated: dict[str, Obj] = {}
        self.refused: dict[str, str] = {}

    def claim(self, name: str, device_class: str, capacity: dict[str, str] | None = None) -> str | None:
        """Create and schedule a claim; the device it got, or None when the scheduler refused it."""
        obj = self.api.create("ResourceClaim", builders.claim(name, device_class, capacity=capacity))
        try:
            allocation = self.scheduler.allocate(obj)
        except AllocationError as exc:
            self.refused[name] = str(exc)
            return None
        pod = builders.pod_reference(f"{name}-pod", f"pod-{name}")
        obj = self.api.update_status("ResourceClaim", builders.allocated_claim(obj, allocation, pod))
        self.scheduler.commit(obj)
        self.allocated[name] = obj
        return objects.device_results(allocation)[0].device

    def prepare_all(self, dirs: PluginDirs) -> dict[str, str]:
        """The node agent's answer for every allocated claim: claim name -> error ("" when prepared)."""
        with running_plugin(dirs, self.api, inventory=self.inventory, sharing=self.sharing):
            kubelet = Kubelet(dirs.registration_dir)
            try:
                kubelet.register()
                return {name: kubelet.prepare(obj)[uid_of(obj)].error for name, obj in self.allocated.items()}
            finally:
                kubelet.close()


def test_a_whole_gpu_claim_never_lands_on_a_gpu_that_hosts_shares(dirs: PluginDirs) -> None:
    cluster = Cluster(SimulatedInventory(PROFILE, seed=NODE), "0=Exclusive,1=Shared")
    assert cluster.claim("whole", WHOLE) == "gpu-0"
    # Before, this one took gpu-1 as a share of 10 cores, and every share after it failed at prepare.
    assert cluster.claim("whole-small", WHOLE, {"memory": "10Gi", "cores": "10"}) is None
    assert cluster.claim("whole-again", WHOLE) is None
    assert cluster.claim("limited", LIMITER, {"memory": "30Gi", "cores": "30"}) == "gpu-1"
    assert cluster.claim("sliced", TIMESLICE, {"memory": "8Gi", "cores": "20"}) == "gpu-1"
    assert "match class" in cluster.refused["whole-small"]
    assert cluster.prepare_all(dirs) == {"whole": "", "limited": "", "sliced": ""}


def test_a_gpu_in_mig_mode_is_never_shared(dirs: PluginDirs) -> None:
    cluster = Cluster(MigInventory(mig={1}), "*=Shared")
    for i in range(3):
        assert cluster.claim(f"share-{i}", LIMITER, {"memory": "20Gi", "cores": "30"}) == "gpu-0"
    assert cluster.claim("share-3", LIMITER, {"memory": "20Gi", "cores": "30"}) is None
    assert cluster.claim("mps", MPS, {"memory": "20Gi", "cores": "30"}) is None
    # Published Exclusive, yet no whole-GPU claim gets it: it would lack its MIG device nodes.
    assert cluster.claim("whole", WHOLE) is None
    assert all(error == "" for error in cluster.prepare_all(dirs).values())


def test_the_scheduler_never_fills_a_gpu_past_what_the_node_accepts(dirs: PluginDirs) -> None:
    cluster = Cluster(SimulatedInventory(PROFILE, seed=NODE), "*=Shared")
    placed = [cluster.claim(f"share-{i}", LIMITER, {"memory": "30Gi", "cores": "10"}) for i in range(6)]
    assert placed == ["gpu-0", "gpu-0", "gpu-1", "gpu-1", None, None]
    assert "without enough free capacity" in cluster.refused["share-4"]
    answers = cluster.prepare_all(dirs)
    assert answers == {f"share-{i}": "" for i in range(4)}


def test_time_sliced_claims_on_one_gpu_always_agree_on_the_interval(dirs: PluginDirs) -> None:
    cluster = Cluster(SimulatedInventory(PROFILE, seed=NODE), "*=Shared")
    for i in range(4):
        assert cluster.claim(f"sliced-{i}", TIMESLICE, {"memory": "8Gi", "cores": "20"}) == "gpu-0"
    assert all(error == "" for error in cluster.prepare_all(dirs).values())


def test_mps_shares_and_other_shares_never_meet_on_one_gpu(dirs: PluginDirs) -> None:
    cluster = Cluster(SimulatedInventory(PROFILE, seed=NODE), "0=MPS,1=Shared")
    share = {"memory": "8Gi", "cores": "20"}
    assert cluster.claim("mps-a", MPS, share) == "gpu-0"
    assert cluster.claim("limited", LIMITER, share) == "gpu-1"
    assert cluster.claim("sliced", TIMESLICE, share) == "gpu-1"
    assert cluster.claim("mps-b", MPS, share) == "gpu-0"
    assert all(error == "" for error in cluster.prepare_all(dirs).values())
