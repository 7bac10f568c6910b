"""The allocator's public face: build it from cluster state, allocate, commit, release."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dra_gpu.allocator.errors import AllocationError
from dra_gpu.allocator.holdings import Usage, claim_id
from dra_gpu.allocator.index import DeviceIndex
from dra_gpu.allocator.policies import LabelRules
from dra_gpu.allocator.pools import Device, gather
from dra_gpu.allocator.requests import parse_claim
from dra_gpu.allocator.result import build_allocation
from dra_gpu.allocator.search import Search
from dra_gpu.allocator.taint_rules import apply_rules
from dra_gpu.config import Placement
from dra_gpu.kube import objects

__all__ = ["AllocationError", "AllocationInput", "Allocator"]


@dataclass
class AllocationInput:
    """Everything an allocation depends on, as the API server returns it."""

    slices: list[dict[str, Any]]
    classes: dict[str, dict[str, Any]]
    allocated_claims: list[dict[str, Any]] = field(default_factory=list)
    taint_rules: list[dict[str, Any]] = field(default_factory=list)


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_uid() -> str:
    return str(uuid.uuid4())


def claim_name(claim: Mapping[str, Any]) -> str:
    ns, name = objects.namespace(claim), objects.name(claim)
    return f"{ns}/{name}" if ns else name


class Allocator:
    """Allocates claims against a fixed set of ResourceSlices and DeviceClasses.

    `allocated_claims` (and later `commit`) say what is in use, whoever allocated it (claims without
    `status.allocation` are skipped, so the whole claim list may be passed); `allocate` never
    changes that, so the caller commits what it actually wrote. Build a new Allocator when slices or
    classes change. Not thread-safe.

    `taint_rules` are the cluster's DeviceTaintRules (`taint_rules`): their taints count as the slices' own.
    `resolve_qualified_names`: the cluster's scheduler resolves a request's `<driver>/<name>` capacity to the
    device's `<name>` (Kubernetes 1.38+, `kube.versions.resolves_qualified_capacity_names`); False looks
    names up verbatim, as 1.34-1.37 do.
    `driver_filter` limits the slices (and so the devices) to one driver; `now` and `new_uid` make
    `allocationTimestamp` and `shareID`s deterministic in tests.
    """

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        allocated_claims: Iterable[Mapping[str, Any]] = (),
        *,
        taint_rules: Iterable[Mapping[str, Any]] = (),
        driver_filter: str | None = None,
        resolve_qualified_names: bool = False,
        now: Callable[[], str] | None = None,
        new_uid: Callable[[], str] | None = None,
    ) -> None:
        if isinstance(classes, Mapping):
            self._classes: dict[str, Mapping[str, Any]] = dict(classes)
        else:
            self._classes = {str(objects.name(c)): c for c in classes}
        inventory = gather(slices, driver_filter)
        apply_rules(inventory.devices, taint_rules)
        self._index = DeviceIndex(inventory, resolve_qualified_names)
        self._now = now or _utc_now
        self._new_uid = new_uid or _new_uid
        for claim in allocated_claims:
            if objects.allocation(claim):
                self.commit(claim)

    @classmethod
    def from_input(cls, data: AllocationInput, **kwargs: Any) -> Allocator:
        return cls(data.slices, data.classes, data.allocated_claims, taint_rules=data.taint_rules, **kwargs)

    @property
    def devices(self) -> list[Device]:
        """Every usable device, in first-fit order."""
        return self._index.devices

    @property
    def usage(self) -> Usage:
        """What committed claims hold (read-only for callers)."""
        return self._index.usage

    def commit(self, claim_with_allocation: Mapping[str, Any]) -> None:
        """Count a claim's `status.allocation` as in use, replacing what the same claim held before.

        Claims are recognised by `metadata.uid`, else namespace/name. Results naming devices this
        allocator does not know (other drivers, pools left out) are ignored.
        """
        allocation = objects.allocation(claim_with_allocation)
        if not allocation:
            raise ValueError(f"claim {claim_name(claim_with_allocation)} has no status.allocation to commit")
        labels = objects.labels(claim_with_allocation)
        self._index.usage.add(claim_id(claim_with_allocation), allocation, labels)

    def release(self, claim: Mapping[str, Any]) -> None:
        """Forget what a claim holds (deallocated or deleted); unknown claims are ignored."""
        self._index.usage.remove(claim_id(claim))

    def allocate(
        self,
        claim: Mapping[str, Any],
        *,
        policy: Placement | None = None,
        node_filter: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """The `status.allocation` for `claim`, or AllocationError saying why there is none.

        `policy` orders the devices that fit (None: first fit, as the scheduler does) and adds its
        label rules; `node_filter` limits node-local devices to the nodes it accepts (devices of
        `allNodes` or `nodeSelector` slices are not filtered). Nothing is in use until `commit`.
        """
        name = claim_name(claim)
        if objects.allocation(claim):
            raise AllocationError(f"claim {name} is already allocated")
        try:
            requests, constraints = parse_claim(claim, self._classes, self._index)
            labels = objects.labels(claim)
            search = Search(
                self._index,
                requests,
                constraints,
                policy.policy if policy is not None else None,
                LabelRules.resolve(policy, labels),
                node_filter,
            )
            picks = search.run()
        except AllocationError as exc:
            raise AllocationError(f"claim {name}: {exc}", exc.reason) from None
        if picks is None:
            explanation = search.explain()
            raise AllocationError(f"cannot allocate claim {name}: {explanation}", search.reason())
        return build_allocation(claim, requests, picks, self._index.devices, self._now, self._new_uid)
