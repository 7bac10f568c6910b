"""Which devices a request may use, and which of them fit now, without scanning the cluster.

Three caches make allocation cheap on thousands of GPUs:

- each CEL expression is compiled once and its result per device kept (selectors never change);
- the devices a (class, request selectors, tolerations) combination may use form a `Group`, built once;
- inside a group, devices sit in buckets keyed by their usage state (`Sig`). All devices of a bucket
  fit a request, or none does, and score the same under a policy, so a one-device request looks at
  a few buckets instead of every GPU. `Usage` tells the index when a device's state changes.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu.allocator.capacity import Amount, CapacitySpec, consumption
from dra_gpu.allocator.cel_env import CelEnvironment, SelectorError
from dra_gpu.allocator.errors import AllocationError
from dra_gpu.allocator.holdings import Usage
from dra_gpu.allocator.policies import Score, score
from dra_gpu.allocator.pools import Device, Inventory
from dra_gpu.config import PlacementPolicy
from dra_gpu.kube import objects

CapKey = tuple[tuple[str, Amount], ...]
"""A request's `capacity.requests` as a sorted, hashable tuple."""

Sig = tuple[int, bool, bool, tuple[Amount, ...] | None, bool]
"""Bucket key: (spec_key, multi-allocatable, held whole, summed shares, idle)."""

CACHE_LIMIT = 500_000
"""Entries per fit/score cache before it starts over (usage states are many, but few are current)."""


@dataclass(slots=True)
class Group:
    """Devices that match a class and request selectors and whose taints are tolerated."""

    members: list[int]
    member_set: set[int]
    buckets: dict[Sig, list[int]]  # each sorted by device index
    sig_of: dict[int, Sig]
    visible: int  # devices seen (complete pools)
    class_mismatch: int
    request_mismatch: int
    tainted: list[tuple[int, str]]  # (device, taint) left out
    counters: list[int]  # devices left out because they consume shared counters


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' `ToleratesTaint`: empty key or effect match any; operator Equal (default) or Exists."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def blocking_taint(device: Device, tolerations: list[dict[str, Any]]) -> str | None:
    """The first NoSchedule/NoExecute taint none of the tolerations covers, as `key=value:Effect`."""
    for taint in device.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"{taint.get('key', '')}{value}:{taint.get('effect')}"
    return None


class DeviceIndex:
    """The devices, what is in use, and the caches over both."""

    def __init__(self, inventory: Inventory, resolve_qualified_names: bool = False) -> None:
        self.inventory = inventory
        self.devices = inventory.devices
        self._cel = CelEnvironment()
        self._cel_results: dict[str, list[bool | str | None]] = {}
        self._groups: dict[tuple[str, tuple[str, ...], str], Group | AllocationError] = {}
        self._device_groups: list[list[Group]] = [[] for _ in self.devices]
        self._specs: dict[int, tuple[CapacitySpec, ...]] = {d.spec_key: d.specs for d in self.devices}
        self._resolve: dict[int, str | None] = {
            d.spec_key: d.driver if resolve_qualified_names else None for d in self.devices
        }
        """Per spec key, the driver whose domain a request may name its capacities with (None: verbatim)."""
        self._consumption: dict[tuple[int, CapKey], tuple[Amount, ...] | str] = {}
        self._fit: dict[tuple[Sig, CapKey], bool] = {}
        self._score: dict[tuple[Sig, CapKey, PlacementPolicy | None], Score] = {}
        self.usage = Usage(inventory, self._rebucket)

    # --- usage buckets ----------------------------------------------------------------------------

    def sig(self, index: int) -> Sig:
        u = self.usage
        d = self.devices[index]
        # A partition whose shared counters are taken by another is as unavailable as one in use.
        blocked = bool(d.counters) and not u.holders[index] and bool(u.counters_short(index))
        return (d.spec_key, d.multi, u.whole[index] > 0 or blocked, u.used[index], not u.holders[index])

    def _rebucket(self, index: int) -> None:
        new = self.sig(index)
        for group in self._device_groups[index]:
            old = group.sig_of[index]
            if old == new:
                continue
            bucket = group.buckets[old]
            del bucket[bisect.bisect_left(bucket, index)]
            if not bucket:
                del group.buckets[old]
            bisect.insort(group.buckets.setdefault(new, []), index)
            group.sig_of[index] = new

    # --- selectors --------------------------------------------------------------------------------

    def _selector(self, expression: str, device: Device) -> bool:
        results = self._cel_results.get(expression)
        if results is None:
            results = self._cel_results[expression] = [None] * len(self.devices)
        hit = results[device.index]
        if hit is None:
            try:
                hit = self._cel.matches(expression, device.cel)
            except SelectorError as exc:
                hit = str(exc)
            results[device.index] = hit
        if isinstance(hit, str):
            raise SelectorError(hit)
        return hit

    def group(
        self,
        class_name: str,
        class_obj: Mapping[str, Any],
        selectors: tuple[str, ...],
        tolerations: list[dict[str, Any]],
    ) -> Group:
        """The (cached) group; AllocationError for a selector that does not compile or fails at runtime.

        As in Kubernetes, a CEL runtime error on any device fails the request instead of quietly
        skipping the device: guard optional attributes with `has()`.
        """
        key = (class_name, selectors, json.dumps(tolerations, sort_keys=True))
        hit = self._groups.get(key)
        if hit is None:
            try:
                hit = self._build(class_name, class_obj, selectors, tolerations)
            except AllocationError as exc:
                hit = exc
            self._groups[key] = hit
            if isinstance(hit, Group):
                for i in hit.members:
                    self._device_groups[i].append(hit)
        if isinstance(hit, AllocationError):
            raise hit
        return hit

    def _build(
        self,
        class_name: str,
        class_obj: Mapping[str, Any],
        selectors: tuple[str, ...],
        tolerations: list[dict[str, Any]],
    ) -> Group:
        class_selectors = tuple(objects.cel_expression(s) for s in objects.class_selectors(class_obj))
        stages = ((f'device class "{class_name}"', class_selectors), ("request", selectors))
        for where, exprs in stages:
            for n, expr in enumerate(exprs):
                try:
                    self._cel.compile(expr)
                except SelectorError as exc:
                    raise AllocationError(f"{where}: selector #{n}: {exc}") from None
        members: list[int] = []
        mismatch = [0, 0]
        tainted: list[tuple[int, str]] = []
        counters: list[int] = []
        for d in self.devices:
            failed_stage = None
            for stage, (where, exprs) in enumerate(stages):
                for n, expr in enumerate(exprs):
                    try:
                        matched = self._selector(expr, d)
                    except SelectorError as exc:
                        raise AllocationError(
                            f"{where}: selector #{n} on device {d.label}: CEL runtime error: {exc}"
                        ) from None
                    if not matched:
                        failed_stage = stage
                        break
                if failed_stage is not None:
                    break
            if failed_stage is not None:
                mismatch[failed_stage] += 1
                continue
            taint = blocking_taint(d, tolerations)
            if taint is not None:
                tainted.append((d.index, taint))
            else:
                members.append(d.index)
        buckets: dict[Sig, list[int]] = {}
        sig_of: dict[int, Sig] = {}
        for i in members:
            sig_of[i] = s = self.sig(i)
            buckets.setdefault(s, []).append(i)
        return Group(
            members=members,
            member_set=set(members),
            buckets=buckets,
            sig_of=sig_of,
            visible=len(self.devices),
            class_mismatch=mismatch[0],
            request_mismatch=mismatch[1],
            tainted=tainted,
            counters=counters,
        )

    # --- capacity ---------------------------------------------------------------------------------

    def consumed(self, device: Device, cap: CapKey) -> tuple[Amount, ...] | str:
        """What one share of the device takes for the request (or why it cannot serve it)."""
        return self._consumed_by_spec(device.spec_key, cap)

    def _consumed_by_spec(self, spec_key: int, cap: CapKey) -> tuple[Amount, ...] | str:
        key = (spec_key, cap)
        hit = self._consumption.get(key)
        if hit is None:
            hit = self._consumption[key] = consumption(
                self._specs[spec_key], dict(cap), self._resolve[spec_key]
            )
        return hit

    def sig_fits(self, sig: Sig, cap: CapKey) -> bool:
        """Whether a device in this state can take the request now."""
        key = (sig, cap)
        hit = self._fit.get(key)
        if hit is None:
            if len(self._fit) > CACHE_LIMIT:
                self._fit.clear()
            spec_key, multi, whole, used, idle = sig
            cons = self._consumed_by_spec(spec_key, cap)
            if isinstance(cons, str) or whole:
                hit = False
            elif not multi:
                hit = idle
            elif used is None:
                hit = True
            else:
                specs = self._specs[spec_key]
                hit = all(u + c <= s.value for u, c, s in zip(used, cons, specs, strict=True))
            self._fit[key] = hit
        return hit

    def sig_score(self, sig: Sig, cap: CapKey, policy: PlacementPolicy | None) -> Score:
        """The policy's preference for a device in this state (it must fit)."""
        key = (sig, cap, policy)
        hit = self._score.get(key)
        if hit is None:
            if len(self._score) > CACHE_LIMIT:
                self._score.clear()
            spec_key, multi, _whole, used, idle = sig
            cons = self._consumed_by_spec(spec_key, cap)
            assert not isinstance(cons, str)
            values = tuple(s.value for s in self._specs[spec_key])
            hit = self._score[key] = score(policy, multi, values, used, idle, cons)
        return hit
