"""Resolving CDI names the way a runtime does: what would the container receive?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdi.errors import CDIError
from cdi.files import write_spec
from cdi.resolver import Registry
from cdi.spec import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec

KIND = "k8s.gpu.example.com/claim"


def _put(directory: Path, filename: str, doc: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(json.dumps(doc))
    return path


def _doc(devices: dict[str, list[str]], kind: str = KIND, **top: Any) -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": env}} for n, env in devices.items()],
        **top,
    }


def test_round_trip_model_file_registry_container(tmp_path: Path) -> None:
    uid = "7d1c0f7e-2b7a-4c55-9a43-0c6f6e3f2d11"
    spec = Spec(
        kind=KIND,
        container_edits=ContainerEdits(
            env=["NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            mounts=[Mount(host_path="/usr/lib/libcuda.so.1", container_path="/usr/lib/libcuda.so.1")],
        ),
        devices=[
            Device(
                name=f"{uid}-gpu-0",
                container_edits=ContainerEdits(
                    env=["NVIDIA_VISIBLE_DEVICES=GPU-aaa"],
                    device_nodes=[DeviceNode(path="/dev/nvidia0")],
                ),
            ),
            Device(
                name=f"{uid}-gpu-1",
                container_edits=ContainerEdits(device_nodes=[DeviceNode(path="/dev/nvidia1")]),
            ),
        ],
    )
    write_spec(tmp_path, spec, uid)
    registry = Registry.load([tmp_path])
    assert registry.device_names() == [f"{KIND}={uid}-gpu-0", f"{KIND}={uid}-gpu-1"]
    cfg = registry.resolve([f"{KIND}={uid}-gpu-0", f"{KIND}={uid}-gpu-1"])
    assert cfg.env == {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NVIDIA_VISIBLE_DEVICES": "GPU-aaa"}
    assert [(d.path, d.host_path) for d in cfg.device_nodes] == [
        ("/dev/nvidia0", "/dev/nvidia0"),
        ("/dev/nvidia1", "/dev/nvidia1"),
    ]
    # Spec-level edits are applied once even though two devices of the spec are injected.
    assert [m.container_path for m in cfg.mounts] == ["/usr/lib/libcuda.so.1"]


def test_only_the_requested_devices_are_applied(tmp_path: Path) -> None:
    _put(tmp_path, "a.json", _doc({"gpu0": ["A=0"], "gpu1": ["B=1"]}))
    cfg = Registry.load([tmp_path]).resolve([f"{KIND}=gpu1"])
    assert cfg.env == {"B": "1"}


def test_spec_edits_come_before_device_edits_and_later_env_wins(tmp_path: Path) -> None:
    doc = _doc(
        {"gpu0": ["MODE=device", "X=1"], "gpu1": ["X=2"]}, containerEdits={"env": ["MODE=spec", "S=1"]}
    )
    _put(tmp_path, "a.json", doc)
    cfg = Registry.load([tmp_path]).resolve([f"{KIND}=gpu0", f"{KIND}=gpu1"])
    assert cfg.env == {"MODE": "device", "S": "1", "X": "2"}
    assert cfg.env_list() == ["MODE=device", "S=1", "X=2"]


def test_later_directory_overrides_an_earlier_one(tmp_path: Path) -> None:
    static, dynamic = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    _put(static, "a.json", _doc({"gpu0": ["FROM=static"], "gpu1": ["ONLY=static"]}))
    _put(dynamic, "b.json", _doc({"gpu0": ["FROM=dynamic"]}))
    registry = Registry.load([static, dynamic])
    assert registry.resolve([f"{KIND}=gpu0"]).env == {"FROM": "dynamic"}
    assert registry.resolve([f"{KIND}=gpu1"]).env == {"ONLY": "static"}
    assert registry.spec_path(f"{KIND}=gpu0") == dynamic / "b.json"
    assert registry.conflicts == {}


def test_same_device_twice_at_the_same_priority_is_unresolvable(tmp_path: Path) -> None:
    _put(tmp_path, "a.json", _doc({"gpu0": ["A=1"], "gpu1": ["OK=1"]}))
    _put(tmp_path, "b.yaml", _doc({"gpu0": ["A=2"]}))
    registry = Registry.load([tmp_path])
    assert registry.resolve([f"{KIND}=gpu1"]).env == {"OK": "1"}
    with pytest.raises(CDIError) as err:
        registry.resolve([f"{KIND}=gpu0"])
    msg = str(err.value)
    assert msg.startswith(f"unresolvable CDI devices: {KIND}=gpu0")
    assert f"conflicting device '{KIND}=gpu0'" in msg and "a.json" in msg and "b.yaml" in msg


def test_conflict_stays_even_if_a_higher_priority_spec_defines_the_device(tmp_path: Path) -> None:
    """The reference cache drops every conflicting name at the end of a refresh."""
    low, high = tmp_path / "low", tmp_path / "high"
    _put(low, "a.json", _doc({"gpu0": ["A=1"]}))
    _put(low, "b.json", _doc({"gpu0": ["A=2"]}))
    _put(high, "c.json", _doc({"gpu0": ["A=3"]}))
    with pytest.raises(CDIError, match="unresolvable CDI devices"):
        Registry.load([low, high]).resolve([f"{KIND}=gpu0"])


def test_only_json_and_yaml_files_directly_in_the_directory_are_read(tmp_path: Path) -> None:
    _put(tmp_path, "a.json", _doc({"json": ["A=1"]}))
    _put(tmp_path, "b.yaml", _doc({"yaml": ["A=1"]}))
    _put(tmp_path, "c.yml", _doc({"yml": ["A=1"]}))
    _put(tmp_path, ".d.json.123.tmp", _doc({"tmp": ["A=1"]}))
    _put(tmp_path / "sub", "e.json", _doc({"sub": ["A=1"]}))
    registry = Registry.load([tmp_path, tmp_path / "does-not-exist"])
    assert registry.device_names() == [f"{KIND}=json", f"{KIND}=yaml"]


def test_a_file_with_an_unknown_key_is_skipped_and_the_reason_is_given(tmp_path: Path) -> None:
    bad = _doc({"gpu0": ["A=1"]})
    bad["devices"][0]["containerEdits"]["additionalGIDs"] = [44]  # the SPEC prose spelling, wrong in JSON
    _put(tmp_path, "bad.json", bad)
    _put(tmp_path, "good.json", _doc({"gpu1": ["B=1"]}))
    registry = Registry.load([tmp_path])
    assert registry.device_names() == [f"{KIND}=gpu1"]
    assert "additionalGIDs" in registry.skipped[tmp_path / "bad.json"]
    with pytest.raises(CDIError) as err:
        registry.resolve([f"{KIND}=gpu0"])
    assert "spec files skipped:" in str(err.value) and "bad.json" in str(err.value)


def test_a_spec_a_runtime_would_refuse_is_skipped(tmp_path: Path) -> None:
    _put(tmp_path, "v.json", {**_doc({"gpu0": ["A=1"]}), "cdiVersion": "9.9.9"})
    _put(tmp_path, "empty.json", {**_doc({}), "devices": [{"name": "gpu1", "containerEdits": {}}]})
    registry = Registry.load([tmp_path])
    assert registry.device_names() == []
    assert "cdiVersion '9.9.9' is not a known CDI version" in registry.skipped[tmp_path / "v.json"]
    assert "containerEdits is empty" in registry.skipped[tmp_path / "empty.json"]


def test_unresolvable_names_are_listed(tmp_path: Path) -> None:
    _put(tmp_path, "a.json", _doc({"gpu0": ["A=1"]}))
    with pytest.raises(CDIError) as err:
        Registry.load([tmp_path]).resolve([f"{KIND}=gpu0", f"{KIND}=gpu9", "not-qualified"])
    msg = str(err.value)
    assert msg.startswith(f"unresolvable CDI devices: {KIND}=gpu9, not-qualified")
    assert "'not-qualified' is not a fully qualified CDI device name" in msg


def test_edits_apply_like_the_oci_editor(tmp_path: Path) -> None:
    doc = {
        "cdiVersion": "0.7.0",
        "kind": KIND,
        "devices": [
            {
                "name": "a",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/x-a"}],
                    "mounts": [
                        {"hostPath": "/h/lib/deep", "containerPath": "/lib/a/b"},
                        {"hostPath": "/h/a", "containerPath": "/lib"},
                    ],
                    "hooks": [{"hookName": "createContainer", "path": "/bin/a"}],
                    "additionalGids": [0, 44],
                },
            },
            {
                "name": "b",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/x-b"}, {"path": "/dev/y"}],
                    "mounts": [{"hostPath": "/h/b", "containerPath": "/lib", "options": ["ro", "bind"]}],
                    "hooks": [{"hookName": "poststop", "path": "/bin/b"}],
                    "additionalGids": [44, 45],
                },
            },
        ],
    }
    _put(tmp_path, "a.json", doc)
    cfg = Registry.load([tmp_path]).resolve([f"{KIND}=a", f"{KIND}=b"])
    # Same container path: the later edit replaces the earlier one.
    assert [(d.path, d.host_path) for d in cfg.device_nodes] == [("/dev/x", "/dev/x-b"), ("/dev/y", "/dev/y")]
    # Parents are mounted before children, whatever the order in the spec.
    assert [(m.container_path, m.host_path) for m in cfg.mounts] == [
        ("/lib", "/h/b"),
        ("/lib/a/b", "/h/lib/deep"),
    ]
    assert cfg.mount_for("/lib") == Mount(host_path="/h/b", container_path="/lib", options=["ro", "bind"])
    assert [h.path for h in cfg.hooks_named("createContainer")] == ["/bin/a"]
    assert cfg.hooks == [
        Hook(hook_name="createContainer", path="/bin/a"),
        Hook(hook_name="poststop", path="/bin/b"),
    ]
    # GID 0 is never added; duplicates collapse.
    assert cfg.additional_gids == [44, 45]
