"""Backend choice per node: a 580 node publishes the limiter, a 615 node the driver's memory limits,
and a class asking for driver isolation is never allocated on the old node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from allocator_support import claim, devices_of, request
from fakes import fake_pynvml

from dra_gpu.allocator import AllocationError, Allocator
from dra_gpu.commands.gpus import render_table
from dra_gpu.config import NodeSharing
from dra_gpu.inventory import InventoryError, NvmlInventory, open_inventory
from dra_gpu.inventory.capabilities import (
    CgroupBackend,
    CgroupLayout,
    MemoryIsolation,
    detect,
    read_cgroup_layout,
)
from dra_gpu.kube.fake import FakeKube
from dra_gpu.manifests import load_values
from dra_gpu.manifests.classes import device_classes
from dra_gpu.slices import SlicePublisher

V2_DMEM = CgroupLayout(v2=True, dmem=True)


def node_slices(node: str, profile: str) -> list[dict[str, Any]]:
    api = FakeKube()
    api.create("Node", {"metadata": {"name": node}})
    inventory = open_inventory(f"simulated:{profile}", seed=node)
    return SlicePublisher(api, node, inventory, NodeSharing.parse("*=Shared")).sync()


def test_driver_615_with_cgroup_v2_gets_driver_limits_older_drivers_the_limiter() -> None:
    assert detect("615.71.09", V2_DMEM, mig_enabled=False).memory_isolation is MemoryIsolation.DRIVER
    old = detect("580.95.05", V2_DMEM, mig_enabled=False)
    assert old.memory_isolation is MemoryIsolation.LIMITER and "predates 615" in old.reason
    assert not old.mps_namespaces and detect("615.71.09", V2_DMEM, False).mps_namespaces


def test_without_dmem_the_driver_falls_back_to_its_own_accounting() -> None:
    caps = detect("615.71.09", CgroupLayout(v2=True, dmem=False), mig_enabled=False)
    assert caps.memory_isolation is MemoryIsolation.DRIVER and caps.memory_limit_backend is CgroupBackend.MISC


@pytest.mark.parametrize(
    ("layout", "mig", "why"),
    [(CgroupLayout(v2=False, dmem=False), False, "no cgroup-v2"), (V2_DMEM, True, "MIG")],
)
def test_cgroup_v1_and_mig_keep_the_limiter(layout: CgroupLayout, mig: bool, why: str) -> None:
    caps = detect("615.71.09", layout, mig_enabled=mig)
    assert caps.memory_isolation is MemoryIsolation.LIMITER and why in caps.reason


def test_cgroup_layout_is_read_from_the_root_controllers_file(tmp_path: Path) -> None:
    assert read_cgroup_layout(tmp_path) == CgroupLayout(v2=False, dmem=False)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert read_cgroup_layout(tmp_path) == CgroupLayout(v2=True, dmem=False)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
    assert read_cgroup_layout(tmp_path) == V2_DMEM


def test_nvml_inventory_reports_driver_isolation_except_on_a_mig_gpu() -> None:
    mig_on = (fake_pynvml.NVML_DEVICE_MIG_ENABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)
    driver = fake_pynvml.FakeDriver(
        gpus=[fake_pynvml.FakeGpu(uuid="GPU-a"), fake_pynvml.FakeGpu(uuid="GPU-b", mig_mode=mig_on)],
        driver_version="615.71.09",
    )
    fake_pynvml.install(driver)
    try:
        inventory = NvmlInventory(fake_pynvml, cgroup_layout=V2_DMEM)
        a, b = inventory.gpus()
        inventory.close()
    finally:
        fake_pynvml.install(None)
    assert (a.memory_isolation, a.memory_limit_backend) == ("driver", "dmem")
    assert b.memory_isolation == "limiter" and "MIG" in b.isolation_reason


def test_simulated_profile_takes_the_driver_version_and_cgroup_layout() -> None:
    (gpu,) = open_inventory("simulated:1xH100-80GB,driver=615.71.09,cgroup=misc").gpus()
    assert gpu.driver_version == "615.71.09" and gpu.memory_limit_backend == "misc"
    with pytest.raises(InventoryError, match="option 'driver=new' is not driver=VERSION"):
        open_inventory("simulated:1xH100-80GB,driver=new")


def test_old_node_publishes_limiter_new_node_driver_and_gpus_shows_it() -> None:
    old = node_slices("old", "1xH100-80GB")
    new = node_slices("new", "1xH100-80GB,driver=615.71.09")
    (old_device,) = old[0]["spec"]["devices"]
    (new_device,) = new[0]["spec"]["devices"]
    assert old_device["attributes"]["memoryIsolation"] == {"string": "limiter"}
    assert new_device["attributes"]["memoryIsolation"] == {"string": "driver"}
    assert new_device["attributes"]["mpsNamespaces"] == {"bool": True}
    gpus = open_inventory("simulated:1xH100-80GB,driver=615.71.09").gpus()
    assert "driver (dmem)" in render_table(gpus, "simulated")


def test_isolated_class_is_never_allocated_on_the_old_driver_node() -> None:
    slices = node_slices("old", "2xH100-80GB") + node_slices("new", "1xH100-80GB,driver=615.71.09")
    classes = {c["metadata"]["name"]: c for c in device_classes(load_values())}
    alloc = Allocator(slices, classes)
    placed = []
    for i in range(3):  # the new node's one GPU (79.5Gi) holds three shares of 20Gi and 30% cores
        c = claim(f"c{i}", request(device_class="isolated.gpu.dra-gpu.io", memory="20Gi", cores="30"))
        allocation = alloc.allocate(c)
        c["status"] = {"allocation": allocation}
        alloc.commit(c)
        placed.append((allocation["devices"]["results"][0]["pool"], devices_of(allocation)))
    assert all(pool == "new" for pool, _ in placed)
    with pytest.raises(AllocationError):  # the old node's free GPUs do not count
        alloc.allocate(
            claim("c5", request(device_class="isolated.gpu.dra-gpu.io", memory="20Gi", cores="30"))
        )
    # The plain limiter class still uses the old node.
    plain = alloc.allocate(
        claim("p", request(device_class="limiter.gpu.dra-gpu.io", memory="20Gi", cores="30"))
    )
    assert plain["devices"]["results"][0]["pool"] == "old"


def test_the_choice_is_logged_per_gpu_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    from dra_gpu.inventory.capabilities import log_choice

    caplog.set_level("INFO", logger="dra_gpu.inventory.capabilities")
    log_choice(open_inventory("simulated:1xH100-80GB").gpus())
    (record,) = caplog.records
    assert record.getMessage() == "GPU memory isolation"
    assert record.memory_isolation == "limiter" and "predates 615" in record.reason  # type: ignore[attr-defined]
