"""Which DeviceClasses the controller allocates, and how the scheduler is kept away from them.

The kube-scheduler allocates every claim it can: it evaluates the class's CEL selectors against the
published devices and takes the first fit. A controller-managed class therefore carries one extra
selector, `MANAGED_SELECTOR`, that requires an attribute no device ever publishes. The scheduler finds
no device for such a claim and leaves the pod pending ("cannot allocate all claims"); the selector
evaluates to a plain `false` (guarded by `has()`), never to a CEL error, so the scheduler keeps retrying
instead of reporting an error. The controller recognises the marker, evaluates the class without it,
and writes `status.allocation`; the scheduler then treats the claim as allocated (it never checks who
allocated it) and binds the pod to the allocation's node.

The marker is both the switch and the guard: a class is controller-managed exactly when it carries the
marker, so there is no state in which both allocators think a claim is theirs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.allocator import placement_for_claim
from dra_gpu.config import Placement
from dra_gpu.kube import builders, objects

Obj = dict[str, Any]

MANAGED_ATTRIBUTE = "controllerManaged"
"""The attribute the marker requires. The node agent must never publish it."""

MANAGED_EXPRESSION = f'has(device.attributes["{DRIVER_NAME}"].{MANAGED_ATTRIBUTE})'
"""CEL that is false for every device, so the scheduler can never allocate the class's claims."""

MANAGED_SELECTOR: Obj = {"cel": {"expression": MANAGED_EXPRESSION}}
"""The selector to append to a DeviceClass's `spec.selectors` to hand its claims to the controller."""

_SPACE = re.compile(r"\s+")


def _normalised(expression: str) -> str:
    return _SPACE.sub("", expression)


def _is_marker(selector: Mapping[str, Any]) -> bool:
    return _normalised(objects.cel_expression(selector)) == _normalised(MANAGED_EXPRESSION)


def is_controller_managed(device_class: Mapping[str, Any]) -> bool:
    return any(_is_marker(s) for s in objects.class_selectors(device_class))


def without_marker(device_class: Mapping[str, Any]) -> Obj:
    """The class as the controller evaluates it: the same selectors and config, minus the marker."""
    kept = [s for s in objects.class_selectors(device_class) if not _is_marker(s)]
    return builders.with_selectors(device_class, kept)


def requested_classes(claim: Mapping[str, Any]) -> list[str]:
    """Every class a claim's requests name, in request order (subrequests of firstAvailable included)."""
    names: list[str] = []
    for request in objects.device_requests(claim):
        choices = ([request.exactly] if request.exactly else []) + list(request.first_available)
        names += [choice.device_class for choice in choices if choice.device_class]
    return names


class ClassIndex:
    """The cluster's DeviceClasses split into what the allocator sees and which ones are ours."""

    def __init__(self, classes: list[Obj]) -> None:
        self.raw: dict[str, Obj] = {objects.name(c): c for c in classes}
        self.managed: set[str] = {n for n, c in self.raw.items() if is_controller_managed(c)}
        self.for_allocator: dict[str, Obj] = {
            n: without_marker(c) if n in self.managed else c for n, c in self.raw.items()
        }

    def managed_classes_of(self, claim: Mapping[str, Any]) -> list[str]:
        return [n for n in requested_classes(claim) if n in self.managed]

    def placement_for(self, claim: Mapping[str, Any]) -> Placement | None:
        """The placement set in the claim's controller-managed classes (ConfigError if one is invalid).

        Only classes decide placement: a claim's own config cannot, or a user could opt out of the
        anti-affinity or exclusion an admin set up for tenant separation.
        """
        return placement_for_claim(claim, {n: self.raw[n] for n in self.managed})


def with_marker(device_class: Mapping[str, Any]) -> Obj:
    """The class with the marker appended (unchanged if it has it): hands its claims to the controller."""
    if is_controller_managed(device_class):
        return copy.deepcopy(dict(device_class))
    return builders.with_selectors(device_class, [*objects.class_selectors(device_class), MANAGED_SELECTOR])
