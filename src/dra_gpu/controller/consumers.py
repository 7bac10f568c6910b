"""Which pods use a claim, read the way Kubernetes links them.

A pod names a claim directly (`spec.resourceClaims[].resourceClaimName`), through a template (the
generated name is in `status.resourceClaimStatuses[]`, and the claim has a controlling owner reference to
the pod), or through an extended resource (`status.extendedResourceClaimStatus`).

`status.reservedFor` does not always list pods: a workload claim (DRAWorkloadResourceClaims, beta in
1.37) is reserved for a PodGroup, whose pods the kubelet admits through that one entry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from dra_gpu.kube import objects

Obj = dict[str, Any]
ClaimKey = tuple[str, str]  # namespace, name


def claim_key(claim: Mapping[str, Any]) -> ClaimKey:
    return objects.namespace(claim) or "default", objects.name(claim)


def claim_names_of(pod: Mapping[str, Any]) -> set[str]:
    """Names of the ResourceClaims this pod uses (those known so far)."""
    names = {ref["resourceClaimName"] for ref in objects.pod_claim_refs(pod) if ref.get("resourceClaimName")}
    names.update(
        s["resourceClaimName"] for s in objects.pod_claim_statuses(pod) if s.get("resourceClaimName")
    )
    extended = objects.pod_extended_claim(pod)
    if extended:
        names.add(extended)
    return names


def is_pod_reference(ref: Mapping[str, Any]) -> bool:
    """A `reservedFor` entry that names a Pod (core group, resource `pods`)."""
    return ref.get("resource") == "pods" and not ref.get("apiGroup")


def reserved_for_workload(claim: Mapping[str, Any]) -> bool:
    """True when `reservedFor` holds anything but Pods (a PodGroup of a workload claim)."""
    return any(not is_pod_reference(ref) for ref in objects.reserved_for(claim))


def is_live(pod: Mapping[str, Any]) -> bool:
    """A pod that may still need its claims: not finished and not being deleted."""
    return objects.pod_phase(pod) not in ("Succeeded", "Failed") and not objects.deleting(pod)


class PodIndex:
    """Pods by the claims they use, built once per pass."""

    def __init__(self, pods: Iterable[Obj]) -> None:
        self._by_claim: dict[ClaimKey, list[Obj]] = defaultdict(list)
        self._by_uid: dict[str, Obj] = {}
        for pod in pods:
            self._by_uid[objects.uid(pod)] = pod
            for name in claim_names_of(pod):
                self._by_claim[(objects.namespace(pod) or "default", name)].append(pod)

    def consumers(self, claim: Mapping[str, Any]) -> list[Obj]:
        """Live pods that use the claim, including the owner of a template-generated claim."""
        found = {objects.uid(p): p for p in self._by_claim.get(claim_key(claim), [])}
        for owner in objects.owner_references(claim):
            if owner.get("kind") == "Pod" and owner.get("controller") and owner.get("uid") in self._by_uid:
                found[owner["uid"]] = self._by_uid[owner["uid"]]
        return [p for p in found.values() if is_live(p)]
