"""Noticing fields an API server silently dropped from a slice we wrote.

An API server whose feature gate is off accepts the object and returns it without the gated fields
(`tests/fixtures/k8s-1.36-real/slice-returned-with-DRAConsumableCapacity-off.json`), with no error. Only
comparing what was sent with what came back tells the publisher that shared devices or taints are not
available on this cluster, so that it can publish what the cluster does understand instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra_gpu.kube import objects, versions

Obj = dict[str, Any]

CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DEVICE_TAINTS = "DRADeviceTaints"
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
COMPATIBILITY_GROUPS = versions.COMPATIBILITY_GROUPS
"""KEP-5963: `consumesCounters[].compatibilityGroups` (alpha 1.37, beta planned 1.38)."""
SHARED_CONSUMABLE_CAPACITY = versions.SHARED_CONSUMABLE_CAPACITY
"""KEP-5941: `sharedCounters[].counters[].requestPolicy`, `consumesCounters[].counters[].valueFrom` (alpha
planned 1.38)."""


@dataclass
class DroppedFields:
    """Which feature gates look disabled, and every path that went missing (for the log)."""

    features: set[str] = field(default_factory=set)
    paths: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.paths)

    def describe(self) -> str:
        features = ", ".join(sorted(self.features)) or "unknown"
        shown = ", ".join(self.paths[:5]) + (
            f" and {len(self.paths) - 5} more" if len(self.paths) > 5 else ""
        )
        return f"the API server dropped {shown}; feature gates that look disabled: {features}"


def _missing(sent: Any, returned: Any, path: str, out: list[str]) -> None:
    if isinstance(sent, dict):
        if not isinstance(returned, dict):
            out.append(path)
            return
        for key, value in sent.items():
            if value is None:
                continue
            if key not in returned:
                out.append(f"{path}.{key}")
            else:
                _missing(value, returned[key], f"{path}.{key}", out)
    elif isinstance(sent, list) and isinstance(returned, list):
        if len(returned) < len(sent):
            out.append(f"{path}[{len(returned)}:]")
        for i, (a, b) in enumerate(zip(sent, returned, strict=False)):
            _missing(a, b, f"{path}[{i}]", out)


def dropped_fields(sent: Obj, returned: Obj) -> DroppedFields:
    """Fields of the `spec` sent absent from the `spec` returned, grouped by the gate that drops them."""
    result = DroppedFields()
    _missing(objects.spec(sent), objects.spec(returned), "spec", result.paths)
    for path in result.paths:
        if path.endswith(".compatibilityGroups"):
            result.features.add(COMPATIBILITY_GROUPS)
        elif path.endswith(".valueFrom") or (
            path.startswith("spec.sharedCounters") and path.endswith(".requestPolicy")
        ):
            result.features.add(SHARED_CONSUMABLE_CAPACITY)
        elif path.endswith(".allowMultipleAllocations") or path.endswith(".requestPolicy"):
            result.features.add(CONSUMABLE_CAPACITY)
        elif path.endswith(".taints") or ".taints[" in path:
            result.features.add(DEVICE_TAINTS)
        elif any(f".{name}" in path for name in ("sharedCounters", "consumesCounters")):
            result.features.add(PARTITIONABLE_DEVICES)
    return result
