"""Who holds which GPU: a plain model built from listed ResourceSlices, ResourceClaims and DeviceClasses.

No I/O here, so the same code runs on what a cluster returns and on recorded objects in tests. Rules
that a user would notice:

- Only the newest generation of each pool counts: while a node agent republishes, the older slices
  still exist, and their devices must not be shown twice or with stale capacity.
- A claim holds a GPU through each `status.allocation.devices.results` entry of our driver; a claim
  with results on two GPUs appears under both. Results of other drivers are not ours to show.
- A whole-GPU holder (no `consumedCapacity`) uses all of the GPU's capacity, so a GPU with a whole
  holder and anything else shows more used than it has (overcommitted) instead of hiding it.
- A result on a device that no current slice publishes (the node agent is gone, or republished
  without it) is still shown, on the node of the allocation, so that no holder goes missing.
- A claim whose opaque config is invalid is shown with the reason: it is exactly the claim the
  kubelet plugin refuses to prepare, so this is where an admin should see why.
- A limiter share's compute floor, ceiling and priority are read from the claim, as the node agent works
  them out at prepare (`plugin.claims.granted`: the claim's config within what its class grants, the floor
  its consumed `cores`), not from the agents' metrics: they are the claim's configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_gpu import CONTROLLER_FINALIZER, DRIVER_NAME, SCHEDULER_FINALIZER
from dra_gpu.config import ConfigError, GpuConfig, Priority, Strategy, merge_configs
from dra_gpu.controller.owned_classes import is_controller_managed
from dra_gpu.kube import objects
from dra_gpu.plugin.claims import granted
from dra_gpu.quantity import QuantityError, parse_quantity, to_int
from dra_gpu.vocabulary.device import CORES_CAPACITY, FULL_CORES, SHARING_ATTRIBUTE, UNHEALTHY_TAINT_KEY

Obj = Mapping[str, Any]

"""Added by kube-scheduler to every claim it allocates (Kubernetes 1.36)."""

BY_CONTROLLER, BY_SCHEDULER, BY_OTHER = "controller", "scheduler", "other"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    @property
    def unhealthy(self) -> bool:
        return self.key == UNHEALTHY_TAINT_KEY

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


@dataclass(frozen=True)
class Compute:
    """A limiter share's place in its GPU's compute arbitration, in percent of the GPU, as the node agent
    puts it on the GPU's board: `floor` guaranteed under contention, idle time borrowed up to `ceiling`,
    and the priority class."""

    floor: int
    ceiling: int
    priority: str


@dataclass
class Holder:
    """One allocation result of one claim on one GPU."""

    namespace: str
    name: str
    request: str
    consumed: dict[str, str]
    """`consumedCapacity` as the API server wrote it; empty when the claim has the whole GPU."""
    share_id: str | None
    strategy: str | None
    """The merged GpuConfig's sharing strategy; None when the config is invalid."""
    config_error: str | None
    pods: list[str]
    allocated_by: str
    """`controller` (our finalizer), `scheduler` (its delete-protection finalizer) or `other`."""
    compute: Compute | None = None
    """Its floor, ceiling and priority: a limiter share below the whole GPU's compute; None for any other."""

    @property
    def claim(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def whole(self) -> bool:
        return not self.consumed

    @property
    def strategy_text(self) -> str:
        return self.strategy if self.strategy is not None else f"invalid config: {self.config_error}"


@dataclass
class Gpu:
    node: str
    pool: str
    device: str
    uuid: str | None = None
    index: int | None = None
    sharing: str | None = None
    """The device's `sharing` attribute: what the node agent lets this GPU host."""
    shareable: bool = False
    published: bool = True
    """False when no current slice publishes the device that a claim holds."""
    capacity: dict[str, Fraction] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not any(t.unhealthy for t in self.taints)

    def used(self) -> dict[str, Fraction]:
        """Per capacity name, what the holders take; a whole-GPU holder takes all of it."""
        names = set(self.capacity)
        for holder in self.holders:
            names.update(holder.consumed)
        used = dict.fromkeys(sorted(names), Fraction(0))
        for holder in self.holders:
            for name in used:
                if holder.whole:
                    used[name] += self.capacity.get(name, Fraction(0))
                else:
                    used[name] += _amount(holder.consumed.get(name))
        return used

    def free(self) -> dict[str, Fraction]:
        used = self.used()
        return {name: total - used[name] for name, total in self.capacity.items()}

    @property
    def overcommitted(self) -> bool:
        return any(amount < 0 for amount in self.free().values())


@dataclass
class Node:
    name: str
    gpus: list[Gpu] = field(default_factory=list)


@dataclass
class PendingRequest:
    request: str
    device_class: str
    allocation_mode: str
    count: int
    capacity: dict[str, str]
    """`capacity.requests`; empty when the request asks for none (the class default: the whole GPU)."""


@dataclass
class Pending:
    """A claim of our driver's classes with no allocation yet."""

    namespace: str
    name: str
    requests: list[PendingRequest]
    allocator: str
    """Who is expected to allocate it: `controller` for controller-managed classes, else `scheduler`."""

    @property
    def claim(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Usage:
    driver: str
    node_filter: str | None
    nodes: list[Node]
    pending: list[Pending]


def _amount(text: Any) -> Fraction:
    """A consumed amount; the API server validates these, so anything unparseable counts as nothing."""
    if text is None:
        return Fraction(0)
    try:
        return parse_quantity(text)
    except QuantityError:
        return Fraction(0)


def _generation(slice_obj: Obj) -> int:
    try:
        return objects.pool_generation(slice_obj)
    except (TypeError, ValueError):
        return 0


def newest_slices(slices: Iterable[Obj], driver: str = DRIVER_NAME) -> list[Obj]:
    """The driver's slices of the highest generation in each pool (older ones are being replaced)."""
    ours = [s for s in slices if objects.slice_driver(s) == driver]
    newest: dict[str, int] = {}
    for s in ours:
        newest[objects.pool_name(s)] = max(newest.get(objects.pool_name(s), 0), _generation(s))
    return [s for s in ours if _generation(s) == newest[objects.pool_name(s)]]


def _slice_node(slice_obj: Obj) -> str:
    return objects.slice_node(slice_obj) or f"(pool {objects.pool_name(slice_obj)})"


def _attribute(device: Obj, name: str) -> Any:
    value = objects.device_attribute(device, name)
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _published_gpu(node: str, pool: str, device: Obj) -> Gpu:
    capacity = {}
    for name, entry in objects.device_capacity(device).items():
        capacity[name] = _amount(objects.capacity_value(entry))
    index = _attribute(device, "index")
    uuid = _attribute(device, "uuid")
    sharing = _attribute(device, SHARING_ATTRIBUTE)
    return Gpu(
        node=node,
        pool=pool,
        device=str(device.get("name", "")),
        uuid=str(uuid) if uuid is not None else None,
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        sharing=str(sharing) if sharing is not None else None,
        shareable=bool(device.get("allowMultipleAllocations")),
        capacity=capacity,
        taints=[
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in device.get("taints") or []
        ],
    )


def _allocated_by(claim: Obj) -> str:
    finalizers = objects.finalizers(claim)
    if CONTROLLER_FINALIZER in finalizers:
        return BY_CONTROLLER
    if SCHEDULER_FINALIZER in finalizers:
        return BY_SCHEDULER
    return BY_OTHER


def _consumers(claim: Obj) -> list[str]:
    """`status.reservedFor`: pods by name (same namespace as the claim), anything else as resource/name."""
    names = []
    for ref in objects.reserved_for(claim):
        resource, name = ref.get("resource", ""), ref.get("name", "")
        group = ref.get("apiGroup", "")
        names.append(name if resource == "pods" and not group else f"{resource}/{name}")
    return sorted(names)


def _strategy(configs: Sequence[Obj], request: str, driver: str) -> tuple[str | None, str | None]:
    try:
        return merge_configs(configs, request, driver).sharing.strategy.value, None
    except ConfigError as exc:
        return None, str(exc)


def compute_of(
    claim: Obj, configs: Sequence[Obj], request: str, consumed: Mapping[str, str], driver: str
) -> Compute | None:
    """The share's floor, ceiling and priority as the node agent gives them (None: not a limiter share on
    its GPU's board, or a config the agent refuses): the merged config within its class's grant, the floor
    its consumed `cores` rounded up (else the config's `cores`), the ceiling at least the floor and at most
    the whole GPU."""
    amounts = {name: _amount(value) for name, value in consumed.items()}
    choices = {c.name: c for r in objects.device_requests(claim) for c in r.choices}
    try:
        config: GpuConfig = merge_configs(configs, request, driver)
        if config.sharing.strategy != Strategy.LIMITER:
            return None
        from_class = [c for c in configs if c.get("source") == "FromClass"]
        class_config = merge_configs(from_class, request, driver) if from_class else None
        config = granted(config, class_config, choices.get(request), amounts, driver)
    except ConfigError:
        return None  # the agent refuses to prepare it: it has no place on a board
    limiter = config.sharing.limiter
    cores = amounts.get(CORES_CAPACITY, amounts.get(f"{driver}/{CORES_CAPACITY}"))
    floor = to_int(cores) if cores is not None else None
    if floor is None:
        floor = limiter.cores if limiter is not None and limiter.cores is not None else FULL_CORES
    if floor >= FULL_CORES:
        return None  # the whole GPU's compute: no board, nothing to borrow
    compute = limiter.compute if limiter is not None else None
    limit = compute.limit if compute is not None else None
    ceiling = floor if limit is None else min(max(limit, floor), FULL_CORES)
    return Compute(floor, ceiling, compute.priority.value if compute is not None else Priority.STANDARD.value)


class _ClassIndex:
    """Which DeviceClasses belong to our driver; by content when listed, else by our naming scheme."""

    def __init__(self, classes: Iterable[Obj], driver: str) -> None:
        self.driver = driver
        self.by_name = {objects.name(c): c for c in classes}

    def ours(self, name: str) -> bool:
        if name == self.driver or name.endswith("." + self.driver):
            return True
        device_class = self.by_name.get(name)
        if device_class is None:
            return False
        if any(objects.opaque_parameters(e)[0] == self.driver for e in objects.class_configs(device_class)):
            return True
        quoted = f'"{self.driver}"'
        return any(quoted in objects.cel_expression(s) for s in objects.class_selectors(device_class))

    def managed(self, name: str) -> bool:
        device_class = self.by_name.get(name)
        return device_class is not None and is_controller_managed(device_class)


def _pending_requests(claim: Obj, classes: _ClassIndex) -> list[PendingRequest]:
    found = []
    for request in objects.device_requests(claim):
        choices = ([request.exactly] if request.exactly else []) + list(request.first_available)
        for choice in choices:
            if not classes.ours(choice.device_class):
                continue
            found.append(
                PendingRequest(
                    request=choice.name,
                    device_class=choice.device_class,
                    allocation_mode=choice.allocation_mode or "ExactCount",
                    count=_count(choice.count),
                    capacity=dict(choice.capacity),
                )
            )
    return found


def _count(value: object) -> int:
    """A request's `count` as written, 1 when absent (the API's default)."""
    return int(value) if isinstance(value, int | float | str) and value else 1


def _sort_key(gpu: Gpu) -> tuple[bool, int, str]:
    return (gpu.index is None, gpu.index or 0, gpu.device)


def _place_holders(claim: Obj, allocation: Obj, gpus: dict[tuple[str, str], Gpu], driver: str) -> None:
    """Add one holder per result of `driver` to its GPU, creating an unpublished GPU when needed."""
    meta = objects.metadata(claim)
    configs = list(objects.allocation_config(allocation))
    pods, allocated_by = _consumers(claim), _allocated_by(claim)
    for result in objects.device_results(allocation):
        if result.driver != driver:
            continue
        pool, device = result.pool, result.device
        gpu = gpus.get((pool, device))
        if gpu is None:
            node = objects.allocation_node(allocation) or pool
            gpu = gpus[(pool, device)] = Gpu(node=node, pool=pool, device=device, published=False)
        request = result.request
        strategy, error = _strategy(configs, request, driver)
        consumed = dict(result.consumed or {})
        gpu.holders.append(
            Holder(
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                request=request,
                consumed=consumed,
                share_id=result.share_id,
                strategy=strategy,
                config_error=error,
                pods=list(pods),
                allocated_by=allocated_by,
                compute=compute_of(claim, configs, request, consumed, driver) if error is None else None,
            )
        )


def _claim_key(claim: Obj) -> tuple[str, str]:
    return objects.namespace(claim), objects.name(claim)


def collect(
    slices: Iterable[Obj],
    claims: Iterable[Obj],
    classes: Iterable[Obj] = (),
    *,
    node: str | None = None,
    driver: str = DRIVER_NAME,
) -> Usage:
    """Every GPU of `driver` with its holders, per node; and the claims still waiting for one.

    `node` keeps only that node's GPUs and leaves out pending claims, which belong to no node yet.
    """
    gpus: dict[tuple[str, str], Gpu] = {}
    for s in newest_slices(slices, driver):
        for device in objects.slice_devices(s):
            published = _published_gpu(_slice_node(s), objects.pool_name(s), device)
            gpus[(published.pool, published.device)] = published

    class_index = _ClassIndex(classes, driver)
    pending: list[Pending] = []
    for claim in sorted(claims, key=_claim_key):
        allocation = objects.allocation(claim)
        if allocation:
            _place_holders(claim, allocation, gpus, driver)
            continue
        requests = _pending_requests(claim, class_index)
        if requests:
            managed = any(class_index.managed(r.device_class) for r in requests)
            pending.append(Pending(*_claim_key(claim), requests, BY_CONTROLLER if managed else BY_SCHEDULER))

    nodes: dict[str, Node] = {}
    for gpu in sorted(gpus.values(), key=_sort_key):
        if node is None or gpu.node == node:
            nodes.setdefault(gpu.node, Node(gpu.node)).gpus.append(gpu)
    return Usage(
        driver=driver,
        node_filter=node,
        nodes=[nodes[n] for n in sorted(nodes)],
        pending=[] if node is not None else pending,
    )
