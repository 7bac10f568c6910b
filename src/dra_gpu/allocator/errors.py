"""The one error allocation raises, and the categories of why a device was refused.

Each category carries both the words the explanation shows and the short reason the controller's
failures metric counts, so that the metric never depends on the wording of a message.
"""

from __future__ import annotations

from enum import Enum


class Refusal(Enum):
    """Why a device did not serve a request; ordered from the most to the least telling."""

    NO_CAPACITY = ("without enough free capacity", "InsufficientCapacity")
    IN_USE = ("in use by another claim", "DevicesInUse")
    PLACEMENT = ("excluded by placement rules", "PlacementRules")
    NODE_FILTER = ("on nodes the node filter excludes", "NoEligibleNode")
    CAPACITY_REQUEST = ("cannot serve the capacity request", "CapacityRequestInvalid")
    TAINTED = ("tainted, not tolerated", "DevicesTainted")
    POOL_LEFT_OUT = ("in pools that are left out", "PoolUnusable")
    COUNTERS = ("overlap a partition already allocated (their shared counters are taken)", "Unsatisfiable")

    def __init__(self, phrase: str, reason: str) -> None:
        self.phrase = phrase
        self.reason = reason


UNSATISFIABLE = "Unsatisfiable"
"""The reason when no device category applies (e.g. no device matches the class at all)."""


def reason_of(refusals: set[Refusal]) -> str:
    """The most telling reason among the categories seen."""
    return next((r.reason for r in Refusal if r in refusals), UNSATISFIABLE)


class AllocationError(Exception):
    """The claim cannot be allocated now; the message names the request and what failed, `reason`
    is the short label for metrics."""

    def __init__(self, message: str, reason: str = UNSATISFIABLE) -> None:
        super().__init__(message)
        self.reason = reason
