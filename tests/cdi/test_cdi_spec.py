"""The spec models read and write exactly the JSON keys of the CDI spec, strictly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdi.errors import CDIError
from cdi.files import parse_spec
from cdi.spec import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec

FULL = {
    "cdiVersion": "0.7.0",
    "kind": "example.com/gpu",
    "annotations": {"owner": "test"},
    "containerEdits": {"env": ["SPEC=1"]},
    "devices": [
        {
            "name": "gpu0",
            "annotations": {"uuid": "GPU-1"},
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=0"],
                "deviceNodes": [
                    {
                        "path": "/dev/nvidia0",
                        "hostPath": "/dev/nvidia0",
                        "type": "c",
                        "major": 195,
                        "minor": 0,
                        "fileMode": 438,
                        "permissions": "rw",
                        "uid": 0,
                        "gid": 44,
                    }
                ],
                "mounts": [
                    {
                        "hostPath": "/usr/lib/libfoo.so",
                        "containerPath": "/usr/lib/libfoo.so",
                        "options": ["ro", "nosuid", "nodev", "bind"],
                        "type": "bind",
                    }
                ],
                "hooks": [
                    {
                        "hookName": "createContainer",
                        "path": "/usr/bin/hook",
                        "args": ["hook", "x"],
                        "env": ["A=B"],
                        "timeout": 5,
                    }
                ],
                "additionalGids": [44],
                "intelRdt": {"closID": "c1", "l3CacheSchema": "L3:0=f", "memBwSchema": "MB:0=50"},
            },
        }
    ],
}


def test_every_spec_key_round_trips_unchanged() -> None:
    spec = parse_spec(json.dumps(FULL))
    assert spec.devices[0].container_edits.device_nodes[0].host_path == "/dev/nvidia0"  # type: ignore[index]
    assert spec.devices[0].container_edits.additional_gids == [44]
    assert json.loads(spec.to_json()) == FULL


def test_python_names_dump_to_spec_keys_and_unset_fields_are_dropped() -> None:
    spec = Spec(
        cdi_version="0.5.0",
        kind="example.com/gpu",
        devices=[
            Device(
                name="gpu0",
                container_edits=ContainerEdits(
                    device_nodes=[DeviceNode(path="/dev/nvidia0", host_path="/dev/nvidia0")],
                    mounts=[Mount(host_path="/h", container_path="/c")],
                    hooks=[Hook(hook_name="poststop", path="/bin/true")],
                ),
            )
        ],
    )
    assert spec.to_dict() == {
        "cdiVersion": "0.5.0",
        "kind": "example.com/gpu",
        "devices": [
            {
                "name": "gpu0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}],
                    "hooks": [{"hookName": "poststop", "path": "/bin/true"}],
                    "mounts": [{"hostPath": "/h", "containerPath": "/c"}],
                },
            }
        ],
    }


def test_to_json_fills_in_the_minimum_version_when_unset() -> None:
    spec = Spec(
        kind="example.com/gpu",
        devices=[Device(name="gpu0", container_edits=ContainerEdits(additional_gids=[44]))],
    )
    assert json.loads(spec.to_json())["cdiVersion"] == "0.7.0"
    assert spec.cdi_version is None  # the model itself is not changed


@pytest.mark.parametrize(
    "patch, where, what",
    [
        (
            {"containerEdits": {"additionalGIDs": [1]}},
            "devices.0.containerEdits.additionalGIDs",
            "Extra inputs",
        ),
        ({"containerEdits": {"env": "A=1"}}, "devices.0.containerEdits.env", "valid list"),
        ({"containerEdits": {"deviceNodes": [{"path": "/x", "major": "195"}]}}, "major", "valid integer"),
        ({"containerEdits": {"deviceNodes": [{"path": "/x", "gid": -1}]}}, "gid", "greater than or equal"),
        ({"containerEdits": {"mounts": [{"hostPath": "/x"}]}}, "containerPath", "Field required"),
        ({"name": "gpu0"}, "devices.0.containerEdits", "Field required"),
    ],
)
def test_strict_parsing_names_the_bad_key(patch: dict[str, Any], where: str, what: str) -> None:
    doc: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "example.com/gpu",
        "devices": [{"name": "gpu0", **patch}],
    }
    with pytest.raises(CDIError) as err:
        parse_spec(json.dumps(doc), source="test.json")
    assert "CDI spec test.json does not match the CDI schema" in str(err.value)
    assert where in str(err.value) and what in str(err.value)


def test_duplicate_keys_are_refused_in_json_and_yaml() -> None:
    with pytest.raises(CDIError, match="duplicate key 'kind'"):
        parse_spec('{"cdiVersion": "0.3.0", "kind": "a/b", "kind": "c/d", "devices": []}')
    with pytest.raises(CDIError, match="duplicate key 'kind'"):
        parse_spec("cdiVersion: 0.3.0\nkind: a/b\nkind: c/d\ndevices: []\n", fmt="yaml")


def test_yaml_spec_parses_like_json() -> None:
    text = "cdiVersion: '0.3.0'\nkind: example.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n    env: [A=1]\n"
    assert parse_spec(text, fmt="yaml").devices[0].container_edits.env == ["A=1"]


def test_non_mapping_document_is_reported() -> None:
    with pytest.raises(CDIError, match=r"CDI spec x.json is not a mapping"):
        parse_spec("[]", source="x.json")
    with pytest.raises(CDIError, match=r"CDI spec x.json is not valid JSON"):
        parse_spec("{", source="x.json")
