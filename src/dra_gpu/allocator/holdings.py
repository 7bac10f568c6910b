"""What allocated claims already hold, indexed per device so each allocation is cheap.

Counting follows the Kubernetes scheduler: a result with a `shareID` on a multi-allocatable device adds
its `consumedCapacity` to that device's total; any other result takes the whole device. Two deliberate
safety differences: a result on a device that is *not* multi-allocatable always takes it whole (even
with a `shareID`), and a share without `consumedCapacity` (a writer whose API server dropped it) is
counted as the capacity defaults rather than as nothing, and an unreadable or negative amount as the
whole capacity, so none of them can lead to over-commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.allocator.capacity import Amount, amount
from dra_gpu.allocator.pools import CounterKey, DeviceKey, Groups, Inventory, SetKey, compatible
from dra_gpu.kube import objects

UNLABELLED = None
"""The label value of a claim without the label; exclusion treats it as a value of its own."""


def claim_id(claim: Mapping[str, Any]) -> str:
    """How commit/release recognise a claim: its UID, else namespace/name."""
    uid = objects.uid(claim)
    return uid if uid else f"{objects.namespace(claim)}/{objects.name(claim)}"


@dataclass(slots=True)
class Hold:
    device: DeviceKey
    whole: bool
    consumed: tuple[Amount, ...]  # per capacity of the device (empty for whole holds)


@dataclass(slots=True)
class ClaimRecord:
    holds: list[Hold]
    labels: dict[str, str] = field(default_factory=dict)


def _recorded(value: Any, total: Amount) -> Amount:
    """A share's recorded amount; one that is unreadable or negative counts as the whole capacity."""
    try:
        parsed = amount(value)
    except ValueError:
        return total
    return parsed if parsed >= 0 else total


def _show(groups: Groups) -> str:
    return "(none)" if groups is None else "[" + ", ".join(sorted(groups)) + "]"


class Usage:
    """Per-device holders and consumed totals of committed claims.

    `listener(index)` is called after a device's usage changes (the allocator re-buckets it).
    """

    def __init__(self, inventory: Inventory, listener: Callable[[int], None] | None = None) -> None:
        self._inv = inventory
        self._listener = listener
        n = len(inventory.devices)
        self.whole: list[int] = [0] * n  # claims holding the device whole
        self.used: list[tuple[Amount, ...] | None] = [None] * n  # summed shares (None: no share)
        self.shares: list[int] = [0] * n
        self.holders: list[Counter[str]] = [Counter() for _ in range(n)]
        self.claims: dict[str, ClaimRecord] = {}
        self.label_devices: dict[tuple[str, str], Counter[int]] = {}
        self.counters_used: dict[CounterKey, Amount] = {}
        """Shared counters taken by allocated partitionable devices, across every slice of a pool."""
        self.groups_used: dict[SetKey, Counter[Groups]] = {}
        """Per counter set, the compatibility groups of the allocated devices consuming from it."""

    # --- queries ----------------------------------------------------------------------------------

    def counters_short(
        self,
        index: int,
        extra: Mapping[CounterKey, Amount] | None = None,
        extra_groups: Mapping[tuple[SetKey, Groups], int] | None = None,
    ) -> str:
        """Why the device's counters do not fit now ('' when they do): `set/counter needs n, m left`, or
        compatibility groups that do not meet those of a device in use on the same counter set (KEP-5963).
        `extra`/`extra_groups`: what a search has tentatively taken besides the committed claims."""
        device = self._inv.devices[index]
        for key, needed in device.counters:
            used = self.counters_used.get(key, 0) + (extra.get(key, 0) if extra else 0)
            total = self._inv.counters[key]
            if used + needed > total:
                return f'counter "{key[3]}" of set "{key[2]}": needs {needed}, {total - used} of {total} left'
        for set_key, mine in device.groups:
            theirs = [g for g, n in (self.groups_used.get(set_key) or {}).items() if n > 0]
            theirs += [g for (s, g), n in (extra_groups or {}).items() if s == set_key and n > 0]
            for other in theirs:
                if not compatible(mine, other):
                    return (
                        f'counter set "{set_key[2]}": compatibility groups {_show(mine)} do not meet '
                        f"{_show(other)} of a device allocated from it"
                    )
        return ""

    def idle(self, index: int) -> bool:
        return not self.holders[index]

    def label_values(self, index: int, key: str) -> set[str | None]:
        """The values of label `key` among the claims holding a device (None: a holder without it)."""
        return {self.claims[uid].labels.get(key, UNLABELLED) for uid in self.holders[index]}

    # --- updates ----------------------------------------------------------------------------------

    def add(self, uid: str, allocation: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        """Count an allocation (replacing what the same claim held before)."""
        self.remove(uid)
        holds: list[Hold] = []
        for result in objects.device_results(allocation):
            key = (result.driver, result.pool, result.device)
            dev = self._inv.by_key.get(key)
            if dev is None or result.admin_access:  # not ours to count, or admin access: holds nothing
                continue
            if dev.multi and result.share_id is not None:
                consumed_map = result.consumed
                if consumed_map is None:
                    consumed = tuple(s.consumed(None) for s in dev.specs)
                else:
                    consumed = tuple(_recorded(consumed_map.get(s.name, 0), s.value) for s in dev.specs)
                holds.append(Hold(key, False, consumed))
            else:
                holds.append(Hold(key, True, ()))
        record = ClaimRecord(holds, dict(labels))
        self.claims[uid] = record
        for hold in holds:
            self._apply(uid, record, hold, +1)

    def remove(self, uid: str) -> None:
        record = self.claims.pop(uid, None)
        if record is None:
            return
        for hold in record.holds:
            self._apply(uid, record, hold, -1)

    def _apply(self, uid: str, record: ClaimRecord, hold: Hold, sign: int) -> None:
        index = self._inv.by_key[hold.device].index
        if hold.whole:
            self.whole[index] += sign
        else:
            self.shares[index] += sign
            prev = self.used[index]
            if prev is None:
                prev = tuple(0 for _ in hold.consumed)
            new = tuple(a + sign * b for a, b in zip(prev, hold.consumed, strict=True))
            self.used[index] = new if self.shares[index] > 0 else None
        holders = self.holders[index]
        was_idle = not holders
        holders[uid] += sign
        if holders[uid] <= 0:
            del holders[uid]
        for item in record.labels.items():
            devices = self.label_devices.setdefault(item, Counter())
            devices[index] += sign
            if devices[index] <= 0:
                del devices[index]
        device = self._inv.devices[index]
        if device.counters and was_idle != (not holders):  # taken or given back: once per device
            for key, amount in device.counters:
                self.counters_used[key] = self.counters_used.get(key, 0) + sign * amount
            for set_key, groups in device.groups:
                held = self.groups_used.setdefault(set_key, Counter())
                held[groups] += sign
                if held[groups] <= 0:
                    del held[groups]
        if self._listener is not None:
            self._listener(index)
            if device.counters:  # every placement sharing these counters may fit or not now
                for counter_set in {key[:3] for key, _ in device.counters}:
                    for other in self._inv.counter_devices.get(counter_set, ()):
                        if other != index:
                            self._listener(other)
