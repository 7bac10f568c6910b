"""The pods on this node, by UID: their names, containers and claims, from one list call.

A process's cgroup names its pod's UID and container ID; the API gives the names and which claims the
pod uses. The list is refreshed when an unknown pod shows up (at most once per `min_refresh_s`) and
otherwise every `refresh_s`, so the agent's API load stays one list call per minute per node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dra_gpu.kube import ApiError, KubeAPI, objects

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    containers: dict[str, str]
    """Container ID (without the runtime's `containerd://` prefix) -> container name."""
    claims: frozenset[str]
    """Names of the ResourceClaims the pod uses (in its namespace)."""
    container_claims: dict[str, frozenset[str]] = field(default_factory=dict)
    """Container name -> the ResourceClaims that container uses (its `resources.claims`)."""

    def container(self, container_id: str) -> str:
        return self.containers.get(container_id, "")


def pod_info(pod: dict) -> PodInfo:  # type: ignore[type-arg]
    containers: dict[str, str] = {}
    for c in objects.pod_container_statuses(pod):
        cid = str(c.get("containerID") or "").rpartition("://")[2]
        if cid:
            containers[cid] = str(c.get("name") or "")
    # A container names the pod's claim entries; those name ResourceClaims (directly, or once made from a
    # template, in the status).
    by_entry = {
        str(c.get("name")): str(c["resourceClaimName"])
        for c in objects.pod_claim_refs(pod)
        if c.get("resourceClaimName")
    }
    for c in objects.pod_claim_statuses(pod):
        if c.get("resourceClaimName"):
            by_entry[str(c.get("name"))] = str(c["resourceClaimName"])
    claims = {
        str(c["resourceClaimName"])
        for c in [*objects.pod_claim_refs(pod), *objects.pod_claim_statuses(pod)]
        if c.get("resourceClaimName")
    }
    container_claims = {
        str(c.get("name") or ""): frozenset(
            by_entry[str(r.get("name"))]
            for r in (c.get("resources") or {}).get("claims") or []
            if str(r.get("name")) in by_entry
        )
        for c in objects.pod_containers(pod)
    }
    return PodInfo(
        uid=objects.uid(pod),
        namespace=objects.namespace(pod),
        name=objects.name(pod),
        containers=containers,
        claims=frozenset(claims),
        container_claims=container_claims,
    )


class PodDirectory:
    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        refresh_s: float = 60.0,
        min_refresh_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._node = node_name
        self._refresh_s = refresh_s
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._pods: dict[str, PodInfo] = {}
        self._loaded_at: float | None = None

    def _load(self) -> None:
        self._loaded_at = self._clock()
        try:
            items, _ = self._api.list("Pod", field_selector=f"spec.nodeName={self._node}")
        except ApiError as exc:
            log.warning("cannot list this node's pods", extra={"error": str(exc)})
            return
        self._pods = {info.uid: info for info in map(pod_info, items) if info.uid}

    def lookup(self, uid: str, container_id: str = "") -> PodInfo | None:
        """The pod with this UID; a pod or container not seen yet triggers a (rate-limited) reload."""
        now = self._clock()
        age = None if self._loaded_at is None else now - self._loaded_at
        known = self._pods.get(uid)
        unknown = known is None or bool(container_id and container_id not in known.containers)
        if age is None or age >= self._refresh_s or (unknown and age >= self._min_refresh_s):
            self._load()
        return self._pods.get(uid)
