"""A ResourceClaim's `spec.devices` as the search needs it: requests, alternatives, constraints.

Checks here are the ones the API server would have made plus what this allocator does not support,
so a bad claim fails with a message naming the request instead of an odd search result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu.allocator.capacity import Amount, parse_requests
from dra_gpu.allocator.errors import AllocationError
from dra_gpu.allocator.index import CapKey, DeviceIndex, Group
from dra_gpu.allocator.pools import Device, lookup_attribute
from dra_gpu.kube import objects

MAX_RESULTS = 32
"""`AllocationResultsMaxSize`: devices in one allocation."""


@dataclass(slots=True)
class Alt:
    """One way to satisfy a request: the request itself, or one `firstAvailable` subrequest."""

    request: str
    sub: str | None
    class_name: str
    class_obj: Mapping[str, Any]
    mode: str  # ExactCount | All
    count: int
    selectors: tuple[str, ...]
    tolerations: list[dict[str, Any]]
    cap: CapKey
    group: Group
    admin: bool = False
    """`adminAccess`: the device is the request's whatever other claims hold of it, and it holds nothing."""

    @property
    def result_name(self) -> str:
        return f"{self.request}/{self.sub}" if self.sub else self.request

    @property
    def min_devices(self) -> int:
        return self.count if self.mode == "ExactCount" else 1

    @property
    def cap_requests(self) -> dict[str, Amount]:
        return dict(self.cap)


@dataclass(slots=True)
class Request:
    name: str
    alts: list[Alt]


class Constraint:
    """matchAttribute / distinctAttribute over the devices of the requests it names (all if none)."""

    def __init__(self, kind: str, attribute: str, requests: list[str]) -> None:
        self.kind = kind
        self.attribute = attribute
        self.requests = set(requests)
        self.values: list[Any] = []

    def applies(self, alt: Alt) -> bool:
        return not self.requests or alt.request in self.requests or alt.result_name in self.requests

    def add(self, alt: Alt, device: Device) -> bool:
        """Record the device if the constraint still holds with it (a device without the attribute
        never satisfies it); `remove` undoes a successful add."""
        if not self.applies(alt):
            return True
        value = lookup_attribute(device, self.attribute)
        if value is None:
            return False
        if self.values:
            if self.kind == "matchAttribute" and value != self.values[0]:
                return False
            if self.kind == "distinctAttribute" and value in self.values:
                return False
        self.values.append(value)
        return True

    def remove(self, alt: Alt) -> None:
        if self.applies(alt):
            self.values.pop()

    def describe(self) -> str:
        scope = f" over {', '.join(sorted(self.requests))}" if self.requests else ""
        return f"{self.kind} {self.attribute}{scope}"


def _alt(
    index: DeviceIndex,
    classes: Mapping[str, Mapping[str, Any]],
    request: str,
    choice: objects.DeviceChoice,
    where: str,
) -> Alt:
    class_name = choice.device_class
    if not class_name:
        raise AllocationError(f"{where}: deviceClassName is missing")
    class_obj = classes.get(class_name)
    if class_obj is None:
        raise AllocationError(f'{where}: device class "{class_name}" not found')
    mode = choice.allocation_mode or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise AllocationError(f"{where}: unknown allocationMode {mode!r}; allowed: ExactCount, All")
    raw_count = (1 if choice.count is None else choice.count) if mode == "ExactCount" else 0
    if isinstance(raw_count, bool) or not isinstance(raw_count, int):
        raise AllocationError(f"{where}: count must be an integer, got {raw_count!r}")
    count = raw_count
    if mode == "ExactCount" and count < 1:
        raise AllocationError(f"{where}: count must be at least 1, got {count}")
    for n, expr in enumerate(choice.selectors):
        if not expr:
            raise AllocationError(f"{where}: selector #{n} has no CEL expression")
    selectors = list(choice.selectors)
    try:
        cap = parse_requests(choice.capacity, where)
    except ValueError as exc:
        raise AllocationError(str(exc)) from None
    tolerations = [dict(t) for t in choice.tolerations]
    try:
        group = index.group(class_name, class_obj, tuple(selectors), tolerations)
    except AllocationError as exc:
        raise AllocationError(f"{where}: {exc}") from None
    return Alt(
        request=request,
        sub=choice.subrequest,
        class_name=class_name,
        class_obj=class_obj,
        mode=mode,
        count=count,
        selectors=tuple(selectors),
        tolerations=tolerations,
        cap=tuple(sorted(cap.items())),
        group=group,
        admin=choice.admin_access,
    )


def parse_claim(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], index: DeviceIndex
) -> tuple[list[Request], list[Constraint]]:
    """The claim's requests and constraints; AllocationError for anything that cannot be allocated."""
    requests: list[Request] = []
    names: set[str] = set()
    for n, raw in enumerate(objects.device_requests(claim)):
        name = raw.name
        if not name:
            raise AllocationError(f"request #{n} has no name")
        if name in names:
            raise AllocationError(f'request "{name}" is listed twice')
        names.add(name)
        if (raw.exactly is None) == (not raw.first_available):
            raise AllocationError(f'request "{name}": set exactly one of "exactly" and "firstAvailable"')
        if raw.exactly is not None:
            requests.append(Request(name, [_alt(index, classes, name, raw.exactly, f'request "{name}"')]))
            continue
        alts = []
        for sub in raw.first_available:
            names.add(sub.name)
            alts.append(_alt(index, classes, name, sub, f'request "{sub.name}"'))
        requests.append(Request(name, alts))
    least = sum(min(a.min_devices for a in r.alts) for r in requests)
    if least > MAX_RESULTS:
        raise AllocationError(f"asks for {least} devices, more than the {MAX_RESULTS} one claim can get")
    constraints = []
    for n, entry in enumerate(objects.device_constraints(claim)):
        listed = list(entry.requests)
        unknown = [r for r in listed if r not in names]
        if unknown:
            raise AllocationError(f"constraint #{n} names unknown request(s): {', '.join(unknown)}")
        if entry.match_attribute:
            constraints.append(Constraint("matchAttribute", entry.match_attribute, listed))
        elif entry.distinct_attribute:
            constraints.append(Constraint("distinctAttribute", entry.distinct_attribute, listed))
        else:
            raise AllocationError(f"constraint #{n}: neither matchAttribute nor distinctAttribute is set")
    return requests, constraints
