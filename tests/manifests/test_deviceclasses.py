"""The DeviceClass selectors pick exactly the intended devices, evaluated with a real CEL implementation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml

from dra_gpu import DRIVER_NAME
from dra_gpu.config import GpuSharingMode, Strategy, parse_gpu_config
from dra_gpu.controller.owned_classes import MANAGED_SELECTOR
from dra_gpu.devicekinds.gpu import build_device
from dra_gpu.devicekinds.mig import mig_devices
from dra_gpu.inventory import open_inventory
from dra_gpu.manifests import load_values
from dra_gpu.manifests.classes import controller_classes, device_classes
from dra_gpu.vocabulary.device import device_name

DEPLOY = Path("deploy")
MODES = {0: "Shared", 1: "Shared", 2: "MPS", 3: "MPS", 4: "Exclusive", 5: "Exclusive", 6: "Shared", 7: "MPS"}


def cel_device(device: dict[str, Any], driver: str = DRIVER_NAME) -> dict[str, Any]:
    """The `device` variable as Kubernetes builds it: attributes and capacity grouped by domain."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.get("attributes", {}).items():
        domain, _, ident = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[ident] = next(iter(value.values()))
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in device.get("capacity", {}).items():
        domain, _, ident = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[ident] = value["value"]
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }


def node_devices(consumable_capacity: bool = True) -> list[dict[str, Any]]:
    gpus = open_inventory("simulated:8xH100-80GB", seed="n").gpus()
    return [
        build_device(g, GpuSharingMode(MODES[g.index]), consumable_capacity=consumable_capacity) for g in gpus
    ]


def matches(
    device_class: dict[str, Any], devices: list[dict[str, Any]], driver: str = DRIVER_NAME
) -> set[str]:
    chosen = set()
    for device in devices:
        context = {"device": cel_device(device, driver)}
        if all(
            cel.evaluate(s["cel"]["expression"], context) is True for s in device_class["spec"]["selectors"]
        ):
            chosen.add(device["name"])
    return chosen


def by_name() -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in device_classes(load_values())}


def names(mode: str) -> set[str]:
    return {device_name(i) for i, m in MODES.items() if m == mode}


@pytest.mark.parametrize("consumable_capacity", [True, False])
def test_each_class_selects_exactly_the_gpus_of_its_mode(consumable_capacity: bool) -> None:
    classes = by_name()
    devices = node_devices(consumable_capacity)
    assert matches(classes["gpu.dra-gpu.io"], devices) == names("Exclusive")
    assert matches(classes["limiter.gpu.dra-gpu.io"], devices) == names("Shared")
    assert matches(classes["timeslice.gpu.dra-gpu.io"], devices) == names("Shared")
    assert matches(classes["mps.gpu.dra-gpu.io"], devices) == names("MPS")


def test_other_drivers_devices_are_never_selected() -> None:
    devices = node_devices()
    for device_class in by_name().values():
        assert matches(device_class, devices, driver="gpu.example.com") == set()


def test_each_class_carries_the_gpu_config_of_its_mode() -> None:
    expected = {
        "gpu.dra-gpu.io": Strategy.EXCLUSIVE,
        "timeslice.gpu.dra-gpu.io": Strategy.TIME_SLICING,
        "mps.gpu.dra-gpu.io": Strategy.MPS,
        "limiter.gpu.dra-gpu.io": Strategy.LIMITER,
        "isolated.gpu.dra-gpu.io": Strategy.LIMITER,
        "mig.gpu.dra-gpu.io": Strategy.EXCLUSIVE,
    }
    classes = by_name()
    assert set(classes) == set(expected)
    for name, strategy in expected.items():
        (config,) = classes[name]["spec"]["config"]
        assert config["opaque"]["driver"] == DRIVER_NAME
        assert parse_gpu_config(config["opaque"]["parameters"]).sharing.strategy == strategy


def test_deploy_resourceclass_yaml_holds_these_classes() -> None:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "resourceclass.yaml").read_text()) if d]
    assert documents == list(by_name().values())


def test_controller_classes_place_limiter_claims_on_shared_gpus() -> None:
    classes = {c["metadata"]["name"]: c for c in controller_classes(load_values())}
    expected = {
        "binpack": ("BinPack", None, None, None),
        "spread": ("Spread", None, None, None),
        "affinity": ("BinPack", "dra-gpu.io/group", None, None),
        "antiaffinity": ("BinPack", None, "app", None),
        "exclusion": ("BinPack", None, None, "dra-gpu.io/tenant"),
    }
    assert set(classes) == {f"{name}.limiter.gpu.dra-gpu.io" for name in expected}
    for name, (policy, affinity, anti_affinity, exclusion) in expected.items():
        device_class = classes[f"{name}.limiter.gpu.dra-gpu.io"]
        config = parse_gpu_config(device_class["spec"]["config"][0]["opaque"]["parameters"])
        assert config.sharing.strategy == Strategy.LIMITER
        placement = config.placement
        assert placement is not None and placement.policy.value == policy
        assert (placement.affinityLabel, placement.antiAffinityLabel, placement.exclusionLabel) == (
            affinity,
            anti_affinity,
            exclusion,
        )
        # The scheduler sees no device (the marker selector matches none), so it never allocates
        # these claims; the controller drops the marker and places them on the shared GPUs.
        assert matches(device_class, node_devices()) == set()
        unmarked = copy.deepcopy(device_class)
        unmarked["spec"]["selectors"] = [s for s in unmarked["spec"]["selectors"] if s != MANAGED_SELECTOR]
        assert matches(unmarked, node_devices()) == names("Shared")


def test_whole_gpu_class_leaves_out_mig_enabled_gpus(tmp_path: Path) -> None:
    """A MIG-enabled GPU is published Exclusive, yet a whole-GPU claim of it would lack /dev/nvidia-caps."""
    from dataclasses import replace

    gpus = open_inventory("simulated:2xH100-80GB", seed="n").gpus()
    devices = [
        build_device(replace(gpus[0], mig_enabled=True), GpuSharingMode.EXCLUSIVE),
        build_device(gpus[1], GpuSharingMode.EXCLUSIVE),
    ]
    without_attribute = copy.deepcopy(devices[1])  # a slice from an agent that did not publish it
    del without_attribute["attributes"]["migEnabled"]
    without_attribute["name"] = "gpu-old"
    whole = by_name()["gpu.dra-gpu.io"]
    assert matches(whole, [*devices, without_attribute]) == {device_name(1), "gpu-old"}
    values = tmp_path / "values.yaml"
    values.write_text(
        "controller:\n  classes:\n  - {name: whole.example, strategy: Exclusive, placement: {policy: Spread}}\n"
    )
    exclusive_managed = controller_classes(load_values(values))[0]
    exclusive_managed["spec"]["selectors"] = exclusive_managed["spec"]["selectors"][:1]
    assert matches(exclusive_managed, devices) == {device_name(1)}


def test_the_mig_class_selects_mig_instances_and_placements_and_no_whole_gpu() -> None:
    static, dynamic, plain = open_inventory(
        "simulated:1xH100-80GB:mig=3g.40gb/1g.10gb*4,1xH100-80GB:mig,1xH100-80GB", seed="n"
    ).gpus()
    devices = [
        *(mig_devices(static, GpuSharingMode.EXCLUSIVE) or []),
        *(mig_devices(dynamic, GpuSharingMode.EXCLUSIVE) or []),
        build_device(plain, GpuSharingMode.EXCLUSIVE),
    ]
    classes = by_name()
    chosen = matches(classes["mig.gpu.dra-gpu.io"], devices)
    assert "gpu-0-mig-3g40gb-4" in chosen and "gpu-1-mig-7g80gb-0" in chosen
    assert chosen == {d["name"] for d in devices} - {device_name(2)}
    assert matches(classes["gpu.dra-gpu.io"], devices) == {device_name(2)}
    shared = mig_devices(static, GpuSharingMode.SHARED) or []
    assert matches(classes["mig.gpu.dra-gpu.io"], shared) == set(), "a Shared instance is the limiter's"
    assert matches(classes["limiter.gpu.dra-gpu.io"], shared) == {d["name"] for d in shared}
