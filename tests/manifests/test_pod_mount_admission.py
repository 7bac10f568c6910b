"""The pod mount policy refuses the pods of resource claims that mount volumes where the limiter takes its
word from (a ConfigMap with subPath at `<claims root>/000-forged/limits` is a read-only mount of its own, as
the agent's limits file is), and leaves every other pod alone. Its CEL runs here with a real CEL
implementation against pods shaped as the API server stores them."""

from __future__ import annotations

from typing import Any

import cel
import pytest
import yaml

from dra_gpu.allocator.cel_env import kubernetes_context
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.pod_mounts import CANONICAL_MESSAGE, MOUNT_MESSAGE

Obj = dict[str, Any]


def policy() -> Obj:
    docs = yaml.safe_load_all(render(load_values())["validatingadmissionpolicy.yaml"])
    return next(
        d
        for d in docs
        if d and d["metadata"]["name"] == "dra-gpu-pod-mounts" and d["kind"].endswith("Policy")
    )


def refusals(pod: Obj) -> list[str]:
    """The messages the API server would return for `pod` (none when no match condition holds)."""
    spec = policy()["spec"]
    context = kubernetes_context()
    context.add_variable("object", pod)
    if not all(cel.compile(c["expression"]).execute(context) is True for c in spec["matchConditions"]):
        return []
    variables: Obj = {}
    for variable in spec["variables"]:
        context.add_variable("variables", variables)
        variables[variable["name"]] = cel.compile(variable["expression"]).execute(context)
    context.add_variable("variables", variables)
    return [
        v["message"] for v in spec["validations"] if cel.compile(v["expression"]).execute(context) is not True
    ]


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
