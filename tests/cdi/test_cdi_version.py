"""The lowest cdiVersion a spec needs, feature by feature, as the reference library computes it."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.errors import CDIError
from cdi.spec import ContainerEdits, Device, DeviceNode, IntelRdt, LinuxNetDevice, Mount, Spec
from cdi.version import CURRENT_VERSION, KNOWN_VERSIONS, features_needing, minimum_version, version_key


def _spec(edits: ContainerEdits | None = None, **kw: Any) -> Spec:
    device = Device(name=kw.pop("name", "gpu0"), container_edits=edits or ContainerEdits(env=["A=1"]))
    if "device_annotations" in kw:
        device.annotations = kw.pop("device_annotations")
    return Spec(kind=kw.pop("kind", "example.com/gpu"), devices=[device], **kw)


def test_known_versions_are_ordered_and_end_at_the_current_one() -> None:
    assert list(KNOWN_VERSIONS) == sorted(KNOWN_VERSIONS, key=version_key)
    assert CURRENT_VERSION == "1.1.0"
    assert {"0.3.0", "0.5.0", "0.8.0", "1.0.0"} <= set(KNOWN_VERSIONS)


def test_plain_spec_needs_the_earliest_supported_version() -> None:
    assert minimum_version(_spec()) == "0.3.0"


@pytest.mark.parametrize(
    "spec, expected",
    [
        (_spec(ContainerEdits(mounts=[Mount(host_path="/a", container_path="/a")])), "0.3.0"),
        (_spec(ContainerEdits(mounts=[Mount(host_path="/a", container_path="/a", type="bind")])), "0.4.0"),
        (_spec(ContainerEdits(device_nodes=[DeviceNode(path="/dev/x")])), "0.3.0"),
        (_spec(ContainerEdits(device_nodes=[DeviceNode(path="/dev/x", host_path="/dev/y")])), "0.5.0"),
        (_spec(name="0c1d2e-gpu-0"), "0.5.0"),
        (_spec(annotations={"a": "b"}), "0.6.0"),
        (_spec(device_annotations={"a": "b"}), "0.6.0"),
        (_spec(kind="example.com/gpu.claim"), "0.6.0"),
        (_spec(ContainerEdits(additional_gids=[44])), "0.7.0"),
        (_spec(ContainerEdits(intel_rdt=IntelRdt(clos_id="x"))), "0.7.0"),
        (_spec(ContainerEdits(intel_rdt=IntelRdt(schemata=["L3:0=f"]))), "1.1.0"),
        (_spec(ContainerEdits(intel_rdt=IntelRdt(enable_monitoring=True))), "1.1.0"),
        (
            _spec(ContainerEdits(net_devices=[LinuxNetDevice(host_interface_name="eth1", name="net1")])),
            "1.1.0",
        ),
    ],
)
def test_minimum_version_per_feature(spec: Spec, expected: str) -> None:
    assert minimum_version(spec) == expected


def test_spec_level_edits_count_too() -> None:
    spec = _spec(container_edits=ContainerEdits(device_nodes=[DeviceNode(path="/dev/x", host_path="/dev/y")]))
    assert minimum_version(spec) == "0.5.0"


def test_highest_feature_wins_and_is_named() -> None:
    spec = _spec(
        ContainerEdits(
            mounts=[Mount(host_path="/a", container_path="/a", type="bind")],
            additional_gids=[5],
        ),
        annotations={"k": "v"},
    )
    assert minimum_version(spec) == "0.7.0"
    assert features_needing(spec, "0.5.0") == ["spec annotations", "device 'gpu0': additionalGids"]
    assert features_needing(spec, "0.7.0") == []


def test_empty_collections_do_not_raise_the_version() -> None:
    spec = _spec(ContainerEdits(env=["A=1"], additional_gids=[], mounts=[]), annotations={})
    assert minimum_version(spec) == "0.3.0"


def test_bad_version_string_is_reported() -> None:
    with pytest.raises(CDIError, match=r"CDI version '1\.x' is invalid: expected MAJOR\.MINOR\.PATCH"):
        version_key("1.x")
    assert version_key("v0.5.0") == (0, 5, 0)
