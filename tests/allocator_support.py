"""Builders for the allocator tests: small hand-made clusters in `resource.k8s.io/v1` JSON shape.

No tests here; the `test_allocator_*` modules import these so every cluster reads the same way.
"""

from __future__ import annotations

import itertools
from typing import Any

from dra_gpu.allocator import Allocator
from dra_gpu.kube import builders

DRIVER = "gpu.dra-gpu.io"
SHARED_CLASS = "limiter.gpu.dra-gpu.io"
WHOLE_CLASS = "gpu.dra-gpu.io"


def gpu(
    name: str,
    *,
    shared: bool = False,
    memory: str = "80Gi",
    cores: str = "100",
    policy: bool = True,
    attrs: dict[str, Any] | None = None,
    taints: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An H100-like device; `shared` makes it multi-allocatable with 1Gi / 1-core steps."""
    attributes: dict[str, Any] = {
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "sharing": {"string": "Limiter" if shared else "Exclusive"},
    }
    attributes.update(attrs or {})
    capacity: dict[str, Any] = {"memory": {"value": memory}, "cores": {"value": cores}}
    device: dict[str, Any] = {"name": name, "attributes": attributes, "capacity": capacity}
    if shared:
        device["allowMultipleAllocations"] = True
        if policy:
            capacity["memory"]["requestPolicy"] = {
                "default": memory,
                "validRange": {"min": "1Gi", "max": memory, "step": "1Gi"},
            }
            capacity["cores"]["requestPolicy"] = {
                "default": cores,
                "validRange": {"min": "1", "max": cores, "step": "1"},
            }
    if taints:
        device["taints"] = taints
    device.update(extra)
    return device


def node_slice(
    node: str | None,
    devices: list[dict[str, Any]],
    *,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    name: str | None = None,
    driver: str = DRIVER,
    **placement: Any,
) -> dict[str, Any]:
    """A slice of node `node` (None: pass `allNodes=True` or `nodeSelector=...` in `placement`)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or "cluster", "generation": generation, "resourceSliceCount": count},
        "devices": devices,
    }
    if node is not None:
        spec["nodeName"] = node
    spec.update(placement)
    return builders.resource_slice(spec, name=name or f"{pool or node or 'cluster'}-{driver}-{generation}")


def device_class(
    name: str, expression: str | None = None, config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return builders.device_class(name, [] if expression is None else [expression], config or [])


def sharing_class(name: str, sharing: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    expr = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].sharing == "{sharing}"'
    return device_class(name, expr, config)


def standard_classes(**configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The shared (Limiter) and whole-GPU classes of the real-cluster fixture."""
    return {
        SHARED_CLASS: sharing_class(SHARED_CLASS, "Limiter", configs.get("shared")),
        WHOLE_CLASS: sharing_class(WHOLE_CLASS, "Exclusive", configs.get("whole")),
    }


def request(
    name: str = "gpu",
    device_class: str = SHARED_CLASS,
    *,
    memory: str | None = None,
    cores: str | None = None,
    capacity: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A request with `exactly`; `fields` go into `exactly` (count, allocationMode, selectors...)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, **fields}
    caps = dict(capacity or {})
    if memory is not None:
        caps["memory"] = memory
    if cores is not None:
        caps["cores"] = cores
    if caps:
        exactly["capacity"] = {"requests": caps}
    return {"name": name, "exactly": exactly}


def selector(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def claim(
    name: str,
    *requests: dict[str, Any],
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    return builders.resource_claim(
        name,
        requests,
        namespace=namespace,
        labels=labels,
        configs=config or (),
        constraints=constraints or (),
        uid=f"uid-{namespace}-{name}",
    )


def opaque(params: dict[str, Any], driver: str = DRIVER, requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def make_allocator(
    slices: list[dict[str, Any]],
    classes: dict[str, dict[str, Any]] | None = None,
    allocated: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> Allocator:
    """An allocator with a fixed clock and numbered shareIDs, so results are predictable."""
    counter = itertools.count(1)
    kwargs.setdefault("now", lambda: "2026-01-02T03:04:05Z")
    kwargs.setdefault("new_uid", lambda: f"00000000-0000-4000-8000-{next(counter):012d}")
    return Allocator(
        slices, classes if classes is not None else standard_classes(), allocated or [], **kwargs
    )


def allocate_and_commit(alloc: Allocator, c: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Allocate, store the allocation in the claim as the controller would, commit; the allocation."""
    allocation = alloc.allocate(c, **kwargs)
    c.setdefault("status", {})["allocation"] = allocation
    alloc.commit(c)
    return allocation


def devices_of(allocation: dict[str, Any]) -> list[str]:
    """`pool/device` of every result, in order."""
    return [f"{r['pool']}/{r['device']}" for r in allocation["devices"]["results"]]
