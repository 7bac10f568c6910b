"""Consumable capacity: how much of a device one request consumes (KEP-5075, `DRAConsumableCapacity`).

Same rules as the Kubernetes structured allocator, so our allocations agree with the scheduler's:

- a capacity the request does not name consumes the policy's `default`, else the whole value;
- a named amount is rounded up: to `validRange.min` when below it, then to `min + n*step`; or to the
  first of `validValues` that is not smaller;
- the result must then satisfy the policy (at most `max`, on a step, one of `validValues`; the
  `default` is always allowed) and fit in the capacity's total value;
- a request naming a capacity the device does not have cannot use that device;
- where the scheduler resolves qualified names (Kubernetes 1.38+, kubernetes/kubernetes PR #142202;
  `resolve_names`), a request's `<driver>/<name>` is the device's `<name>` and a request's `<name>` its
  `<driver>/<name>`, the fully qualified name winning where a device publishes both; a request naming
  one capacity both ways cannot use the device (which amount counts is not defined).

Amounts are exact (`int` when whole, else `Fraction`), never floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_gpu.quantity import format_quantity, parse_quantity

Amount = int | Fraction


def amount(value: str | int | Fraction) -> Amount:
    """A quantity as an exact number; QuantityError for bad text."""
    q = parse_quantity(value)
    return int(q) if q.denominator == 1 else q


def fmt(value: Amount) -> str:
    return format_quantity(value)


@dataclass(frozen=True, slots=True)
class CapacitySpec:
    """One `capacity` entry of a device: its total value and request policy."""

    name: str
    value: Amount
    default: Amount | None = None
    valid_values: tuple[Amount, ...] = ()
    range_min: Amount | None = None
    range_max: Amount | None = None
    range_step: Amount | None = None

    @classmethod
    def parse(cls, name: str, entry: Mapping[str, Any]) -> CapacitySpec:
        policy = entry.get("requestPolicy") or {}
        rng = policy.get("validRange") or {}

        def opt(v: Any) -> Amount | None:
            return None if v is None else amount(v)

        return cls(
            name=name,
            value=amount(entry.get("value", 0)),
            default=opt(policy.get("default")),
            valid_values=tuple(amount(v) for v in policy.get("validValues") or ()),
            range_min=opt(rng.get("min")),
            range_max=opt(rng.get("max")),
            range_step=opt(rng.get("step")),
        )

    @property
    def has_range(self) -> bool:
        return self.range_min is not None

    def consumed(self, requested: Amount | None) -> Amount:
        """The amount one share takes for a request (None: the request does not name it)."""
        if requested is None:
            return self.default if self.default is not None else self.value
        if self.range_min is not None:
            if requested < self.range_min:
                return self.range_min
            step = self.range_step
            if step is None or step <= 0:
                return requested
            steps = -((self.range_min - requested) // step)  # ceil((requested - min) / step)
            return _norm(self.range_min + steps * step)
        if self.valid_values:
            for v in self.valid_values:
                if requested <= v:
                    return v
        return requested

    def violation(self, consumed: Amount) -> str | None:
        """Why the policy rejects an amount, or None."""
        if self.default is not None and consumed == self.default:
            return None
        if self.has_range:
            if self.range_max is not None and consumed > self.range_max:
                return f"more than the maximum {fmt(self.range_max)}"
            step = self.range_step
            base = self.range_min
            if step is not None and step > 0 and base is not None and (consumed - base) % step != 0:
                return f"not {fmt(base)} plus a multiple of {fmt(step)}"
            return None
        if self.valid_values and consumed not in self.valid_values:
            allowed = ", ".join(fmt(v) for v in self.valid_values)
            return f"larger than every valid value ({allowed})"
        return None


def _norm(v: Amount) -> Amount:
    if isinstance(v, Fraction) and v.denominator == 1:
        return int(v)
    return v


def resolved(names: set[str], requests: Mapping[str, Amount], driver: str) -> dict[str, Amount] | str:
    """`requests` under the names the device (of `driver`, publishing `names`) has, or why not (PR #142202)."""
    out: dict[str, Amount] = {}
    prefix = f"{driver}/"
    for name, value in requests.items():
        rest = name.removeprefix(prefix)
        if "/" not in name and prefix + name in names:
            target = prefix + name  # the fully qualified name wins
        elif name in names:
            target = name
        elif name.startswith(prefix) and rest in names:
            target = rest
        else:
            return f'has no capacity "{name}"'
        if target in out:
            return f'is asked for capacity "{rest}" twice, with and without the domain "{driver}"'
        out[target] = value
    return out


def consumption(
    specs: tuple[CapacitySpec, ...], requests: Mapping[str, Amount], resolve_names: str | None = None
) -> tuple[Amount, ...] | str:
    """Per-capacity amounts (in `specs` order) one share consumes, or why this device cannot serve.

    `resolve_names`: the device's driver, where requests may name its capacities with its domain.
    The totals check against what is already in use happens elsewhere; this only rejects what no
    amount of free capacity could fix.
    """
    names = {s.name for s in specs}
    if resolve_names is not None:
        mapped = resolved(names, requests, resolve_names)
        if isinstance(mapped, str):
            return mapped
        requests = mapped
    for name in requests:
        if name not in names:
            return f'has no capacity "{name}"'
    out: list[Amount] = []
    for spec in specs:
        requested = requests.get(spec.name)
        consumed = spec.consumed(requested)
        why = spec.violation(consumed)
        if why is not None:
            asked = fmt(requested) if requested is not None else "the default"
            return f'capacity "{spec.name}": {asked} rounds to {fmt(consumed)}, {why}'
        if consumed > spec.value:
            return f'capacity "{spec.name}": needs {fmt(consumed)}, the device has {fmt(spec.value)}'
        out.append(consumed)
    return tuple(out)


def parse_requests(requests: Mapping[str, Any], where: str) -> dict[str, Amount]:
    """`capacity.requests` of a request as exact amounts; ValueError naming the bad entry."""
    out: dict[str, Amount] = {}
    for name, value in requests.items():
        try:
            parsed = amount(value)
        except ValueError as exc:
            raise ValueError(f'{where}: capacity request "{name}": {exc}') from None
        if parsed < 0:
            raise ValueError(f'{where}: capacity request "{name}" is negative ({value!r})')
        out[name] = parsed
    return out
