"""The controller's placement section of a GpuConfig: how a class's claims spread over nodes and GPUs."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import field_validator

from dra_gpu.config.base import Strict, one_of


class PlacementPolicy(StrEnum):
    BIN_PACK = "BinPack"
    SPREAD = "Spread"


class Placement(Strict):
    """Cluster-controller placement for the class's claims (ignored by the kubelet plugin)."""

    policy: PlacementPolicy = PlacementPolicy.BIN_PACK
    affinityLabel: str | None = None
    antiAffinityLabel: str | None = None
    exclusionLabel: str | None = None

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: Any) -> Any:
        return one_of(PlacementPolicy, v, "placement policy")
