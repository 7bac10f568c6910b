"""Objects and waits shared by the end-to-end tests (a real API server, a real scheduler)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import KubeAPI, NotFound

Obj = dict[str, Any]
T = TypeVar("T")

IMAGE = os.environ.get("E2E_IMAGE", "busybox:1.36")
WAIT_S = float(os.environ.get("E2E_TIMEOUT", "120"))


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_S, every_s: float = 1.0) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` when it never does."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last seen: {last!r})")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@dataclass
class Agent:
    """Where the node agent runs: the node whose pool the tests use, and how it was started."""

    node: str
    mode: str  # "daemonset" or "local"
    run_pods: bool


def node_slices(api: KubeAPI, node: str) -> list[Obj]:
    items, _ = api.list("ResourceSlice", field_selector=f"spec.nodeName={node},spec.driver={DRIVER_NAME}")
    return items


def node_devices(api: KubeAPI, node: str) -> list[Obj]:
    return [d for s in node_slices(api, node) for d in s["spec"].get("devices") or []]


def attribute(device: Obj, name: str) -> Any:
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None)


def node_affinity(node: str) -> Obj:
    """Pin a pod to `node` through the scheduler (spec.nodeName would skip allocation altogether)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def claim_spec(
    device_class: str, capacity: dict[str, str] | None = None, selectors: list[str] | None = None
) -> Obj:
    exactly: Obj = {"deviceClassName": device_class}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def pin_device(uuid_value: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].uuid == "{uuid_value}"'


@dataclass
class Objects:
    """Creates objects in the test namespace and removes them (pods first, at once) afterwards."""

    api: KubeAPI
    core: Any  # kubernetes.client.CoreV1Api, for what KubeAPI does not do (grace period 0, logs)
    namespace: str
    node: str
    created: list[tuple[str, str]] = field(default_factory=list)

    def claim(self, name: str, spec: Obj) -> Obj:
        return self._create("ResourceClaim", {"metadata": {"name": name}, "spec": spec})

    def template(self, name: str, spec: Obj) -> Obj:
        return self._create("ResourceClaimTemplate", {"metadata": {"name": name}, "spec": {"spec": spec}})

    def pod(self, name: str, claims: dict[str, Obj], command: str = "sleep 3600") -> Obj:
        """`claims` maps a pod claim name to {"resourceClaimName": ...} or {"resourceClaimTemplateName": ...}."""
        spec = {
            "affinity": node_affinity(self.node),
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": n, **source} for n, source in claims.items()],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": n} for n in claims]},
                }
            ],
        }
        return self._create("Pod", {"metadata": {"name": name}, "spec": spec})

    def _create(self, kind: str, obj: Obj) -> Obj:
        obj["metadata"]["namespace"] = self.namespace
        created = self.api.create(kind, obj)
        self.created.append((kind, created["metadata"]["name"]))
        return created

    def get(self, kind: str, name: str) -> Obj:
        return self.api.get(kind, name, self.namespace)

    def allocated(self, name: str, timeout_s: float = WAIT_S) -> Obj:
        def probe() -> Obj | None:
            claim = self.get("ResourceClaim", name)
            return claim if (claim.get("status") or {}).get("allocation") else None

        return wait_for(f"claim {name} to be allocated", probe, timeout_s)

    def cleanup(self) -> None:
        for kind, name in reversed(self.created):
            if kind == "Pod":
                with contextlib.suppress(Exception):  # the kubernetes client's ApiException: already gone
                    self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        for kind, name in reversed(self.created):
            if kind != "Pod":
                with contextlib.suppress(NotFound):
                    self.api.delete(kind, name, self.namespace)

        def gone() -> bool:
            for kind, name in self.created:
                try:
                    self.api.get(kind, name, self.namespace)
                    return False
                except NotFound:
                    continue
            return True

        # Claims keep the GPU until the resourceclaim controller releases them; later tests need it free.
        wait_for("the test's pods and claims to be deleted", gone)
        self.created.clear()


def results(claim: Obj) -> list[Obj]:
    found: list[Obj] = claim["status"]["allocation"]["devices"]["results"]
    return found
