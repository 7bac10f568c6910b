"""ResourceSlices to the flat, ordered device list the allocator searches.

Like Kubernetes' `GatherPools`: per (driver, pool) only the slices of the highest `pool.generation`
count, and only when they all state the same `resourceSliceCount` and exactly that many are present
(Kubernetes' `poolIsIncomplete`); a pool with two devices, or two counter sets, of the same name is
invalid. Unlike the
scheduler, which still takes single devices from an incomplete pool, the allocator waits for the
pool to be complete. Devices are ordered by pool (driver, name), slice name, then position in the slice,
which is the order first-fit allocation follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.allocator.capacity import Amount, CapacitySpec
from dra_gpu.allocator.cel_env import device_variable
from dra_gpu.kube import objects
from dra_gpu.quantity import QuantityError, parse_quantity

CounterKey = tuple[str, str, str, str]
"""(driver, pool, counter set, counter): one shared counter of a partitionable pool."""

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how results and the usage index name a GPU."""

SetKey = tuple[str, str, str]
"""(driver, pool, counter set): a pool's counter set."""

Groups = frozenset[str] | None
"""KEP-5963 compatibility groups of one counter consumption; None where the entry names none."""


@dataclass(slots=True, eq=False)
class Device:
    index: int
    driver: str
    pool: str
    name: str
    slice_name: str
    node: str | None  # node-local devices: the node's name
    node_selector: dict[str, Any] | None  # devices of slices with a nodeSelector
    multi: bool  # allowMultipleAllocations
    specs: tuple[CapacitySpec, ...]
    spec_key: int  # same for devices of one driver with identical capacities and policies
    attributes: dict[str, Any]
    cel: dict[str, Any]
    taints: tuple[dict[str, Any], ...]
    consumes_counters: bool
    binding_conditions: tuple[str, ...]
    binding_failure_conditions: tuple[str, ...]
    counters: tuple[tuple[CounterKey, Amount], ...] = ()
    """What the device takes from its pool's shared counters while allocated."""
    groups: tuple[tuple[SetKey, Groups], ...] = ()
    """Per counter set it consumes from, its compatibility groups (KEP-5963, `compatibilityGroups`)."""

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"

    @property
    def capacity_values(self) -> tuple[Amount, ...]:
        return tuple(s.value for s in self.specs)


@dataclass(slots=True)
class PoolProblem:
    """A pool whose devices are left out, and why (shown when an allocation fails)."""

    driver: str
    pool: str
    why: str


@dataclass(slots=True)
class Inventory:
    devices: list[Device] = field(default_factory=list)
    by_key: dict[DeviceKey, Device] = field(default_factory=dict)
    problems: list[PoolProblem] = field(default_factory=list)
    counters: dict[CounterKey, Amount] = field(default_factory=dict)
    """Every shared counter of the usable pools and its total."""
    counter_devices: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    """(driver, pool, counter set) -> the devices that consume from it."""


def _slice_placement(spec: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    node = spec.get("nodeName") or None
    selector = spec.get("nodeSelector") if not node else None
    return node, selector


def gather(slices: Iterable[Mapping[str, Any]], driver_filter: str | None = None) -> Inventory:
    """Parse the slices; pools that are incomplete or invalid go to `problems`, not `devices`."""
    pools: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        driver = objects.slice_driver(s)
        if driver_filter is not None and driver != driver_filter:
            continue
        pools.setdefault((driver, objects.pool_name(s)), []).append(s)

    inv = Inventory()
    spec_keys: dict[tuple[str, tuple[CapacitySpec, ...]], int] = {}  # per driver: names resolve per driver
    for (driver, pool), members in sorted(pools.items()):
        generation = max(objects.pool_generation(m) for m in members)
        current = [m for m in members if objects.pool_generation(m) == generation]
        counts = {objects.pool_slice_count(m) for m in current}
        if counts != {len(current)}:  # as Kubernetes' poolIsIncomplete: all agree, and all are there
            want = " or ".join(str(c) for c in sorted(counts))
            inv.problems.append(
                PoolProblem(
                    driver, pool, f"incomplete: {len(current)} of {want} slices at generation {generation}"
                )
            )
            continue
        current.sort(key=lambda m: str(objects.name(m)))
        names: set[str] = set()
        parsed: list[Device] = []
        problem = None
        pool_counters: dict[CounterKey, Amount] = {}
        set_names: set[str] = set()
        for m in current:  # the counter sets first: a device may consume from another slice's set
            for declared in objects.shared_counters(m):
                set_name = str(declared.get("name", ""))
                if set_name in set_names:  # the scheduler's "duplicate counter set name"
                    problem = f'invalid: counter set "{set_name}" is listed twice'
                set_names.add(set_name)
                for cname, counter in (declared.get("counters") or {}).items():
                    key = (driver, pool, str(declared.get("name", "")), str(cname))
                    try:
                        pool_counters[key] = _amount((counter or {}).get("value", 0))
                    except QuantityError as exc:
                        problem = f'invalid: counter "{cname}": {exc}'
        for m in current:
            slice_name = str(objects.name(m))
            slice_node, slice_selector = _slice_placement(objects.spec(m))
            per_device = objects.per_device_node_selection(m)
            for raw in objects.slice_devices(m):
                name = raw.get("name", "")
                if name in names:
                    problem = f'invalid: device "{name}" is listed twice'
                    break
                names.add(name)
                node, selector = _slice_placement(raw) if per_device else (slice_node, slice_selector)
                try:
                    specs = tuple(
                        CapacitySpec.parse(cname, centry or {})
                        for cname, centry in sorted(objects.device_capacity(raw).items())
                    )
                    cel_var = device_variable(driver, raw)
                    counters = _consumption(driver, pool, raw, pool_counters)
                    groups = _groups(driver, pool, raw)
                except (QuantityError, ValueError) as exc:
                    problem = f'invalid: device "{name}": {exc}'
                    break
                parsed.append(
                    Device(
                        index=-1,
                        driver=driver,
                        pool=pool,
                        name=name,
                        slice_name=slice_name,
                        node=node,
                        node_selector=selector,
                        multi=bool(raw.get("allowMultipleAllocations", False)),
                        specs=specs,
                        spec_key=spec_keys.setdefault((driver, specs), len(spec_keys)),
                        attributes=dict(raw.get("attributes") or {}),
                        cel=cel_var,
                        taints=tuple(raw.get("taints") or ()),
                        consumes_counters=bool(raw.get("consumesCounters")),
                        binding_conditions=tuple(raw.get("bindingConditions") or ()),
                        binding_failure_conditions=tuple(raw.get("bindingFailureConditions") or ()),
                        counters=counters,
                        groups=groups,
                    )
                )
            if problem:
                break
        if problem:
            inv.problems.append(PoolProblem(driver, pool, problem))
            continue
        inv.counters.update(pool_counters)
        for d in parsed:
            d.index = len(inv.devices)
            inv.devices.append(d)
            inv.by_key[d.key] = d
            for counter_set in {key[2] for key, _ in d.counters}:
                inv.counter_devices.setdefault((driver, pool, counter_set), []).append(d.index)
    return inv


def _amount(value: Any) -> Amount:
    amount = parse_quantity(value)
    return int(amount) if amount.denominator == 1 else amount


def _consumption(
    driver: str, pool: str, raw: Mapping[str, Any], pool_counters: Mapping[CounterKey, Amount]
) -> tuple[tuple[CounterKey, Amount], ...]:
    """A device's consumesCounters; a set or counter the pool does not publish makes it invalid."""
    taken: list[tuple[CounterKey, Amount]] = []
    for entry in raw.get("consumesCounters") or []:
        set_name = str(entry.get("counterSet", ""))
        for cname, counter in (entry.get("counters") or {}).items():
            key = (driver, pool, set_name, str(cname))
            if key not in pool_counters:
                raise ValueError(
                    f'consumes counter "{cname}" of counter set "{set_name}", which the pool does not have'
                )
            taken.append((key, _amount((counter or {}).get("value", 0))))
    return tuple(taken)


def _groups(driver: str, pool: str, raw: Mapping[str, Any]) -> tuple[tuple[SetKey, Groups], ...]:
    """The compatibility groups of each counter consumption (a server without DRADeviceCompatibilityGroups
    drops the field, so a device whose entries name none is what such a server stores)."""
    out: list[tuple[SetKey, Groups]] = []
    for entry in raw.get("consumesCounters") or []:
        named = entry.get("compatibilityGroups")
        groups = frozenset(str(g) for g in named) if isinstance(named, list) else None
        out.append(((driver, pool, str(entry.get("counterSet", ""))), groups))
    return tuple(out)


def compatible(mine: Groups, theirs: Groups) -> bool:
    """KEP-5963: two devices consuming one counter set are allocated together only where neither names
    groups or their groups intersect (one naming groups never goes beside one naming none)."""
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return bool(mine & theirs)


def lookup_attribute(device: Device, name: str) -> Any:
    """The value of a fully qualified attribute (`domain/name`), as Kubernetes' constraints see it.

    A name in the driver's own domain also finds the bare attribute. Returns None when absent; list
    attributes come back as tuples so they compare by value.
    """
    attr = device.attributes.get(name)
    if attr is None:
        domain, sep, ident = name.partition("/")
        if sep and domain == device.driver:
            attr = device.attributes.get(ident)
    if not attr:
        return None
    for k in ("int", "bool", "string", "version"):
        if k in attr:
            return (k, attr[k])
    for k in ("ints", "bools", "strings", "versions"):
        if k in attr:
            return (k, tuple(attr[k]))
    return None
