"""Builders for the API objects a user or a cluster would create: Nodes, claims, pods.

The demo creates them in the in-process API server; the controller's tests build their clusters with
them too, so both speak the same `resource.k8s.io/v1` and core/v1 shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    unschedulable: bool = False,
) -> Obj:
    spec: Obj = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def claim(
    name: str,
    device_class: str,
    *,
    namespace: str = "default",
    capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    count: int = 1,
    request: str = "gpu",
    selectors: Sequence[str] = (),
) -> Obj:
    """A ResourceClaim with one `exactly` request, as the API server stores it (defaults filled in).

    selectors: CEL expressions the device must match (`device.attributes[...]`).
    """
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    meta: Obj = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
    }


def pod(
    name: str,
    claims: Sequence[str],
    *,
    namespace: str = "default",
    node_name: str | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    node_selector: Mapping[str, str] | None = None,
    image: str = "busybox:1.36",
) -> Obj:
    """A pod whose one container uses each named claim (`spec.resourceClaims[].resourceClaimName`)."""
    refs = [{"name": f"claim-{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    spec: Obj = {
        "containers": [
            {"name": "main", "image": image, "resources": {"claims": [{"name": r["name"]} for r in refs]}}
        ],
        "resourceClaims": refs,
    }
    if node_name:
        spec["nodeName"] = node_name
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {"phase": "Pending"},
    }
