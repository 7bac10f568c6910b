"""Problems that would make a real runtime refuse a spec, found before any container starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cdi.files import write_spec
from cdi.runtime_check import check_spec_for_runtime
from cdi.spec import ContainerEdits, Device, DeviceNode, Hook, LinuxNetDevice, Mount, Spec

KIND = "k8s.gpu.example.com/claim"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A fake host filesystem: a FIFO stands in for a device node (mknod needs privileges)."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    os.mkfifo(root / "dev" / "fake0")
    (root / "dev" / "regular").write_text("")
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "libcuda.so.1").write_text("")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "hook").write_text("")
    return root


def _spec(version: str | None = None, **edits: Any) -> Spec:
    return Spec(
        cdi_version=version,
        kind=KIND,
        devices=[Device(name="gpu0", container_edits=ContainerEdits(env=["A=1"], **edits))],
    ).with_version()


def test_a_spec_a_runtime_accepts_has_no_problems(host: Path) -> None:
    spec = _spec(
        device_nodes=[DeviceNode(path="/dev/fake0", host_path="/dev/fake0")],
        mounts=[Mount(host_path="/usr/lib/libcuda.so.1", container_path="/usr/lib/libcuda.so.1")],
        hooks=[Hook(hook_name="createContainer", path="/usr/bin/hook")],
    )
    assert spec.cdi_version == "0.5.0"
    assert check_spec_for_runtime(spec, max_version="0.5.0", host_root=host) == []


def test_version_newer_than_the_runtime_names_both_versions(host: Path) -> None:
    problems = check_spec_for_runtime(_spec("1.1.0"), max_version="0.5.0", host_root=host)
    assert problems == [
        "cdiVersion 1.1.0 is newer than the runtime's CDI library supports (at most 0.5.0); "
        "the features used need only 0.3.0"
    ]


def test_features_the_runtime_cannot_have_are_named(host: Path) -> None:
    spec = _spec(additional_gids=[44])
    problems = check_spec_for_runtime(spec, max_version="0.5.0", host_root=host)
    assert "cdiVersion 0.7.0 is newer than the runtime's CDI library supports (at most 0.5.0)" in problems[0]
    assert problems[1] == (
        "the features used need cdiVersion 0.7.0, newer than the runtime supports (at most 0.5.0): "
        "device 'gpu0': additionalGids"
    )
    assert check_spec_for_runtime(spec, max_version="1.1.0", host_root=host) == []


def test_missing_device_node_names_the_host_path(host: Path) -> None:
    spec = _spec(
        device_nodes=[DeviceNode(path="/dev/nvidia0"), DeviceNode(path="/dev/x", host_path="/dev/nope")]
    )
    assert check_spec_for_runtime(spec, max_version="0.5.0", host_root=host) == [
        "device 'gpu0': device node '/dev/nvidia0': host path '/dev/nvidia0' does not exist",
        "device 'gpu0': device node '/dev/x': host path '/dev/nope' does not exist",
    ]


def test_fully_described_device_node_is_not_looked_up_on_the_host(host: Path) -> None:
    spec = _spec(device_nodes=[DeviceNode(path="/dev/nvidia9", type="c", major=195, minor=9)])
    assert check_spec_for_runtime(spec, host_root=host) == []


def test_host_path_that_is_not_a_device_or_has_another_type(host: Path) -> None:
    spec = _spec(
        device_nodes=[
            DeviceNode(path="/dev/regular"),
            DeviceNode(path="/dev/fake0", type="c"),
        ]
    )
    assert check_spec_for_runtime(spec, host_root=host) == [
        "device 'gpu0': device node '/dev/regular': host path '/dev/regular' is not a device node",
        "device 'gpu0': device node '/dev/fake0': type 'c' does not match the host's 'p'",
    ]


def test_missing_mount_source_and_hook_are_named(host: Path) -> None:
    spec = Spec(
        kind=KIND,
        container_edits=ContainerEdits(
            mounts=[Mount(host_path="/usr/lib/libgone.so", container_path="/lib/x.so")]
        ),
        devices=[
            Device(
                name="gpu0",
                container_edits=ContainerEdits(
                    hooks=[Hook(hook_name="createContainer", path="/usr/bin/gone")]
                ),
            )
        ],
    ).with_version()
    assert check_spec_for_runtime(spec, host_root=host) == [
        "spec containerEdits: mount '/lib/x.so': host path '/usr/lib/libgone.so' does not exist",
        "device 'gpu0': createContainer hook: path '/usr/bin/gone' does not exist",
    ]


def test_invalid_names_and_edits_are_reported(host: Path) -> None:
    spec = Spec(
        cdi_version="0.3.0",
        kind="k8s.gpu.example.com/claim",
        devices=[
            Device(name="claim/gpu", container_edits=ContainerEdits(env=["=x"])),
            Device(
                name="gpu1", container_edits=ContainerEdits(hooks=[Hook(hook_name="preStart", path="/x")])
            ),
        ],
    )
    problems = check_spec_for_runtime(spec, host_root=host)
    assert any(p.startswith("CDI device name 'claim/gpu' is invalid: character '/'") for p in problems)
    assert "device 'claim/gpu': env entry '=x' is not NAME=VALUE" in problems
    assert any("hook name 'preStart' is invalid" in p for p in problems)


def test_net_devices_need_a_runtime_that_knows_1_1_0(host: Path) -> None:
    spec = _spec(net_devices=[LinuxNetDevice(host_interface_name="eth1", name="net1")])
    problems = check_spec_for_runtime(spec, max_version="0.8.0", host_root=host)
    assert problems[-1].endswith("(at most 0.8.0): device 'gpu0': netDevices")


def test_checks_a_written_file(tmp_path: Path, host: Path) -> None:
    path = write_spec(tmp_path / "cdi", _spec(device_nodes=[DeviceNode(path="/dev/fake0")]), "uid-1")
    assert check_spec_for_runtime(path, host_root=host) == []
    broken = tmp_path / "cdi" / "broken.json"
    broken.write_text(json.dumps({"cdiVersion": "0.3.0", "kind": KIND, "devices": [], "extra": 1}))
    [problem] = check_spec_for_runtime(broken, host_root=host)
    assert "broken.json does not match the CDI schema: extra: Extra inputs are not permitted" in problem
