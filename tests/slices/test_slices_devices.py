"""Slices for a simulated 8xH100-80GB node respect every limit a real API server enforces."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from dra_gpu import DRIVER_NAME
from dra_gpu.config import GpuSharingMode, NodeSharing
from dra_gpu.devicekinds.gpu import build_device, semver
from dra_gpu.inventory import open_inventory
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.validation import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS,
    slice_errors,
)
from dra_gpu.quantity import parse_quantity
from dra_gpu.slices import SlicePublisher
from dra_gpu.slices.devices import device_errors, taint_value, unhealthy_taint
from dra_gpu.vocabulary.device import MEMORY_STEP

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def h100_node(sharing: str = "*=Shared,1=MPS,2=Exclusive", node: str = "node-1") -> list[dict[str, Any]]:
    api = FakeKube()
    api.create("Node", {"metadata": {"name": node}})
    inventory = open_inventory("simulated:8xH100-80GB", seed=node)
    return SlicePublisher(api, node, inventory, NodeSharing.parse(sharing)).sync()


def one_gpu() -> GpuInfo:
    return open_inventory("simulated:1xH100-80GB", seed="n").gpus()[0]


def test_eight_h100_slices_respect_every_api_limit() -> None:
    slices = h100_node()
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    for s in slices:
        assert slice_errors(s) == []
        assert len(s["spec"]["devices"]) <= MAX_DEVICES_PER_SLICE_WITH_TAINTS
        assert DNS_SUBDOMAIN.match(s["metadata"]["name"]) and len(s["metadata"]["name"]) <= 253
    for device in devices:
        assert DNS_LABEL.match(device["name"]) and len(device["name"]) <= 63
        names = [*device["attributes"], *device["capacity"]]
        assert len(names) <= MAX_ATTRIBUTES_AND_CAPACITIES
        for name in names:
            domain, _, ident = name.rpartition("/")
            assert C_IDENT.match(ident), name
            assert not domain or (DNS_SUBDOMAIN.match(domain) and len(domain) <= 63), name
            # 1.38: never our own domain (an unqualified name already is ours), at most one slash.
            assert domain != DRIVER_NAME and name.count("/") <= 1, name
        for name, value in device["attributes"].items():
            assert len(value) == 1, f"{name} must carry exactly one value type"
            if "string" in value:
                assert len(value["string"]) <= 64
            if "version" in value:
                assert SEMVER.match(value["version"]), value
        assert device_errors(device) == []


def test_attributes_describe_the_gpu_in_the_drivers_domain() -> None:
    gpu = one_gpu()
    device = build_device(gpu, GpuSharingMode.SHARED)
    attributes = device["attributes"]
    assert attributes["uuid"] == {"string": gpu.uuid}
    assert attributes["index"] == {"int": 0}
    assert attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attributes["architecture"] == {"string": "Hopper"}
    assert attributes["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attributes["driverVersion"] == {"version": "580.95.5"}  # 580.95.05: no leading zero in semver
    assert attributes["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": gpu.pci_bus_id}
    assert attributes["sharing"] == {"string": "Shared"}


def test_shared_and_mps_gpus_are_multi_allocatable_and_exclusive_ones_are_not() -> None:
    devices = {d["name"]: d for s in h100_node() for d in s["spec"]["devices"]}
    assert devices["gpu-0"]["attributes"]["sharing"]["string"] == "Shared"
    assert devices["gpu-1"]["attributes"]["sharing"]["string"] == "MPS"
    assert devices["gpu-2"]["attributes"]["sharing"]["string"] == "Exclusive"
    for name in ("gpu-0", "gpu-1"):
        assert devices[name]["allowMultipleAllocations"] is True
        assert all("requestPolicy" in c for c in devices[name]["capacity"].values())
    assert "allowMultipleAllocations" not in devices["gpu-2"]
    assert all("requestPolicy" not in c for c in devices["gpu-2"]["capacity"].values())


@pytest.mark.parametrize("mode", list(GpuSharingMode))
def test_a_gpu_in_mig_mode_is_published_whole_whatever_the_sharing_setting(mode: GpuSharingMode) -> None:
    device = build_device(replace(one_gpu(), mig_enabled=True), mode)
    assert device["attributes"]["sharing"] == {"string": "Exclusive"}
    assert device["attributes"]["migEnabled"] == {"bool": True}
    assert "allowMultipleAllocations" not in device
    assert build_device(one_gpu(), mode)["attributes"]["migEnabled"] == {"bool": False}


def test_request_policies_give_the_whole_gpu_by_default_and_exact_shares_on_request() -> None:
    gpu = one_gpu()
    device = build_device(gpu, GpuSharingMode.SHARED)
    memory = device["capacity"]["memory"]
    cores = device["capacity"]["cores"]
    whole = parse_quantity(memory["value"])
    assert gpu.memory_bytes - MEMORY_STEP < whole <= gpu.memory_bytes
    assert parse_quantity(memory["requestPolicy"]["default"]) == whole
    assert parse_quantity(memory["requestPolicy"]["validRange"]["max"]) == whole
    step = parse_quantity(memory["requestPolicy"]["validRange"]["step"])
    minimum = parse_quantity(memory["requestPolicy"]["validRange"]["min"])
    # The scheduler rounds a request up to min + n * step: 10Gi stays 10Gi, 10.1Gi becomes 10.25Gi.
    for asked, granted in (("10Gi", "10Gi"), ("10.1Gi", "10496Mi"), ("1", "256Mi")):
        request = parse_quantity(asked)
        n = max(0, -((minimum - request) // step))
        assert minimum + n * step == parse_quantity(granted)
    assert cores == {
        "value": "100",
        "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
    }


def test_older_api_servers_get_unshared_devices_that_keep_their_mode() -> None:
    device = build_device(one_gpu(), GpuSharingMode.MPS, consumable_capacity=False)
    assert "allowMultipleAllocations" not in device
    assert all("requestPolicy" not in c for c in device["capacity"].values())
    assert device["attributes"]["sharing"] == {"string": "MPS"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9.0", "9.0.0"),
        ("580.95.05", "580.95.5"),
        ("13", "13.0.0"),
        ("550.54.15", "550.54.15"),
        ("r580", None),
    ],
)
def test_versions_become_semver_or_strings(text: str, expected: str | None) -> None:
    assert semver(text) == expected
    gpu = replace(one_gpu(), driver_version=text)
    attribute = build_device(gpu, GpuSharingMode.EXCLUSIVE)["attributes"]["driverVersion"]
    assert attribute == ({"version": expected} if expected else {"string": text})


def test_long_product_names_are_clipped_to_what_the_api_accepts() -> None:
    gpu = replace(one_gpu(), product_name="NVIDIA " + "X" * 100)
    device = build_device(gpu, GpuSharingMode.EXCLUSIVE)
    assert len(device["attributes"]["productName"]["string"]) == 64
    assert device_errors(device) == []


def test_unhealthy_taint_is_a_valid_taint_naming_the_reason() -> None:
    taint = unhealthy_taint("XID 79: GPU has fallen off the bus", "2026-11-23T00:00:00Z")
    assert taint["key"] == f"{DRIVER_NAME}/unhealthy"
    assert taint["effect"] == "NoSchedule"
    assert taint["value"] == "XID-79-GPU-has-fallen-off-the-bus"
    for reason in ("", "!!!", "a" * 200, "ECC: double-bit error (volatile)"):
        value = taint_value(reason)
        assert LABEL_VALUE.match(value) and 0 < len(value) <= 63, value


def test_device_errors_speak_the_api_servers_rules_the_fake_does_not_check() -> None:
    device = build_device(one_gpu(), GpuSharingMode.SHARED)
    device["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] = "300Mi"
    device["attributes"]["driverVersion"] = {"version": "580.95.05"}
    device["capacity"]["cores"]["value"] = "-1"
    errors = device_errors(device, "spec.devices[0]")
    assert any("default is not a multiple of a given step (300Mi) from (256Mi)" in e for e in errors)
    assert any("max is not a multiple of a given step" in e for e in errors)
    assert any(
        'spec.devices[0].attributes[driverVersion].version: Invalid value: "580.95.05"' in e for e in errors
    )
    assert any('capacity[cores].value: Invalid value: "-1": must not be negative' in e for e in errors)
