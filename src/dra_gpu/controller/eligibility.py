"""Nodes where a claim's pods can land, checked as the scheduler's filters check them.

If the controller put a claim on a node where its pod cannot run, the scheduler would find no node for
the pod and, in PostFilter, clear the allocation (it does so for any allocated claim that nobody has
reserved yet): the claim would bounce between the two. So a node qualifies only if it exists, is
schedulable, every consumer pod tolerates its NoSchedule/NoExecute taints, and it matches each pod's
`spec.nodeName`, `nodeSelector` and required node affinity. Pod resource requests (CPU, memory) are not
checked: the scheduler's NodeResourcesFit is out of scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dra_gpu.kube import objects

Obj = dict[str, Any]

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' `Toleration.ToleratesTaint`."""
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        operator = tol.get("operator") or "Equal"
        key = tol.get("key") or ""
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _requirement_matches(values: Mapping[str, str], req: Mapping[str, Any]) -> bool:
    key, op, wanted = req.get("key", ""), req.get("operator", ""), list(req.get("values") or [])
    present = key in values
    if op == "In":
        return present and values[key] in wanted
    if op == "NotIn":
        return not present or values[key] not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def node_selector_matches(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    """A core/v1 NodeSelector: any term matches; within a term every requirement matches."""
    if not selector:
        return True
    labels = objects.labels(node)
    fields = {"metadata.name": objects.name(node)}
    for term in selector.get("nodeSelectorTerms") or []:
        exprs, field_reqs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not field_reqs:
            continue  # an empty term matches nothing, as in Kubernetes
        if all(_requirement_matches(labels, r) for r in exprs) and all(
            _requirement_matches(fields, r) for r in field_reqs
        ):
            return True
    return False


def why_not(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """None if the pod can land on the node, else the scheduler filter that would reject it."""
    name = objects.name(node)
    tolerations = objects.pod_tolerations(pod)
    bound = objects.pod_node(pod)
    if bound and bound != name:
        return f"pod is bound to node {bound}"
    if objects.node_unschedulable(node) and not tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return "node is unschedulable (cordoned)"
    for taint in objects.node_taints(node):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"untolerated taint {taint.get('key')}{value}:{taint.get('effect')}"
    labels = objects.labels(node)
    for key, value in objects.pod_node_selector(pod).items():
        if labels.get(key) != value:
            return f"node does not match the pod's nodeSelector {key}={value}"
    required = objects.pod_required_node_affinity(pod)
    if required and not node_selector_matches(required, node):
        return "node does not match the pod's required node affinity"
    return None


class NodeEligibility:
    """The node filter handed to the allocator for one claim, remembering why nodes were refused."""

    def __init__(self, nodes: Mapping[str, Obj], pods: list[Obj], avoid: Iterable[str] = ()) -> None:
        self._nodes = nodes
        self._pods = pods
        self._avoid = set(avoid)
        self.refused: dict[str, str] = {}

    def __call__(self, node_name: str) -> bool:
        reason = self._check(node_name)
        if reason is not None:
            self.refused[node_name] = reason
        return reason is None

    def _check(self, node_name: str) -> str | None:
        if node_name in self._avoid:
            return "the scheduler cleared an earlier allocation on this node"
        node = self._nodes.get(node_name)
        if node is None:
            return "no such Node"
        for pod in self._pods:
            reason = why_not(pod, node)
            if reason is not None:
                pod_name = objects.name(pod)
                return f"{reason} (pod {pod_name})"
        return None

    def summary(self, limit: int = 3) -> str:
        """`node-a: reason; node-b: reason (+N more)` for events."""
        items = sorted(self.refused.items())
        text = "; ".join(f"{n}: {r}" for n, r in items[:limit])
        if len(items) > limit:
            text += f" (+{len(items) - limit} more)"
        return text
