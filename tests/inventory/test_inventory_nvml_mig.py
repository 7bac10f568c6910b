"""A real node's MIG instances, read through NVML (the fake follows NVML's calls and return codes)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator

import pytest
from fakes import fake_pynvml
from fakes.fake_pynvml import FakeDriver, FakeGpu, FakeMigDevice, MiB
from repo_paths import TESTS

from dra_gpu.config import GpuSharingMode
from dra_gpu.devicekinds.mig import mig_devices
from dra_gpu.inventory import NvmlInventory

GPU = "GPU-5f3c2a9e-1b2d-4c5e-8f90-a1b2c3d4e5f6"
ON = (fake_pynvml.NVML_DEVICE_MIG_ENABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)


def mig_gpu(*devices: FakeMigDevice, mode: tuple[int, int] = ON) -> FakeGpu:
    return FakeGpu(uuid=GPU, mig_mode=mode, mig_devices=list(devices))


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[FakeGpu], FakeDriver]]:
    """Installs a machine with one GPU."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)

    def install(gpu: FakeGpu) -> FakeDriver:
        driver = FakeDriver(gpus=[gpu])
        fake_pynvml.install(driver)
        return driver

    yield install
    fake_pynvml.install(None)


def test_existing_instances_are_read_with_their_placement_ids_and_memory(
    machine: Callable[[FakeGpu], FakeDriver],
) -> None:
    machine(
        mig_gpu(
            FakeMigDevice(
                "MIG-aaaaaaaa-1111-2222-3333-444444444444",
                "3g.40gb",
                9,
                4,
                4,
                gi_id=2,
                ci_id=0,
                memory_total=40192 * MiB,
            ),
            FakeMigDevice("MIG-bbbbbbbb-1111-2222-3333-444444444444", "1g.10gb", 19, 0, 1, gi_id=9, ci_id=0),
        )
    )
    [gpu] = NvmlInventory(fake_pynvml).gpus()
    assert gpu.mig_enabled and not gpu.mig_dynamic
    first, second = gpu.mig_instances
    assert (first.uuid, first.profile, first.start, first.size, first.gi_id, first.ci_id) == (
        "MIG-bbbbbbbb-1111-2222-3333-444444444444",
        "1g.10gb",
        0,
        1,
        9,
        0,
    )
    assert (second.profile, second.start, second.size, second.gi_id) == ("3g.40gb", 4, 4, 2)
    assert second.memory_bytes == 40192 * MiB and second.parent_uuid == GPU


def test_each_instance_is_published_as_a_device_of_its_own(machine: Callable[[FakeGpu], FakeDriver]) -> None:
    machine(
        mig_gpu(
            FakeMigDevice("MIG-aaaaaaaa-1111-2222-3333-444444444444", "3g.40gb", 9, 4, 4, gi_id=2),
            FakeMigDevice("MIG-bbbbbbbb-1111-2222-3333-444444444444", "1g.10gb", 19, 0, 1, gi_id=9),
        )
    )
    [gpu] = NvmlInventory(fake_pynvml).gpus()
    devices = mig_devices(gpu, GpuSharingMode.EXCLUSIVE) or []
    uuids = sorted(d["attributes"]["migUUID"]["string"] for d in devices)
    assert uuids == ["MIG-aaaaaaaa-1111-2222-3333-444444444444", "MIG-bbbbbbbb-1111-2222-3333-444444444444"]


def test_a_mig_gpu_without_instances_is_dynamic_only_where_the_node_says_so(
    machine: Callable[[FakeGpu], FakeDriver],
) -> None:
    machine(mig_gpu())
    [kept] = NvmlInventory(fake_pynvml).gpus()
    assert kept.mig_enabled and not kept.mig_instances and not kept.mig_dynamic
    [dynamic] = NvmlInventory(fake_pynvml, mig_dynamic=True).gpus()
    assert dynamic.mig_dynamic


def test_a_pending_mig_mode_change_is_reported_and_the_gpu_published_as_it_is(
    machine: Callable[[FakeGpu], FakeDriver], caplog: pytest.LogCaptureFixture
) -> None:
    machine(mig_gpu(mode=(fake_pynvml.NVML_DEVICE_MIG_DISABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)))
    with caplog.at_level(logging.WARNING):
        [gpu] = NvmlInventory(fake_pynvml, mig_dynamic=True).gpus()
    assert not gpu.mig_enabled and not gpu.mig_instances and not gpu.mig_dynamic
    assert any(
        "MIG mode change pending" in r.getMessage() and "after a reset enabled" in r.getMessage()
        for r in caplog.records
    )


def test_a_gpu_without_mig_asks_for_no_instances(machine: Callable[[FakeGpu], FakeDriver]) -> None:
    driver = machine(FakeGpu(uuid=GPU, name="NVIDIA L4", mig_mode=None))
    [gpu] = NvmlInventory(fake_pynvml).gpus()
    assert not gpu.mig_capable and not gpu.mig_instances
    assert "nvmlDeviceGetMigDeviceHandleByIndex" not in driver.calls


def recorded_h200_profiles() -> dict[int, tuple[int, int]]:
    """tests/fixtures/mig/h200-nvml-profiles.txt: index -> (profile id, MiB) where NVML answered."""
    rows = (TESTS / "fixtures" / "mig" / "h200-nvml-profiles.txt").read_text().split("\n")
    fields = [row.split() for row in rows if row.startswith("gip ")]
    return {int(f[1]): (int(f[3]), int(f[8])) for f in fields if f[2] == "0"}


def test_dynamic_placements_publish_the_memory_nvml_reports_for_their_profile(
    machine: Callable[[FakeGpu], FakeDriver],
) -> None:
    """An H200's 1g.18gb has 16384 MiB, not 141 GiB / 8: a claim for 17Gi must not get one."""
    machine(
        FakeGpu(
            uuid=GPU,
            name="NVIDIA H200",
            memory_total=143771 * MiB,
            mig_mode=ON,
            gi_profiles=recorded_h200_profiles(),
        )
    )
    [gpu] = NvmlInventory(fake_pynvml, mig_dynamic=True).gpus()
    published = {
        d["attributes"]["profile"]["string"]: d["capacity"]["memory"]["value"]
        for d in mig_devices(gpu, GpuSharingMode.EXCLUSIVE) or []
    }
    assert published == {
        "1g.18gb": "16Gi",
        "1g.18gb+me": "16Gi",
        "1g.35gb": "33280Mi",
        "2g.35gb": "33280Mi",
        "3g.71gb": "71424Mi",
        "4g.71gb": "71424Mi",
        "7g.141gb": "140Gi",
    }


def test_a_driver_without_profile_info_falls_back_to_the_table(
    machine: Callable[[FakeGpu], FakeDriver],
) -> None:
    machine(mig_gpu())
    [gpu] = NvmlInventory(fake_pynvml, mig_dynamic=True).gpus()
    assert gpu.mig_profile_memory == ()
    memory = {
        d["attributes"]["profile"]["string"]: d["capacity"]["memory"]["value"]
        for d in mig_devices(gpu, GpuSharingMode.EXCLUSIVE) or []
    }
    assert memory["1g.10gb"] == "9984Mi" and memory["7g.80gb"] == "81152Mi"
