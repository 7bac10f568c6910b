"""Splitting a pool into slices and planning one reconcile, as Kubernetes' own publisher does.

The rules follow `k8s.io/dynamic-resource-allocation/resourceslice` (1.36): slices are named
`<index as >=5 hex digits>-<driver>-<node>-<random>` so that their order (which the allocator uses
for first fit) is the order we publish; existing slices with an older generation, or whose name does
not match a wanted index, are deleted first; the generation is bumped unless at most one existing
slice needs an update and none has to be created, so a consumer never mixes two versions of a pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_gpu.kube import objects
from dra_gpu.quantity import QuantityError, parse_quantity

Obj = dict[str, Any]

MAX_DEVICES_PER_SLICE = 64
"""The API allows 128 devices per slice, but only 64 once any device carries a taint (1.35+). A
tainted GPU must not reshuffle the pool, so every slice holds at most 64."""

MAX_COUNTER_SETS_PER_SLICE = 8
"""The 1.35+ limit of shared counter sets per slice (which then holds no devices)."""

INDEX_MIN_LENGTH = 5


def split_devices(devices: list[Obj], per_slice: int = MAX_DEVICES_PER_SLICE) -> list[list[Obj]]:
    """Consecutive chunks of at most `per_slice`; one empty slice for a node without GPUs.

    An empty slice still says "this driver runs here and has nothing", which differs from no pool.
    """
    if per_slice < 1:
        raise ValueError(f"devices per slice must be at least 1, got {per_slice}")
    return [devices[i : i + per_slice] for i in range(0, len(devices), per_slice)] or [[]]


def split_counter_sets(sets: list[Obj]) -> list[list[Obj]]:
    """Chunks of at most 8 sets (the 1.35+ limit per slice)."""
    step = MAX_COUNTER_SETS_PER_SLICE
    return [sets[i : i + step] for i in range(0, len(sets), step)]


def index_length(slice_count: int) -> int:
    return max(INDEX_MIN_LENGTH, len(f"{max(slice_count - 1, 0):x}"))


def generate_name(index: int, slice_count: int, driver: str, owner: str | None) -> str:
    prefix = f"{index:0{index_length(slice_count)}x}-{driver}-"
    return prefix + f"{owner}-" if owner else prefix


def decode_index(name: str, expected_length: int) -> int | None:
    head, sep, _ = name.partition("-")
    if not sep or len(head) != expected_length:
        return None
    try:
        return int(head, 16)
    except ValueError:
        return None


def _semantic(value: Any, key: str = "") -> Any:
    """Quantities compared by amount and taint times ignored, so a server's canonical forms match ours."""
    if isinstance(value, dict):
        return {k: _semantic(v, k) for k, v in value.items() if k != "timeAdded"}
    if isinstance(value, list):
        return [_semantic(v) for v in value]
    if key in ("value", "default", "min", "max", "step") and isinstance(value, (str, int)):
        try:
            amount: Fraction = parse_quantity(value)
        except QuantityError:
            return value
        return amount
    return value


def same_spec(a: Obj, b: Obj) -> bool:
    return bool(_semantic(a) == _semantic(b))


@dataclass
class PoolPlan:
    generation: int
    slice_count: int
    delete: list[Obj] = field(default_factory=list)
    update: dict[int, Obj] = field(default_factory=dict)
    """Index -> the existing slice to overwrite with the wanted spec."""
    create: list[int] = field(default_factory=list)
    keep: dict[int, Obj] = field(default_factory=dict)
    """Index -> an existing slice that already says what we want."""

    @property
    def writes(self) -> int:
        return len(self.delete) + len(self.update) + len(self.create)


def with_pool(spec: Obj, generation: int, slice_count: int) -> Obj:
    """`spec` with its `pool` generation and slice count set (the pool name is the caller's)."""
    pool = {**(spec.get("pool") or {}), "generation": generation, "resourceSliceCount": slice_count}
    return {**spec, "pool": pool}


def plan_pool(
    existing: list[Obj],
    wanted_specs: list[Obj],
    wanted_owner_references: list[Obj] | None = None,
) -> PoolPlan:
    """What to delete, update and create so that the pool holds exactly `wanted_specs`.

    `wanted_specs[i]` is the `spec` of slice i with `pool.name` set; `with_pool` fills in the
    planned generation and count. `existing` are this pool's slices as listed from the API server.
    `wanted_owner_references`, when known, also count as a difference (a Node that appeared late).
    """
    count = len(wanted_specs)
    length = index_length(count)
    generation = max((objects.pool_generation(s) for s in existing), default=0)
    plan = PoolPlan(generation=generation, slice_count=count)
    matched: dict[int, Obj] = {}
    for current in sorted(existing, key=objects.name):
        index = decode_index(objects.name(current), length)
        if (
            objects.pool_generation(current) < generation
            or index is None
            or not 0 <= index < count
            or index in matched
        ):
            plan.delete.append(current)
        else:
            matched[index] = current

    changed = set()
    for index, current in matched.items():
        owners_differ = wanted_owner_references is not None and (
            objects.owner_references(current) != wanted_owner_references
        )
        if owners_differ or not same_spec(
            objects.spec(current), with_pool(wanted_specs[index], generation, count)
        ):
            changed.add(index)

    plan.create = [i for i in range(count) if i not in matched]
    if plan.create or len(changed) > 1:
        plan.generation = generation + 1
        plan.update = dict(matched)
    else:
        plan.update = {i: matched[i] for i in changed}
    plan.keep = {i: s for i, s in matched.items() if i not in plan.update}
    return plan
