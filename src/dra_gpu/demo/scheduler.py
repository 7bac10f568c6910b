"""A stand-in for the kube-scheduler's DRA steps, for the local demo (and tests) where none runs.

This is a simulation, not the scheduler: it does what `DynamicResources` does for a pending pod, in the
same order and with the same API writes, and nothing else (no resource fit, no scoring, no preemption).
For each pod without a node: every claim the pod uses that is not yet allocated is allocated with the
allocator against the DeviceClasses *as published* (so a controller-managed class matches no device,
exactly as with the real scheduler); claims that are already allocated constrain the pod to their node.
When every claim fits on one node, the allocations are written (with the scheduler's finalizer
`resource.kubernetes.io/delete-protection`), the pod is added to each claim's `reservedFor`, and the pod
is bound to the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_gpu import SCHEDULER_FINALIZER
from dra_gpu.allocator import AllocationError, Allocator
from dra_gpu.controller.consumers import claim_names_of
from dra_gpu.controller.eligibility import why_not
from dra_gpu.kube import KubeAPI, NotFound, builders, objects

Obj = dict[str, Any]

GENERIC_FAILURE = "0/{n} nodes are available: {n} cannot allocate all claims."
"""The real scheduler's only words for a claim that does not fit (`tests/fixtures/k8s-1.36-real/events.json`)."""


@dataclass
class ScheduleResult:
    bound: dict[str, str] = field(default_factory=dict)  # pod -> node
    pending: dict[str, str] = field(default_factory=dict)  # pod -> the scheduler's message
    allocated: dict[str, Obj] = field(default_factory=dict)  # claim -> allocation


class SchedulerStandIn:
    def __init__(self, api: KubeAPI) -> None:
        self.api = api

    def schedule(self) -> ScheduleResult:
        """One scheduling round over every pending pod, oldest first."""
        result = ScheduleResult()
        slices, _ = self.api.list("ResourceSlice")
        classes = {objects.name(c): c for c in self.api.list("DeviceClass")[0]}
        nodes = {objects.name(n): n for n in self.api.list("Node")[0]}
        claims = {(objects.namespace(c), objects.name(c)): c for c in self.api.list("ResourceClaim")[0]}
        allocator = Allocator(slices, classes, [c for c in claims.values() if objects.allocation(c)])
        pods = sorted(
            (p for p in self.api.list("Pod")[0] if not objects.pod_node(p)),
            key=lambda p: (objects.creation_timestamp(p), objects.name(p)),
        )
        for pod in pods:
            pod_name, namespace = objects.name(pod), objects.namespace(pod)
            names = sorted(claim_names_of(pod))
            if any((namespace, name) not in claims for name in names):
                result.pending[pod_name] = "waiting for its ResourceClaims to exist"
                continue
            used = [claims[(namespace, name)] for name in names]
            placed = self._place(pod, used, nodes, allocator)
            if placed is None:
                result.pending[pod_name] = GENERIC_FAILURE.format(n=len(nodes))
                continue
            node, new = placed
            for claim, allocation in new:
                written = self._write_allocation(claim, allocation)
                allocator.commit(written)
                claims[(namespace, objects.name(claim))] = written
                result.allocated[f"{namespace}/{objects.name(claim)}"] = allocation
            for claim in used:
                key = (namespace, objects.name(claim))
                claims[key] = self._reserve(claims[key], pod)
            self._bind(pod, node)
            result.bound[pod_name] = node
        return result

    def _place(
        self, pod: Obj, used: list[Obj], nodes: Mapping[str, Obj], allocator: Allocator
    ) -> tuple[str, list[tuple[Obj, Obj]]] | None:
        fixed = {objects.allocation_node(a) for c in used if (a := objects.allocation(c)) is not None} - {
            None
        }
        if len(fixed) > 1:
            return None
        candidates = [n for n in sorted(nodes) if why_not(pod, nodes[n]) is None]
        if fixed:
            candidates = [n for n in candidates if n in fixed]
        pending = [c for c in used if objects.allocation(c) is None]
        for node in candidates:
            new: list[tuple[Obj, Obj]] = []
            only_here = _only(node)
            try:
                for claim in pending:
                    allocation = allocator.allocate(claim, node_filter=only_here)
                    tentative = builders.with_allocation(claim, allocation)
                    allocator.commit(tentative)
                    new.append((claim, allocation))
            except AllocationError:
                for claim, _ in new:
                    allocator.release(claim)
                continue
            for claim, _ in new:
                allocator.release(claim)  # committed again once written
            return node, new
        return None

    def _write_allocation(self, claim: Obj, allocation: Obj) -> Obj:
        if SCHEDULER_FINALIZER not in objects.finalizers(claim):
            claim = self.api.update("ResourceClaim", builders.with_finalizer(claim, SCHEDULER_FINALIZER))
        return self.api.update_status("ResourceClaim", builders.with_allocation(claim, allocation))

    def _reserve(self, claim: Obj, pod: Obj) -> Obj:
        if any(r.get("uid") == objects.uid(pod) for r in objects.reserved_for(claim)):
            return claim
        return self.api.update_status(
            "ResourceClaim", builders.with_reservation(claim, builders.consumer(pod))
        )

    def _bind(self, pod: Obj, node: str) -> None:
        try:
            current = self.api.get("Pod", objects.name(pod), objects.namespace(pod))
        except NotFound:
            return
        self.api.update("Pod", builders.bound(current, node))


def _only(node: str) -> Callable[[str], bool]:
    return lambda name: name == node
