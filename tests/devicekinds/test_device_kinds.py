"""Every device kind answers the whole interface, every published device belongs to one kind that prepare
finds it under, and a kind added to the table is published and prepared without touching anything else."""

from __future__ import annotations

import inspect
from collections.abc import Sequence, Set
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import (
    NODE,
    Alloc,
    add_claim,
    cdi_ids,
    gpu_config,
    opaque,
    resolve,
    running_plugin,
    uid_of,
)
from waiting import wait_for

from dra_gpu import devicekinds
from dra_gpu.config import GpuSharingMode, NodeSharing
from dra_gpu.devicekinds import DeviceKind, DeviceMaker, MakerHost, Publish
from dra_gpu.devicekinds.gpu import build_device
from dra_gpu.devicekinds.kind import DriverFilesLookup
from dra_gpu.host.driver_root import DriverFiles
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import GpuInfo, SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.slices import SlicePublisher
from dra_gpu.vocabulary.device import TYPE_ATTRIBUTE

Obj = dict[str, Any]

LAYOUTS = [
    ("2xH100-80GB,1xL4-24GB", "*=Shared,1=MPS,2=Exclusive"),
    ("1xH100-80GB:mig=3g.40gb/1g.10gb*4,1xA100-40GB:mig", "*=Shared"),
    ("1xH100-80GB:mig=1g.10gb*7,1xH100-80GB", "*=MPS"),
    ("2xA100-80GB:mig", "*=Exclusive"),
]
"""Whole GPUs, static and dynamic MIG GPUs, side by side, in several sharing settings."""


def interface() -> set[str]:
    """The members `DeviceKind` declares: its attributes and its methods."""
    methods = {n for n, v in vars(DeviceKind).items() if inspect.isfunction(v) and not n.startswith("_")}
    return methods | set(DeviceKind.__annotations__)


def test_every_kind_in_the_table_implements_the_whole_interface() -> None:
    members = interface()
    assert {"name", "published_type", "devices", "views", "device_nodes", "toolkit_names"} <= members
    for kind in devicekinds.KINDS:
        missing = sorted(m for m in members if not hasattr(kind, m))
        assert missing == [], f"device kind {kind.name!r} lacks {missing}"
        assert isinstance(kind, DeviceKind)
        for name in members - set(DeviceKind.__annotations__):
            declared = inspect.signature(getattr(DeviceKind, name)).parameters
            assert list(inspect.signature(getattr(kind, name)).parameters) == list(declared)[1:], (
                f"{kind.name}.{name} takes other arguments than DeviceKind.{name}"
            )
    names = [k.name for k in devicekinds.KINDS]
    types = [k.published_type for k in devicekinds.KINDS]
    assert len(set(names)) == len(names) and len(set(types)) == len(types), "each kind its own name and type"
    assert devicekinds.KINDS[-1] is devicekinds.GPU and types.count(None) == 1, (
        "the whole GPU, which publishes no `type`, is asked last: it takes every GPU"
    )


def test_a_kind_that_lacks_a_piece_is_not_a_device_kind() -> None:
    class NoDeviceNodes:
        name = "partial"
        published_type = "partial"

        def published_mode(self, gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
            return configured

        def devices(self, gpu: GpuInfo, publish: Publish) -> list[Obj] | None:
            return None

        def counter_sets(self, gpu: GpuInfo) -> list[Obj]:
            return []

        def unpublished(self, gpu: GpuInfo) -> list[tuple[str, str]]:
            return []

        def views(self, gpu: GpuInfo) -> dict[str, GpuInfo]:
            return {}

        def toolkit_names(self, view: GpuInfo) -> tuple[str, ...]:
            return ()

    assert not isinstance(NoDeviceNodes(), DeviceKind)
    assert "device_nodes" in interface()


@pytest.mark.parametrize(("profile", "sharing"), LAYOUTS)
def test_every_published_device_resolves_to_one_kind_that_prepare_finds_it_under(
    profile: str, sharing: str
) -> None:
    inventory = SimulatedInventory(profile, seed=NODE)
    gpus = inventory.gpus()
    node_sharing = NodeSharing.parse(sharing)
    slices = SlicePublisher(FakeKube(), NODE, inventory, node_sharing).sync()
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    views = devicekinds.views(gpus)
    assert devices
    for device in devices:
        kind = devicekinds.kind_of_device(device)
        published = (device["attributes"].get(TYPE_ATTRIBUTE) or {}).get("string")
        assert [k for k in devicekinds.KINDS if k.published_type == published] == [kind]
        view = views.get(device["name"])
        assert view is not None, f"prepare would not find the published device {device['name']}"
        assert devicekinds.kind_of(view) is kind, f"{device['name']} is prepared as another kind"
        gpu = next(g for g in gpus if g.index == view.index)
        mode = kind.published_mode(gpu, node_sharing.mode_for(gpu.index, gpu.uuid))
        assert device["attributes"]["sharing"] == {"string": mode.value}, device["name"]


# -- a made-up third kind ---------------------------------------------------------------------------------
class MadeAccelerators:
    """The made-up kind's `DeviceMaker`: its devices are "made" at prepare (recorded by claim UID) and
    "unmade" at unprepare, as dynamic MIG instances are."""

    def __init__(self) -> None:
        self.made: set[str] = set()
        self.unmade: set[str] = set()

    def materialize(self, claim: Any, shares: list[Any], gpus: Sequence[GpuInfo]) -> list[Any]:
        self.made |= {claim.uid for share in shares if share.device.startswith("accel-")}
        return shares

    def lost(self, uid: str, gpus: Sequence[GpuInfo]) -> list[str]:
        return []

    def release(self, uid: str, gpus: Sequence[GpuInfo]) -> None:
        if uid in self.made:
            self.unmade.add(uid)

    def reconcile(self, claims: Set[str], gpus: Sequence[GpuInfo]) -> None:
        return None

    def temp_files(self) -> list[Path]:
        return []


class Accelerator:
    """A device kind the driver does not have, of another vendor: an L4 handed out as `accel-<index>` with
    `/dev/accel<minor>` and the vendor's `/dev/accelctl`, none of NVIDIA's nodes or files."""

    name: str = "accel"
    published_type: str | None = "accel"

    def __init__(self) -> None:
        self.made = MadeAccelerators()

    def published_mode(self, gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
        return GpuSharingMode.EXCLUSIVE

    def devices(self, gpu: GpuInfo, publish: Publish) -> list[Obj] | None:
        if not gpu.product_name.startswith("NVIDIA L4"):
            return None
        device = build_device(gpu, self.published_mode(gpu, publish.configured), taints=publish.taints)
        device["name"] = f"accel-{gpu.index}"
        device["attributes"][TYPE_ATTRIBUTE] = {"string": self.name}
        return [device]

    def counter_sets(self, gpu: GpuInfo) -> list[Obj]:
        return []

    def unpublished(self, gpu: GpuInfo) -> list[tuple[str, str]]:
        return []

    def views(self, gpu: GpuInfo) -> dict[str, GpuInfo]:
        taken = gpu.product_name.startswith("NVIDIA L4")
        return {f"accel-{gpu.index}": replace(gpu, kind=self.name)} if taken else {}

    def device_nodes(self, view: GpuInfo, commands: GpuCommands) -> list[str]:
        return [f"/dev/accel{view.minor}"]

    def driver_nodes(self) -> tuple[str, ...]:
        return ("/dev/accelctl",)

    def driver_files(self, views: Sequence[GpuInfo], lookup: DriverFilesLookup) -> DriverFiles:
        return DriverFiles(libraries=(), executables=())  # its runtime brings them

    def maker(self, host: MakerHost) -> DeviceMaker | None:
        return self.made

    def toolkit_names(self, view: GpuInfo) -> tuple[str, ...]:
        return ()


def test_a_kind_added_to_the_table_is_published_and_prepared_through_the_interface(
    dirs, api, kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    accel = Accelerator()
    assert isinstance(accel, DeviceKind)
    monkeypatch.setattr(devicekinds, "KINDS", (accel, *devicekinds.KINDS))
    api.create("Node", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    inventory = SimulatedInventory("1xL4-24GB,1xH100-80GB", seed=NODE)
    l4 = inventory.gpus()[0]
    dirs.make_device_nodes((0, 1))
    (dirs.dev_root / "dev" / f"accel{l4.minor}").write_text("")
    (dirs.dev_root / "dev" / "accelctl").write_text("")
    claim = add_claim(api, "accel", [Alloc(device="accel-0")], [opaque(gpu_config("Exclusive"))])
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    with running_plugin(dirs, api, inventory=inventory, commands=commands, publish_slices=True):
        (published,) = wait_for(lambda: api.objects("ResourceSlice"), what="a published ResourceSlice")
        devices = {d["name"]: d for d in published["spec"]["devices"]}
        assert sorted(devices) == ["accel-0", "gpu-1"]
        assert devices["accel-0"]["attributes"][TYPE_ATTRIBUTE] == {"string": "accel"}

        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        container = resolve(dirs, cdi_ids(response))
        nodes = {n.path for n in container.device_nodes}
        assert {f"/dev/accel{l4.minor}", "/dev/accelctl"} <= nodes
        assert not [n for n in nodes if n.startswith("/dev/nvidia")], "NVIDIA's nodes are NVIDIA's kinds' own"
        assert container.env["DRAGPU_DEVICE_ACCEL_0"] == l4.uuid
        assert accel.made.made == {uid_of(claim)}, "its maker made its device at prepare"
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert accel.made.unmade == {uid_of(claim)}, "and unmade it at unprepare"
        assert dirs.spec_files() == []
