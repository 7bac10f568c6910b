"""The NVML backend against a fake pynvml: facts, version differences, errors and health."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from fakes import fake_pynvml
from fakes.fake_pynvml import FakeDriver, FakeGpu, MiB

from dra_gpu.inventory import InventoryError, NvmlInventory, NvmlUnavailableError, open_inventory

H100_UUID = "GPU-5f3c2a9e-1b2d-4c5e-8f90-a1b2c3d4e5f6"
L4_UUID = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def h100() -> FakeGpu:
    return FakeGpu(uuid=H100_UUID, pci_bus_id="00000000:18:00.0")


def l4() -> FakeGpu:
    return FakeGpu(
        uuid=L4_UUID,
        name="NVIDIA L4",
        minor=3,
        memory_total=23034 * MiB,
        pci_bus_id="00000000:AB:00.0",
        architecture=fake_pynvml.NVML_DEVICE_ARCH_ADA,
        compute_capability=(8, 9),
        mig_mode=None,
    )


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    machine = FakeDriver(gpus=[h100(), l4()])
    fake_pynvml.install(machine)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    yield machine
    fake_pynvml.install(None)


def open_nvml() -> NvmlInventory:
    return NvmlInventory(fake_pynvml)


def test_reads_every_fact_nvml_reports(driver: FakeDriver) -> None:
    inv = open_nvml()
    first, second = inv.gpus()
    assert inv.backend == "nvml"
    assert (first.index, first.minor, first.uuid) == (0, 0, H100_UUID)
    assert first.product_name == "NVIDIA H100 80GB HBM3"
    assert (first.architecture, first.cuda_compute_capability) == ("Hopper", "9.0")
    assert first.memory_bytes == driver.gpus[0].memory_total
    assert (first.driver_version, first.cuda_driver_version) == ("580.95.05", "13.0")
    assert first.pci_bus_id == "0000:18:00.0"
    assert first.mig_capable and first.healthy and first.health_reason == ""
    assert (second.index, second.minor, second.uuid) == (1, 3, L4_UUID)
    assert (second.architecture, second.cuda_compute_capability) == ("Ada Lovelace", "8.9")
    assert second.pci_bus_id == "0000:ab:00.0", "Kubernetes wants lower case and a 4-digit domain"
    assert not second.mig_capable, "MIG mode query answering Not Supported means no MIG"


def test_open_inventory_nvml_lists_the_gpus_nvml_reports(driver: FakeDriver) -> None:
    inv = open_inventory("nvml")
    assert [gpu.uuid for gpu in inv.gpus()] == [H100_UUID, L4_UUID]
    inv.close()


def test_pynvml_is_imported_only_when_the_nvml_inventory_is_opened() -> None:
    # In a fresh interpreter: this one has imported pynvml (or its fake) already.
    code = (
        "import sys\n"
        "from dra_gpu.inventory import open_inventory\n"
        "open_inventory('simulated:1xH100-80GB', seed='n').close()\n"
        "print('pynvml' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_cuda_version_minor_digits(driver: FakeDriver) -> None:
    driver.cuda_version = 12040
    assert open_nvml().gpus()[0].cuda_driver_version == "12.4"


def test_old_bindings_returning_bytes_give_the_same_inventory(driver: FakeDriver) -> None:
    expected = open_nvml().gpus()
    driver.strings_as_bytes = True
    assert open_nvml().gpus() == expected


def test_legacy_pci_info_structure(driver: FakeDriver) -> None:
    driver.legacy_pci_info = True
    assert [gpu.pci_bus_id for gpu in open_nvml().gpus()] == ["0000:18:00.0", "0000:ab:00.0"]


def test_pci_domain_beyond_four_digits_is_kept_whole(driver: FakeDriver) -> None:
    driver.gpus[0].pci_bus_id = "00010000:01:00.0"
    assert open_nvml().gpus()[0].pci_bus_id == "00010000:01:00.0"


@pytest.mark.parametrize("how", ["driver lacks it", "bindings lack it"])
def test_missing_compute_capability_query_falls_back_to_the_product_name(
    driver: FakeDriver, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "driver lacks it":
        driver.missing.add("nvmlDeviceGetCudaComputeCapability")
    else:
        monkeypatch.delattr(fake_pynvml, "nvmlDeviceGetCudaComputeCapability")
    first, second = open_nvml().gpus()
    assert (first.cuda_compute_capability, second.cuda_compute_capability) == ("9.0", "8.9")


def test_missing_architecture_query_falls_back_to_compute_capability(driver: FakeDriver) -> None:
    driver.missing.add("nvmlDeviceGetArchitecture")
    assert [gpu.architecture for gpu in open_nvml().gpus()] == ["Hopper", "Ada Lovelace"]


def test_architecture_code_newer_than_our_table_falls_back_to_compute_capability(driver: FakeDriver) -> None:
    driver.gpus[0].architecture = 77
    driver.gpus[0].compute_capability = (10, 0)
    assert open_nvml().gpus()[0].architecture == "Blackwell"


def test_missing_cuda_v2_query_uses_the_v1_query(driver: FakeDriver) -> None:
    driver.missing.add("nvmlSystemGetCudaDriverVersion_v2")
    driver.cuda_version = 12080
    assert open_nvml().gpus()[0].cuda_driver_version == "12.8"


def test_driver_without_the_deprecated_v1_memory_query_uses_v2(driver: FakeDriver) -> None:
    driver.missing.add("nvmlDeviceGetMemoryInfo")
    inv = open_nvml()
    assert [gpu.memory_bytes for gpu in inv.gpus()] == [gpu.memory_total for gpu in driver.gpus]
    assert all(gpu.healthy for gpu in inv.refresh_health()), "the health probe must not trip on it either"


def test_missing_mig_query_on_an_old_driver_means_not_mig_capable(driver: FakeDriver) -> None:
    driver.missing.add("nvmlDeviceGetMigMode")
    assert [gpu.mig_capable for gpu in open_nvml().gpus()] == [False, False]


def test_a_failing_query_names_the_nvml_error_and_the_gpu(driver: FakeDriver) -> None:
    driver.gpus[1].errors["nvmlDeviceGetName"] = fake_pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(InventoryError, match=r"GPU 1: Insufficient Permissions \(NVML_ERROR_NO_PERMISSION\)"):
        open_nvml()
    assert driver.refcount == 0, "a failed open must release NVML"


def test_a_gpu_lost_before_start_is_left_out_and_the_others_are_listed(driver: FakeDriver) -> None:
    driver.gpus[0].lost = True
    assert [gpu.uuid for gpu in open_nvml().gpus()] == [L4_UUID]


def test_no_driver_is_unavailable_with_an_actionable_message(driver: FakeDriver) -> None:
    fake_pynvml.install(None)
    with pytest.raises(NvmlUnavailableError) as caught:
        open_inventory("nvml")
    message = str(caught.value)
    assert message.startswith("NVML is not available: ")
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in message and "libnvidia-ml.so.1" in message


def test_driver_not_loaded_says_so(driver: FakeDriver) -> None:
    driver.init_error = fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(
        NvmlUnavailableError, match=r"NVML_ERROR_DRIVER_NOT_LOADED.*kernel driver is not loaded"
    ):
        open_nvml()


def test_missing_bindings_are_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailableError, match=r"pynvml module .*nvidia-ml-py.* cannot be imported"):
        open_inventory("nvml")


def test_nvml_is_initialised_once_and_shut_down_once(driver: FakeDriver) -> None:
    inv = open_nvml()
    inv.gpus()
    inv.refresh_health()
    inv.gpus()
    assert driver.calls.count("nvmlInit") == 1
    assert driver.refcount == 1
    inv.close()
    inv.close()
    assert driver.refcount == 0
    assert driver.calls.count("nvmlShutdown") == 1
    with pytest.raises(InventoryError, match="closed"):
        inv.refresh_health()


def test_lost_gpu_becomes_unhealthy_and_recovers(driver: FakeDriver) -> None:
    inv = open_nvml()
    assert not inv.wait_health_event(0)
    driver.gpus[1].lost = True
    assert inv.wait_health_event(0), "losing a GPU raises no XID event here; the probe must notice"
    first, second = inv.refresh_health()
    assert first.healthy
    assert not second.healthy and "NVML_ERROR_GPU_IS_LOST" in second.health_reason
    assert inv.gpus() == [first, second]
    driver.gpus[1].lost = False
    assert inv.wait_health_event(0)
    assert all(gpu.healthy for gpu in inv.refresh_health())


@pytest.mark.parametrize(
    ("rows", "words"),
    [((0, 1, 1, 0), "row remapping is pending"), ((0, 9, 0, 1), "row remapping failed")],
)
def test_row_remapping_trouble_is_unhealthy(
    driver: FakeDriver, rows: tuple[int, int, int, int], words: str
) -> None:
    driver.gpus[0].remapped_rows = rows
    first, second = open_nvml().gpus()
    assert not first.healthy and words in first.health_reason
    assert second.healthy


def test_fatal_xid_taints_until_the_driver_needs_no_recovery(driver: FakeDriver) -> None:
    inv = open_nvml()
    inv.refresh_health()  # the health loop starts here, and so does the XID watch
    driver.gpus[0].recovery_action = fake_pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    driver.inject_xid(0, 79)
    assert inv.wait_health_event(5)
    first, second = inv.refresh_health()
    assert not first.healthy
    assert first.health_reason == "XID 79: GPU has fallen off the bus (needs GPU reset)"
    assert second.healthy, "the XID hit GPU 0 only"
    assert not inv.refresh_health()[0].healthy, "an XID is sticky until the driver says it is over"
    driver.gpus[0].recovery_action = fake_pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert inv.wait_health_event(0), "recovery raises no event; the probe at the timeout must see it"
    assert all(gpu.healthy for gpu in inv.refresh_health())


def test_xid_the_driver_needs_no_recovery_for_leaves_the_gpu_healthy(driver: FakeDriver) -> None:
    inv = open_nvml()
    inv.refresh_health()  # the health loop starts here, and so does the XID watch
    driver.inject_xid(1, 13)
    assert not inv.wait_health_event(5)
    assert all(gpu.healthy for gpu in inv.refresh_health())


def test_old_driver_without_recovery_action_ignores_application_xids_only(driver: FakeDriver) -> None:
    for gpu in driver.gpus:
        gpu.recovery_action = None
    inv = open_nvml()
    inv.refresh_health()  # the health loop starts here, and so does the XID watch
    driver.inject_xid(0, 43)
    assert not inv.wait_health_event(5), "XID 43 is an application fault"
    driver.inject_xid(0, 48)
    assert inv.wait_health_event(5)
    first, _ = inv.refresh_health()
    assert not first.healthy and first.health_reason == "XID 48: double-bit ECC error"
    assert not inv.refresh_health()[0].healthy, "without a recovery signal the XID stays until restart"


def test_gpu_without_xid_events_is_still_probed(driver: FakeDriver) -> None:
    driver.gpus[1].supported_events = fake_pynvml.nvmlEventTypePState
    inv = open_nvml()
    assert not inv.wait_health_event(0)
    assert [s.registered for s in driver.event_sets] == [{0: fake_pynvml.nvmlEventTypeXidCriticalError}]
    driver.gpus[1].lost = True
    assert inv.wait_health_event(0)
    assert not inv.refresh_health()[1].healthy


def test_no_event_support_at_all_falls_back_to_polling(driver: FakeDriver) -> None:
    driver.missing.add("nvmlEventSetCreate")
    inv = open_nvml()
    assert not inv.wait_health_event(0)
    driver.gpus[0].lost = True
    assert inv.wait_health_event(0)


def test_close_during_a_wait_frees_the_event_set_only_after_the_wait(driver: FakeDriver) -> None:
    inv = open_nvml()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(inv.wait_health_event(60)))
    waiter.start()
    assert driver.waiting.wait(30), "the waiter never reached the NVML wait"
    inv.close()
    assert "nvmlEventSetFree" not in driver.calls, "freeing the set under a blocked wait is a use-after-free"
    assert driver.refcount == 1
    driver.inject_xid(0, 79)
    waiter.join(30)
    assert results == [False], "a closed inventory reports nothing"
    assert driver.calls.count("nvmlEventSetFree") == 1
    assert driver.refcount == 0
