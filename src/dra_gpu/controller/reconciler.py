"""One reconcile pass: allocate waiting claims of controller-managed classes, release finished ones.

The pass works on a snapshot of the cluster (slices, classes, claims, pods, nodes). It builds one
Allocator that counts every allocated claim, whoever allocated it (the scheduler included), releases
first so freed capacity is usable in the same pass, then allocates waiting claims oldest first, each
committed to the allocator before the next one is placed.

Writes follow what the API server and the scheduler require (`reference/dra-protocol.md` §2.7):
our finalizer goes on before `status.allocation` is written, because Kubernetes' claim controller only
deallocates claims that carry its own finalizer; the allocation carries `allocationTimestamp` (without
it the scheduler's PreBind fails forever) and a `nodeSelector` naming the node. Every write carries the
resourceVersion it read; on a 409 the claim is read again and the decision is made again on what came
back, so a claim that the scheduler reserved or someone deleted in the meantime is never clobbered.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dra_gpu import CONTROLLER_FINALIZER
from dra_gpu.allocator import AllocationError, Allocator
from dra_gpu.config import ConfigError, Placement
from dra_gpu.controller.consumers import PodIndex, claim_key, is_pod_reference, reserved_for_workload
from dra_gpu.controller.eligibility import NodeEligibility
from dra_gpu.controller.metrics import ControllerMetrics
from dra_gpu.controller.overcommit import overcommitted
from dra_gpu.controller.owned_classes import ClassIndex
from dra_gpu.controller.pool_nodes import REASON as POOL_REASON
from dra_gpu.controller.pool_nodes import refuse_foreign_slices
from dra_gpu.kube import ApiError, Conflict, KubeAPI, NotFound, builders, objects, versions
from dra_gpu.kube.events import EventRecorder, timestamp

Obj = dict[str, Any]
log = logging.getLogger(__name__)

FINALIZER = CONTROLLER_FINALIZER
"""Our finalizer on claims we allocated: the claim cannot disappear while we still account for it."""

MAX_ATTEMPTS = 5


def read_taint_rules(api: KubeAPI) -> list[Obj]:
    """The cluster's DeviceTaintRules, read for each pass; none where the server does not serve them (before
    1.37 without the DRADeviceTaintRules gate it answers 404, as for any resource it lacks). Any other error
    fails the pass, which is retried: allocating without the rules would ignore an admin's taints."""
    try:
        return api.list("DeviceTaintRule")[0]
    except NotFound:
        return []


@dataclass
class Snapshot:
    slices: list[Obj]
    classes: list[Obj]
    claims: list[Obj]
    pods: list[Obj]
    nodes: list[Obj]
    taint_rules: list[Obj] = field(default_factory=list)

    @classmethod
    def read(cls, api: KubeAPI) -> Snapshot:
        """A snapshot straight from the API (tests, the demo, one-shot runs)."""
        slices, classes, claims, pods, nodes = (
            api.list(kind)[0] for kind in ("ResourceSlice", "DeviceClass", "ResourceClaim", "Pod", "Node")
        )
        return cls(slices, classes, claims, pods, nodes, read_taint_rules(api))


@dataclass
class PassResult:
    """What one pass did, by claim (`namespace/name`)."""

    allocated: dict[str, Obj] = field(default_factory=dict)  # the allocation written
    released: dict[str, str] = field(default_factory=dict)  # why
    failed: dict[str, str] = field(default_factory=dict)  # the AllocationFailed message
    waiting: list[str] = field(default_factory=list)  # no pod uses it yet
    reserved: dict[str, list[str]] = field(default_factory=dict)  # pods added to reservedFor

    @property
    def changed(self) -> bool:
        return bool(self.allocated or self.released or self.reserved)


def _name(claim: Mapping[str, Any]) -> str:
    namespace, name = claim_key(claim)
    return f"{namespace}/{name}"


def describe_allocation(allocation: Mapping[str, Any]) -> str:
    """`gpu-0 on node-1 (share: cores 30, memory 10Gi)` for events and the demo."""
    parts = []
    for result in objects.device_results(allocation):
        text = f"{result.pool}/{result.device}"
        consumed = result.consumed
        if consumed:
            text += " (share: " + ", ".join(f"{k} {v}" for k, v in sorted(consumed.items())) + ")"
        else:
            text += " (whole)"
        parts.append(text)
    node = objects.allocation_node(allocation)
    return ", ".join(parts) + (f" on node {node}" if node else "")


class Reconciler:
    """The controller's decisions; no threads, so a test can run one pass and look at the result."""

    def __init__(
        self,
        api: KubeAPI,
        *,
        recorder: EventRecorder,
        metrics: ControllerMetrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        is_leader: Callable[[], bool] = lambda: True,
        on_write: Callable[[Obj], None] | None = None,
        avoid_ttl_s: float = 120.0,
    ) -> None:
        self.api = api
        self.recorder = recorder
        self.metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._is_leader = is_leader
        self._on_write = on_write or (lambda obj: None)
        self._avoid_ttl_s = avoid_ttl_s
        self._placed: dict[str, str] = {}  # claim uid -> node we allocated it on
        self._avoid: dict[str, dict[str, float]] = {}  # claim uid -> node -> when the scheduler cleared it
        self._first_seen: dict[str, float] = {}  # claim uid -> when it first waited with a consumer
        self._resolves_names: bool | None = None  # the server resolves <driver>/<name> capacities (1.38+)

    # --- the pass ---------------------------------------------------------------------------------

    def reconcile(self, snapshot: Snapshot) -> PassResult:
        result = PassResult()
        if self._resolves_names is None:  # read once (again next pass while it cannot be read)
            self._resolves_names = versions.server_resolves_qualified_names(self.api)
        classes = ClassIndex(snapshot.classes)
        pods = PodIndex(snapshot.pods)
        nodes = {objects.name(n): n for n in snapshot.nodes}
        slices, refused = refuse_foreign_slices(snapshot.slices)
        for refusal in refused:
            for s in refusal.slices:
                self.recorder.record(
                    {**s, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"},
                    "Warning",
                    POOL_REASON,
                    refusal.message,
                )
        allocator = Allocator(
            slices,
            classes.for_allocator,
            [c for c in snapshot.claims if objects.allocation(c)],
            taint_rules=snapshot.taint_rules,
            resolve_qualified_names=self._resolves_names is True,
        )
        claims = self._undo_overcommit(snapshot.claims, allocator, result)
        relevant = sorted(
            (c for c in claims if FINALIZER in objects.finalizers(c) or classes.managed_classes_of(c)),
            key=lambda c: (objects.creation_timestamp(c), _name(c)),
        )
        waiting: list[tuple[Obj, list[Obj]]] = []
        for claim in relevant:
            if not self._is_leader():
                return result
            consumers = pods.consumers(claim)
            if self._settle(claim, consumers, classes, allocator, result):
                waiting.append((claim, consumers))
        self.metrics.pending.set(len(waiting))
        for claim, consumers in waiting:
            if not self._is_leader():
                return result
            self._allocate(claim, consumers, classes, nodes, allocator, result)
        self._prune(
            {objects.uid(c) for c in snapshot.claims} | {objects.uid(s) for p in refused for s in p.slices}
        )
        return result

    def _undo_overcommit(self, claims: list[Obj], allocator: Allocator, result: PassResult) -> list[Obj]:
        """Release our unreserved claims from devices over-committed by a concurrent allocation."""
        by_uid = {objects.uid(c): c for c in claims}
        for problem in overcommitted(allocator):
            movable = sorted(
                (by_uid[u] for u in problem.holders if u in by_uid and self._movable(by_uid[u])),
                key=lambda c: (objects.allocation(c) or {}).get("allocationTimestamp") or "",
                reverse=True,
            )
            for claim in movable:
                if not self._is_leader():
                    break
                why = (
                    f"{problem.device}: {problem.why} by allocations made at the same time; placing it again"
                )
                released = self._release(claim, allocator, result, why)
                if released is not None:
                    by_uid[objects.uid(claim)] = released
                if all(p.device != problem.device for p in overcommitted(allocator)):
                    break
        return list(by_uid.values())

    @staticmethod
    def _movable(claim: Obj) -> bool:
        return (
            FINALIZER in objects.finalizers(claim)
            and objects.allocation(claim) is not None
            and not objects.reserved_for(claim)
            and not objects.deleting(claim)
        )

    def _settle(
        self,
        claim: Obj,
        consumers: list[Obj],
        classes: ClassIndex,
        allocator: Allocator,
        result: PassResult,
    ) -> bool:
        """Handle everything but a new allocation; True if the claim waits for one."""
        ours = FINALIZER in objects.finalizers(claim)
        allocation = objects.allocation(claim)
        if objects.deleting(claim):
            if ours and not objects.reserved_for(claim):
                self._release(claim, allocator, result, "the claim is being deleted")
            return False
        if allocation is not None:
            if not ours:
                return False  # someone else's allocation: counted, never touched
            if not objects.reserved_for(claim) and not consumers:
                self._release(claim, allocator, result, "no pod uses the claim any more")
            else:
                self._reserve_bound_pods(claim, allocation, consumers, result)
            return False
        uid = objects.uid(claim)
        if ours and uid in self._placed:
            node = self._placed.pop(uid)
            self._avoid.setdefault(uid, {})[node] = self._monotonic()
            self.recorder.record(
                claim,
                "Warning",
                "AllocationCleared",
                f"the allocation on node {node} was cleared by someone else (the scheduler does this when the "
                "pod cannot run there); placing the claim again, avoiding that node for a while",
            )
        if not classes.managed_classes_of(claim) or not consumers:
            if ours:  # nothing allocated and nothing to hold: drop our finalizer
                self._retrying(claim, self._drop_finalizer_if_unallocated)
            if not consumers and classes.managed_classes_of(claim):
                result.waiting.append(_name(claim))
            return False
        return True

    # --- allocation -------------------------------------------------------------------------------

    def _allocate(
        self,
        claim: Obj,
        consumers: list[Obj],
        classes: ClassIndex,
        nodes: Mapping[str, Obj],
        allocator: Allocator,
        result: PassResult,
    ) -> None:
        uid = objects.uid(claim)
        self._first_seen.setdefault(uid, self._monotonic())
        try:
            policy = classes.placement_for(claim)
        except ConfigError as exc:
            self._fail(claim, result, "InvalidClassConfig", str(exc))
            return
        for _ in range(MAX_ATTEMPTS):
            try:
                allocation = self._place(claim, consumers, policy, nodes, allocator)
            except AllocationError as exc:
                self._fail(claim, result, exc.reason, str(exc))
                return
            try:
                written = self._write_allocation(claim, allocation)
            except Conflict:
                self.metrics.conflicts.inc()
                try:
                    claim = self.api.get("ResourceClaim", objects.name(claim), objects.namespace(claim))
                except NotFound:
                    return
                if objects.allocation(claim) is not None or objects.deleting(claim):
                    return  # settled by someone else; the next pass sees it
                continue
            except NotFound:
                return  # deleted while we were placing it: nothing to allocate, nothing to report
            except ApiError as exc:
                self._fail(claim, result, "ApiError", f"writing the allocation failed: {exc}")
                return
            self._succeeded(written, allocator, result, policy)
            return
        self._fail(
            claim, result, "Conflict", f"the claim kept changing; gave up after {MAX_ATTEMPTS} attempts"
        )

    def _place(
        self,
        claim: Obj,
        consumers: list[Obj],
        policy: Placement | None,
        nodes: Mapping[str, Obj],
        allocator: Allocator,
    ) -> Obj:
        """Allocate, first avoiding nodes where the scheduler recently cleared this claim.

        An AllocationError's message gains the nodes the claim's pods cannot use and why: the
        allocator only knows that the node filter refused them.
        """
        avoid = self._avoid_nodes(objects.uid(claim))
        eligibility = NodeEligibility(nodes, consumers, avoid)
        try:
            return allocator.allocate(claim, policy=policy, node_filter=eligibility)
        except AllocationError as exc:
            if not avoid:
                raise self._explained(exc, eligibility) from None
        eligibility = NodeEligibility(nodes, consumers)
        try:
            return allocator.allocate(claim, policy=policy, node_filter=eligibility)
        except AllocationError as exc:
            raise self._explained(exc, eligibility) from None

    @staticmethod
    def _explained(exc: AllocationError, eligibility: NodeEligibility) -> AllocationError:
        if not eligibility.refused:
            return exc
        return AllocationError(f"{exc}; nodes its pods cannot use: {eligibility.summary()}", exc.reason)

    def _write_allocation(self, claim: Obj, allocation: Obj) -> Obj:
        """Finalizer first, then the allocation, each with the resourceVersion just read."""
        allocation = copy.deepcopy(allocation)
        allocation.setdefault("allocationTimestamp", timestamp(self._clock()))
        if FINALIZER not in objects.finalizers(claim):
            claim = self.api.update("ResourceClaim", builders.with_finalizer(claim, FINALIZER))
            self._on_write(claim)
        written = self.api.update_status("ResourceClaim", builders.with_allocation(claim, allocation))
        self._on_write(written)
        return written

    def _succeeded(
        self, claim: Obj, allocator: Allocator, result: PassResult, policy: Placement | None
    ) -> None:
        allocator.commit(claim)
        uid = objects.uid(claim)
        allocation = objects.allocation(claim) or {}
        node = objects.allocation_node(allocation)
        if node:
            self._placed[uid] = node
        self.metrics.allocations.inc()
        started = self._first_seen.pop(uid, None)
        if started is not None:
            self.metrics.time_to_allocate.observe(max(0.0, self._monotonic() - started))
        how = f" by policy {policy.policy.value}" if policy else ""
        message = f"allocated {describe_allocation(allocation)}{how}"
        self.recorder.record(claim, "Normal", "Allocated", message)
        log.info(
            "allocated claim", extra={"claim": _name(claim), "allocation": describe_allocation(allocation)}
        )
        result.allocated[_name(claim)] = allocation

    def _fail(self, claim: Obj, result: PassResult, reason: str, message: str) -> None:
        self.metrics.failures.labels(reason=reason).inc()
        self.recorder.record(claim, "Warning", "AllocationFailed", message)
        log.info("claim not allocated", extra={"claim": _name(claim), "reason": reason, "why": message})
        result.failed[_name(claim)] = message

    # --- release and reservation ------------------------------------------------------------------

    def _release(self, claim: Obj, allocator: Allocator, result: PassResult, why: str) -> Obj | None:
        allocation = objects.allocation(claim)

        def attempt(current: Obj) -> Obj | None:
            if FINALIZER not in objects.finalizers(current) or objects.reserved_for(current):
                return None  # someone reserved it meanwhile, or it is no longer ours
            if (
                not objects.deleting(current)
                and objects.allocation(current) is None
                and allocation is not None
            ):
                return None  # already released by someone else
            if objects.allocation(current) is not None:
                current = self.api.update_status("ResourceClaim", builders.without_allocation(current))
            stored = self.api.update("ResourceClaim", builders.without_finalizer(current, FINALIZER))
            self._on_write(stored)
            return stored

        stored = self._retrying(claim, attempt)
        if stored is None:
            return None
        allocator.release(claim)
        self._placed.pop(objects.uid(claim), None)
        self._avoid.pop(objects.uid(claim), None)
        self.metrics.releases.inc()
        if allocation is not None:
            message = f"released {describe_allocation(allocation)}: {why}"
            self.recorder.record(claim, "Normal", "Released", message)
            log.info("released claim", extra={"claim": _name(claim), "why": why})
            result.released[_name(claim)] = why
        return stored

    def _drop_finalizer_if_unallocated(self, current: Obj) -> Obj | None:
        if FINALIZER not in objects.finalizers(current) or objects.allocation(current) is not None:
            return None
        stored = self.api.update("ResourceClaim", builders.without_finalizer(current, FINALIZER))
        self._on_write(stored)
        return stored

    def _reserve_bound_pods(
        self, claim: Obj, allocation: Obj, consumers: list[Obj], result: PassResult
    ) -> None:
        """Add pods bound without the scheduler (`spec.nodeName` preset) to `reservedFor`.

        The scheduler reserves the claim for the pods it binds; a pod that never went through it is
        refused by the kubelet unless someone lists it, and the claim is on that pod's node. A claim
        reserved for a PodGroup (a workload claim) is left as it is: its pods are admitted through the
        group, and pods are not mixed into a workload's reservation.
        """
        if reserved_for_workload(claim):
            return
        node = objects.allocation_node(allocation)
        listed = {r.get("uid") for r in objects.reserved_for(claim) if is_pod_reference(r)}
        missing = [
            p
            for p in consumers
            if objects.pod_node(p)
            and (node is None or objects.pod_node(p) == node)
            and objects.uid(p) not in listed
        ]
        if not missing:
            return

        def attempt(current: Obj) -> Obj | None:
            if (
                objects.allocation(current) is None
                or objects.deleting(current)
                or reserved_for_workload(current)
            ):
                return None
            have = {r.get("uid") for r in objects.reserved_for(current) if is_pod_reference(r)}
            add = [builders.consumer(p) for p in missing if objects.uid(p) not in have]
            if not add:
                return None
            stored = self.api.update_status("ResourceClaim", builders.with_reservation(current, *add))
            self._on_write(stored)
            return stored

        if self._retrying(claim, attempt) is not None:
            names = [objects.name(p) for p in missing]
            result.reserved[_name(claim)] = names
            self.recorder.record(
                claim, "Normal", "Reserved", f"reserved for pod(s) {', '.join(names)} bound to node {node}"
            )

    # --- helpers ----------------------------------------------------------------------------------

    def _retrying(self, claim: Obj, attempt: Callable[[Obj], Obj | None]) -> Obj | None:
        """Run `attempt` on the claim; on a 409 read it again and let `attempt` decide again."""
        current = claim
        for _ in range(MAX_ATTEMPTS):
            try:
                return attempt(current)
            except Conflict:
                self.metrics.conflicts.inc()
            except ApiError as exc:
                log.warning("claim update failed", extra={"claim": _name(claim), "error": str(exc)})
                return None
            try:
                current = self.api.get("ResourceClaim", objects.name(claim), objects.namespace(claim))
            except NotFound:
                return None
        log.warning("claim kept changing; will retry next pass", extra={"claim": _name(claim)})
        return None

    def _avoid_nodes(self, uid: str) -> set[str]:
        now = self._monotonic()
        recent = {n: t for n, t in self._avoid.get(uid, {}).items() if now - t < self._avoid_ttl_s}
        if recent:
            self._avoid[uid] = recent
        else:
            self._avoid.pop(uid, None)
        return set(recent)

    def _prune(self, present: Iterable[str]) -> None:
        keep = set(present)
        for table in (self._placed, self._avoid, self._first_seen):
            for uid in [u for u in table if u not in keep]:
                del table[uid]
        self.recorder.retain(keep)
