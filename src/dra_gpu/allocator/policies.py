"""Placement: which of the GPUs that fit a request gets it.

Chosen per DeviceClass (`GpuConfig.placement`, see `placement_for_claim`):

- **BinPack** (the default of `Placement`): the GPU with the least capacity left after placement,
  GPUs that already hold shares before idle ones, so whole GPUs stay free for whole-GPU claims.
- **Spread**: the GPU with the most capacity left, so latency-sensitive services share with as little
  as possible.

Capacity left is the mean, over the device's capacities, of free/total after placement; a device that
is not multi-allocatable is taken whole, so nothing is left. Ties go to slice/device order.

Label rules use one claim label each (`metadata.labels[key]`):

- **affinity**: prefer a GPU already holding a claim with the same value (when it fits);
- **anti-affinity**: never a GPU holding a claim with the same value;
- **exclusion**: never a GPU holding a claim with a different value; a claim without the label counts
  as a value of its own, so unlabelled and labelled tenants do not mix either.

A claim without the affinity or anti-affinity label is not constrained by that rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.allocator.capacity import Amount
from dra_gpu.allocator.holdings import UNLABELLED, Usage
from dra_gpu.config import Placement, PlacementPolicy, parse_gpu_config
from dra_gpu.kube import objects

Score = tuple[float, ...]


def score(
    policy: PlacementPolicy | None,
    multi: bool,
    values: tuple[Amount, ...],
    used: tuple[Amount, ...] | None,
    idle: bool,
    consumed: tuple[Amount, ...],
) -> Score:
    """Sort key among devices that fit (lower is better); `()` for first fit."""
    if policy is None:
        return ()
    left = 0.0
    if multi and values:
        parts = []
        for i, total in enumerate(values):
            if total > 0:
                free = total - (used[i] if used is not None else 0) - consumed[i]
                parts.append(float(free / total))
        left = sum(parts) / len(parts) if parts else 0.0
    if policy == PlacementPolicy.SPREAD:
        return (-left,)
    return (1.0 if idle else 0.0, left)


@dataclass(frozen=True, slots=True)
class LabelRules:
    """The label rules of one placement, resolved against one claim's labels."""

    affinity: tuple[str, str] | None = None
    anti_affinity: tuple[str, str] | None = None
    exclusion: tuple[str, str | None] | None = None

    @classmethod
    def resolve(cls, placement: Placement | None, labels: Mapping[str, str]) -> LabelRules:
        if placement is None:
            return cls()
        aff = placement.affinityLabel
        anti = placement.antiAffinityLabel
        excl = placement.exclusionLabel
        return cls(
            affinity=(aff, labels[aff]) if aff and aff in labels else None,
            anti_affinity=(anti, labels[anti]) if anti and anti in labels else None,
            exclusion=(excl, labels.get(excl, UNLABELLED)) if excl else None,
        )

    @property
    def any(self) -> bool:
        return self.affinity is not None or self.anti_affinity is not None or self.exclusion is not None

    def blocks(self, usage: Usage, index: int) -> str | None:
        """Why a device may not take this claim, or None."""
        if self.anti_affinity is not None:
            key, value = self.anti_affinity
            if index in usage.label_devices.get((key, value), ()):
                return f"anti-affinity: holds a claim with {key}={value}"
        if self.exclusion is not None and not usage.idle(index):
            key, own = self.exclusion
            others = usage.label_values(index, key) - {own}
            if others:
                shown = ", ".join(
                    sorted(f"{key}={v}" if v is not None else f"no {key} label" for v in others)
                )
                return f"exclusion: holds a claim with {shown}"
        return None

    def prefers(self, usage: Usage, index: int) -> bool:
        if self.affinity is None:
            return False
        return index in usage.label_devices.get(self.affinity, ())


def placement_for_claim(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]
) -> Placement | None:
    """The placement configured on the DeviceClass of the claim's first request that has one.

    Reads the class's `spec.config[].opaque` entries for our driver. A class config that is not a
    valid GpuConfig raises `dra_gpu.config.ConfigError` naming the class.
    """
    for request in objects.device_requests(claim):
        names = [choice.device_class for choice in request.choices]
        for name in names:
            cls = classes.get(name)
            for entry in objects.class_configs(cls or {}):
                opaque = entry.get("opaque") or {}
                if opaque.get("driver") != DRIVER_NAME:
                    continue
                try:
                    config = parse_gpu_config(opaque.get("parameters"))
                except ValueError as exc:
                    raise type(exc)(f"DeviceClass {name}: {exc}") from None
                if config.placement is not None:
                    return config.placement
    return None
