"""Capacity names in the claim admission policy (`admission.py`): as the devices publish them (`memory`),
and, where every cluster of the install resolves them (Kubernetes 1.38+, the install's
`kubernetesMinVersion`), also with the driver's domain (`gpu.dra-gpu.io/memory`; kubernetes/kubernetes
PR #142202). The CEL fragments here let every rule of the policy read a request's capacity under either name.
"""

from __future__ import annotations

import json

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import versions
from dra_gpu.manifests.values import Values
from dra_gpu.vocabulary.device import CORES_CAPACITY, MEMORY_CAPACITY

QUALIFIED_MESSAGE = (
    f'a request of a {DRIVER_NAME} device class names a capacity with a domain (e.g. "{DRIVER_NAME}/memory"); '
    f"name it as the devices publish it, without the domain: capacity: {{requests: {{memory: 10Gi, cores: 25}}}} "
    f"(the scheduler of Kubernetes 1.34-1.37 looks the name up as written and would never allocate the claim)"
)

QUALIFIED_138_MESSAGE = (
    f'a request of a {DRIVER_NAME} device class names a capacity with a domain other than "{DRIVER_NAME}" '
    f"(which the scheduler never resolves to this driver's devices) or names one capacity twice, with and "
    f'without the domain: name it "memory" or "{DRIVER_NAME}/memory", once'
)

CAPACITY_NAMES = (MEMORY_CAPACITY, CORES_CAPACITY)
"""The capacities the driver's devices publish (`devicekinds/gpu.py`)."""


def resolves_qualified_names(values: Values) -> bool:
    """Whether every cluster of the install resolves `gpu.dra-gpu.io/<name>` (its `kubernetesMinVersion`)."""
    return versions.resolves_qualified_capacity_names(versions.parse_version(values.kubernetesMinVersion))


def in_requests(x: str, capacity: str, qualified: bool) -> str:
    """Request `x`'s capacity requests name `capacity` (also as `<driver>/<capacity>` where resolved)."""
    plain = f'"{capacity}" in {x}.capacity.requests'
    return f'({plain} || "{DRIVER_NAME}/{capacity}" in {x}.capacity.requests)' if qualified else f"({plain})"


def amount(x: str, capacity: str, qualified: bool) -> str:
    """The amount request `x` asks for of `capacity` (once it names it), under either name where resolved."""
    plain = f"{x}.capacity.requests.{capacity}"
    if not qualified:
        return plain
    return f'("{capacity}" in {x}.capacity.requests ? {plain} : {x}.capacity.requests["{DRIVER_NAME}/{capacity}"])'


def unqualified(x: str, ours: list[str], qualified: bool) -> str:
    guard = (
        f"!({x}.deviceClassName in {json.dumps(ours)}) || !has({x}.capacity) || !has({x}.capacity.requests)"
    )
    if not qualified:
        return f'{guard} || !{x}.capacity.requests.exists(n, n.contains("/"))'
    ours_qualified = [f"{DRIVER_NAME}/{c}" for c in CAPACITY_NAMES]
    once = " && ".join(
        f'!("{c}" in {x}.capacity.requests && "{DRIVER_NAME}/{c}" in {x}.capacity.requests)'
        for c in CAPACITY_NAMES
    )
    return (
        f'{guard} || (!{x}.capacity.requests.exists(n, n.contains("/") && !(n in {json.dumps(ours_qualified)})) '
        f"&& {once})"
    )
