"""The scheduler allocates claims of every class from our slices, shares GPUs by consumable capacity,
gives each pod its own claim from a template and lets two pods use one claim."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
from e2e_support import (
    Agent,
    Objects,
    attribute,
    claim_spec,
    node_devices,
    pin_device,
    results,
    unique,
    wait_for,
)

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import KubeAPI

SHARE = {"memory": "1Gi", "cores": "10"}
CLASSES = {
    "gpu.dra-gpu.io": None,
    "limiter.gpu.dra-gpu.io": SHARE,
    "timeslice.gpu.dra-gpu.io": SHARE,
    "mps.gpu.dra-gpu.io": SHARE,
}
MODE_OF_CLASS = {
    "gpu.dra-gpu.io": "Exclusive",
    "limiter.gpu.dra-gpu.io": "Shared",
    "timeslice.gpu.dra-gpu.io": "Shared",
    "mps.gpu.dra-gpu.io": "MPS",
}


def device_in_mode(api: KubeAPI, agent: Agent, mode: str) -> dict[str, Any]:
    for device in node_devices(api, agent.node):
        shareable = bool(device.get("allowMultipleAllocations"))
        if attribute(device, "sharing") == mode and shareable == (mode != "Exclusive"):
            return device
    pytest.skip(f"node {agent.node} has no GPU in mode {mode} (set E2E_SHARING or the agent's --sharing)")


@pytest.mark.parametrize("device_class", list(CLASSES))
def test_a_claim_of_each_class_is_allocated(
    api: KubeAPI, agent: Agent, objects: Objects, device_class: str
) -> None:
    device_in_mode(api, agent, MODE_OF_CLASS[device_class])
    name = unique(device_class.split(".")[0])
    objects.claim(name, claim_spec(device_class, CLASSES[device_class]))
    objects.pod(name, {"gpu": {"resourceClaimName": name}})
    (result,) = results(objects.allocated(name))
    assert (result["driver"], result["pool"]) == (DRIVER_NAME, agent.node)
    device = next(d for d in node_devices(api, agent.node) if d["name"] == result["device"])
    assert attribute(device, "sharing") == MODE_OF_CLASS[device_class]
    if CLASSES[device_class]:
        assert result.get("shareID"), "a share of a multi-allocatable GPU carries a shareID"
        assert result["consumedCapacity"]["cores"] == "10"


def test_two_limiter_claims_share_a_gpu_and_a_third_does_not_fit(
    api: KubeAPI, agent: Agent, objects: Objects
) -> None:
    device = device_in_mode(api, agent, "Shared")
    spec = claim_spec(
        "limiter.gpu.dra-gpu.io", {"memory": "1Gi", "cores": "40"}, [pin_device(attribute(device, "uuid"))]
    )
    names = [unique(n) for n in ("share-a", "share-b", "share-c")]
    for name in names[:2]:
        objects.claim(name, spec)
        objects.pod(name, {"gpu": {"resourceClaimName": name}})
    first, second = (results(objects.allocated(n))[0] for n in names[:2])
    assert first["device"] == second["device"] == device["name"]
    assert first["shareID"] != second["shareID"]
    assert first["consumedCapacity"]["cores"] == second["consumedCapacity"]["cores"] == "40"

    objects.claim(names[2], spec)  # 40 + 40 + 40 cores > 100
    objects.pod(names[2], {"gpu": {"resourceClaimName": names[2]}})

    def unschedulable() -> str | None:
        pod = objects.get("Pod", names[2])
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return str(condition.get("message") or condition.get("reason"))
        return None

    message = wait_for("the third pod to be reported unschedulable", unschedulable)
    time.sleep(5)  # and it stays so
    assert not (objects.get("ResourceClaim", names[2]).get("status") or {}).get("allocation"), message


def test_a_template_gives_each_pod_its_own_claim(api: KubeAPI, agent: Agent, objects: Objects) -> None:
    device_in_mode(api, agent, "Shared")
    template = unique("per-pod")
    objects.template(template, claim_spec("limiter.gpu.dra-gpu.io", {"memory": "512Mi", "cores": "5"}))
    pods = [unique("templated") for _ in range(2)]
    for pod in pods:
        objects.pod(pod, {"gpu": {"resourceClaimTemplateName": template}})

    def claim_of(pod: str) -> str | None:
        statuses = (objects.get("Pod", pod).get("status") or {}).get("resourceClaimStatuses") or []
        return next((str(s["resourceClaimName"]) for s in statuses if s.get("resourceClaimName")), None)

    claims = [wait_for(f"pod {p}'s generated claim", functools.partial(claim_of, p)) for p in pods]
    assert claims[0] != claims[1]
    for pod, claim_name in zip(pods, claims, strict=True):
        claim = objects.allocated(claim_name)
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
        (owner,) = claim["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Pod", pod)


def test_one_claim_serves_two_pods(api: KubeAPI, agent: Agent, objects: Objects) -> None:
    device_in_mode(api, agent, "Shared")
    name = unique("shared")
    objects.claim(name, claim_spec("limiter.gpu.dra-gpu.io", {"memory": "1Gi", "cores": "5"}))
    pods = [objects.pod(unique("user"), {"gpu": {"resourceClaimName": name}}) for _ in range(2)]
    uids = {p["metadata"]["uid"] for p in pods}

    def reserved() -> set[str] | None:
        status = objects.get("ResourceClaim", name).get("status") or {}
        found = {c["uid"] for c in status.get("reservedFor") or []}
        return found if found == uids else None

    wait_for("both pods in the claim's reservedFor", reserved)
    assert len(results(objects.get("ResourceClaim", name))) == 1
