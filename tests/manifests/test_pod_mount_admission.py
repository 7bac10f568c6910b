"""The pod mount policy refuses the pods of resource claims that mount volumes where the limiter takes its
word from (a ConfigMap with subPath at `<claims root>/000-forged/limits` is a read-only mount of its own, as
the agent's limits file is), and leaves every other pod alone. Its CEL runs here with a real CEL
implementation against pods shaped as the API server stores them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from policy_cel import refusals_in

from dra_gpu.allocator.cel_env import kubernetes_context
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.pod_mounts import CANONICAL_MESSAGE, MOUNT_MESSAGE, PROTECTED, spellings

Obj = dict[str, Any]


def policy(values: Path | None = None) -> Obj:
    docs = yaml.safe_load_all(render(load_values(values))["validatingadmissionpolicy.yaml"])
    return next(
        d
        for d in docs
        if d and d["metadata"]["name"] == "dra-gpu-pod-mounts" and d["kind"].endswith("Policy")
    )


def refusals(pod: Obj, values: Path | None = None) -> list[str]:
    """The messages the API server would return for `pod` (none when no match condition holds)."""
    spec = policy(values)["spec"]
    context = kubernetes_context()
    context.add_variable("object", pod)
    if not all(cel.compile(c["expression"]).execute(context) is True for c in spec["matchConditions"]):
        return []
    return refusals_in(context, spec)


def pod(*mounts: str, where: str = "containers", claims: bool = True) -> Obj:
    container: Obj = {"name": "app", "image": "app"}
    if mounts:
        container["volumeMounts"] = [
            {"name": f"v{i}", "mountPath": m, "subPath": "limits"} for i, m in enumerate(mounts)
        ]
    spec: Obj = {"containers": [{"name": "main", "image": "app"}]}
    spec.setdefault(where, []).append(container)
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": spec,
    }


@pytest.mark.parametrize("where", ["containers", "initContainers", "ephemeralContainers"])
@pytest.mark.parametrize(
    "path",
    [
        "/run/dra-gpu/claims/000-forged/limits",  # the ConfigMap a tenant would have count as limits
        "/run/dra-gpu/claims/000-forged/limiter/dragpu-limiter.region",
        "/run/dra-gpu",
        "/run/dra-gpu/",
        "run/dra-gpu/claims/x/limits",
        "/usr/local/lib/dra-gpu/libdragpu-limiter.so.1",
        "/etc/ld.so.preload",
    ],
)
def test_a_claims_pod_cannot_mount_where_the_limiter_reads(path: str, where: str) -> None:
    assert refusals(pod(path, where=where)) == [MOUNT_MESSAGE]


@pytest.mark.parametrize(
    "path",
    ["/run//dra-gpu/claims/x/limits", "/run/./dra-gpu/claims/x/limits", "/tmp/../run/dra-gpu", "/data/."],
)
def test_a_mount_path_not_in_canonical_form_is_refused(path: str) -> None:
    assert CANONICAL_MESSAGE in refusals(pod(path))


@pytest.mark.parametrize(
    "path",
    ["/run", "/run/secrets/app", "/run/dra-gpu-other", "/usr/local/lib", "/etc/ld.so.preload.d", "/data"],
)
def test_other_mounts_are_left_alone(path: str) -> None:
    assert refusals(pod(path)) == []


def test_a_pod_without_resource_claims_is_not_judged() -> None:
    assert refusals(pod("/run/dra-gpu/claims/x/limits", claims=False)) == []
    assert refusals(pod()) == []


# -- what the runtime will do: aliases, every volume type, block devices, extended resources ------------


@pytest.mark.parametrize(
    "path",
    [
        "/var/run/dra-gpu/claims/000-forged/limits",  # /var/run -> /run in a Debian or Ubuntu image
        "/var/run/dra-gpu",
        "var/run/dra-gpu/claims/x/limiter/dragpu-limiter.region",
    ],
)
def test_a_path_through_an_images_alias_is_refused_as_the_path_it_resolves_to(path: str) -> None:
    assert refusals(pod(path)) == [MOUNT_MESSAGE]


def test_every_alias_of_every_protected_path_is_refused() -> None:
    for protected in PROTECTED:
        for spelling in spellings(protected):
            assert refusals(pod(spelling + "/x")) == [MOUNT_MESSAGE], spelling
    assert refusals(pod("/var/run", "/var/run/secrets", "/lib/x86_64-linux-gnu")) == []


VOLUME_SOURCES: list[Obj] = [
    {"configMap": {"name": "forged"}},
    {"secret": {"secretName": "forged"}},
    {"emptyDir": {}},
    {"emptyDir": {"medium": "Memory"}},
    {"hostPath": {"path": "/tmp/forged"}},
    {"projected": {"sources": [{"configMap": {"name": "forged"}}]}},
    {"downwardAPI": {"items": [{"path": "limits", "fieldRef": {"fieldPath": "metadata.name"}}]}},
    {"persistentVolumeClaim": {"claimName": "forged"}},
    {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
    {"image": {"reference": "registry.example/forged:1", "pullPolicy": "IfNotPresent"}},
    {"csi": {"driver": "secrets-store.csi.k8s.io"}},
    {"nfs": {"server": "nfs.example", "path": "/forged"}},
]


@pytest.mark.parametrize("source", VOLUME_SOURCES, ids=lambda v: next(iter(v)))
@pytest.mark.parametrize("sub_path", [None, "limits"])
def test_every_volume_type_is_refused_over_a_claims_files(source: Obj, sub_path: str | None) -> None:
    mount: Obj = {"name": "forged", "mountPath": "/run/dra-gpu/claims/000-forged/limits", "readOnly": True}
    if sub_path:
        mount["subPath"] = sub_path
    forged = pod()
    forged["spec"]["volumes"] = [{"name": "forged", **source}]
    forged["spec"]["containers"][0]["volumeMounts"] = [mount]
    assert refusals(forged) == [MOUNT_MESSAGE]


def block_device(path: str) -> Obj:
    forged = pod()
    forged["spec"]["volumes"] = [{"name": "disk", "persistentVolumeClaim": {"claimName": "raw"}}]
    forged["spec"]["containers"][0]["volumeDevices"] = [{"name": "disk", "devicePath": path}]
    return forged


def test_a_block_device_cannot_be_put_over_a_claims_files() -> None:
    assert refusals(block_device("/run/dra-gpu/claims/000-forged/limits")) == [MOUNT_MESSAGE]
    assert refusals(block_device("/var/run/dra-gpu/claims/x/limits")) == [MOUNT_MESSAGE]
    assert refusals(block_device("/run//dra-gpu/claims/x/limits")) == [CANONICAL_MESSAGE]
    assert refusals(block_device("/dev/xvda")) == []


def extended(resource: str, where: str = "limits") -> Obj:
    forged = pod("/run/dra-gpu/claims/000-forged/limits", claims=False)
    forged["spec"]["containers"][1]["resources"] = {where: {resource: "1", "cpu": "1"}}
    return forged


@pytest.mark.parametrize("where", ["limits", "requests"])
def test_a_pod_reaching_a_class_through_an_extended_resource_is_judged(where: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("deviceClasses:\n  extendedResourceNames: {limiter.gpu.dra-gpu.io: dra-gpu.io/gpu}\n")
    assert refusals(extended("dra-gpu.io/gpu", where), values) == [MOUNT_MESSAGE]
    # the name every class has without being given one (DRAExtendedResource)
    implicit = "deviceclass.resource.kubernetes.io/limiter.gpu.dra-gpu.io"
    assert refusals(extended(implicit, where)) == [MOUNT_MESSAGE]
    assert refusals(extended("example.com/fpga", where), values) == []
