"""Fallback derivations for old drivers, and the formats Kubernetes and humans read."""

from __future__ import annotations

import pytest

from dra_gpu.inventory.arch import (
    architecture_from_code,
    architecture_from_compute_capability,
    compute_capability_from_name,
)
from dra_gpu.inventory.nvml import format_cuda_version, normalize_pci_bus_id
from dra_gpu.inventory.xid import APPLICATION_XIDS, describe_xid, xid_is_fatal


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        ("NVIDIA A100-SXM4-40GB", "8.0"),
        ("NVIDIA A100 80GB PCIe", "8.0"),
        ("NVIDIA A10", "8.6"),
        ("NVIDIA A10G", "8.6"),
        ("NVIDIA L40S", "8.9"),
        ("NVIDIA L4", "8.9"),
        ("NVIDIA H100 80GB HBM3", "9.0"),
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA B200", "10.0"),
        ("Tesla T4", "7.5"),
        ("Tesla V100-SXM2-32GB", "7.0"),
        ("NVIDIA GeForce RTX 4090", ""),
    ],
)
def test_compute_capability_from_product_name(name: str, cc: str) -> None:
    assert compute_capability_from_name(name) == cc


@pytest.mark.parametrize(
    ("cc", "architecture"),
    [("7.0", "Volta"), ("7.5", "Turing"), ("8.0", "Ampere"), ("8.6", "Ampere"), ("8.9", "Ada Lovelace"),
     ("9.0", "Hopper"), ("10.0", "Blackwell"), ("12.0", "Blackwell"), ("99.0", "Unknown"), ("x", "Unknown")],
)  # fmt: skip
def test_architecture_from_compute_capability(cc: str, architecture: str) -> None:
    assert architecture_from_compute_capability(cc) == architecture


def test_architecture_codes_follow_nvml_h() -> None:
    assert architecture_from_code(7) == "Ampere"
    assert architecture_from_code(9) == "Hopper"
    assert architecture_from_code(10) == "Blackwell"
    assert architecture_from_code(0xFFFFFFFF) is None


@pytest.mark.parametrize(
    ("nvml", "kubernetes"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:AB:00.0", "0000:ab:00.0"),
        ("00000001:1:0.0", "0001:01:00.0"),
        ("00010000:01:00.0", "00010000:01:00.0"),
    ],
)
def test_pci_bus_id_normalisation(nvml: str, kubernetes: str) -> None:
    assert normalize_pci_bus_id(nvml) == kubernetes


@pytest.mark.parametrize("garbage", ["", "18:00.0", "0000:18:00", "zzzz:18:00.0", "0000:18:00.9"])
def test_pci_bus_id_garbage_is_rejected(garbage: str) -> None:
    assert normalize_pci_bus_id(garbage) is None


@pytest.mark.parametrize(
    ("encoded", "text"), [(13000, "13.0"), (12040, "12.4"), (11080, "11.8"), (12090, "12.9")]
)
def test_cuda_version_decoding(encoded: int, text: str) -> None:
    assert format_cuda_version(encoded) == text


def test_xid_descriptions() -> None:
    assert describe_xid(79) == "XID 79: GPU has fallen off the bus"
    assert describe_xid(4242) == "XID 4242"


def test_recovery_action_outranks_the_xid_list() -> None:
    assert not xid_is_fatal(79, 0), "the driver says nothing needs doing"
    assert xid_is_fatal(13, 1), "the driver asks for a reset, even after an application XID"
    assert all(not xid_is_fatal(xid, None) for xid in APPLICATION_XIDS)
    assert xid_is_fatal(79, None)
