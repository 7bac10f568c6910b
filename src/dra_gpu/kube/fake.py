"""FakeKube: an in-memory stand-in for the Kubernetes API server.

This is a fake. It exists because no API server runs in unit tests, in CI or in the local demo. It keeps
the semantics the driver depends on, taken from a real 1.36 control plane (`tests/fixtures/k8s-1.36-real/`):
resource versions and 409 Conflicts on stale writes and failed preconditions, 404s, AlreadyExists,
`generateName`, status subresources (a main-resource PUT ignores status and vice versa), immutable claim
specs and write-once `status.allocation`, finalizers and `deletionTimestamp`, DeleteCollection, watch
streams from a resource version (410 Gone when too old), the ResourceSlice and DeviceClass validation, and,
when `consumable_capacity=False`, the silent dropping of gated fields that an API server with
DRAConsumableCapacity off performs. It does not do authentication, RBAC or admission.

It answers as a server of one Kubernetes release (`version`, `server_version()`; 1.37 unless told) with
that release's default feature gates for the fields newer than 1.36 (`kube.versions`): a server whose
gate is off (or that has no such gate) drops `consumesCounters[].compatibilityGroups`
(DRADeviceCompatibilityGroups) and the shared-consumable-capacity fields (DRASharedConsumableCapacity)
on write, as the real one does; one whose gate is on keeps and validates them. `gates` overrides a
release's defaults, as `--feature-gates` does.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import queue
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from dra_gpu.kube import objects, versions
from dra_gpu.kube.api import WatchEvent
from dra_gpu.kube.errors import AlreadyExists, Conflict, Gone, Invalid, NotFound
from dra_gpu.kube.fake_reviews import REVIEW_KINDS, access_review, token_review
from dra_gpu.kube.resources import RESOURCES, Resource
from dra_gpu.kube.selectors import field_matches, label_matches
from dra_gpu.kube.validation import validate_device_class, validate_resource_slice

Obj = dict[str, Any]
_Key = tuple[str, str, str]  # kind, namespace ("" for cluster-scoped), name
_HISTORY = 10_000


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _drop_consumable_capacity(kind: str, obj: Obj) -> None:
    """What an API server with DRAConsumableCapacity off does, silently, on write."""
    if kind == "ResourceSlice":
        for device in objects.slice_devices(obj):
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    elif kind == "ResourceClaim":
        for request in objects.raw_device_requests(obj):
            (request.get("exactly") or {}).pop("capacity", None)
            for sub in request.get("firstAvailable") or []:
                sub.pop("capacity", None)


def _drop_gated_counter_fields(obj: Obj, gates: dict[str, bool]) -> None:
    """What a server without DRADeviceCompatibilityGroups or DRASharedConsumableCapacity does, silently,
    with a ResourceSlice's fields of those gates (per `+featureGate` in `k8s.io/api/resource/v1`)."""
    groups = gates.get(versions.COMPATIBILITY_GROUPS, False)
    shared = gates.get(versions.SHARED_CONSUMABLE_CAPACITY, False)
    if not shared:
        for counter_set in objects.spec(obj).get("sharedCounters") or []:
            for counter in (counter_set.get("counters") or {}).values():
                if isinstance(counter, dict):
                    counter.pop("requestPolicy", None)
    for device in objects.slice_devices(obj):
        for entry in device.get("consumesCounters") or []:
            if not groups:
                entry.pop("compatibilityGroups", None)
            if not shared:
                for counter in (entry.get("counters") or {}).values():
                    if isinstance(counter, dict):
                        counter.pop("valueFrom", None)


class _Watcher:
    def __init__(self, kind: str, namespace: str | None, fields: str | None, labels: str | None) -> None:
        self.kind, self.namespace, self.fields, self.labels = kind, namespace, fields, labels
        self.events: queue.Queue[tuple[str, Obj]] = queue.Queue()

    def wants(self, kind: str, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        return (
            kind == self.kind
            and (not self.namespace or meta.get("namespace") == self.namespace)
            and field_matches(obj, self.fields)
            and label_matches(obj, self.labels)
        )


_IMMUTABLE = (str, int, float, bool, type(None))


def _own_copy(obj: Any) -> Any:
    """A deep copy of a stored object, as a client of the real API server gets its own (decoded from the
    answer's JSON): dicts and lists rebuilt, JSON's scalars shared (immutable), anything else deep-copied.
    Several times faster than `copy.deepcopy` for the objects the agent reads on every prepare."""
    if type(obj) is dict:
        return {key: _own_copy(value) for key, value in obj.items()}
    if type(obj) is list:
        return [_own_copy(value) for value in obj]
    return obj if type(obj) in _IMMUTABLE else copy.deepcopy(obj)


class FakeKube:
    """Implements `dra_gpu.kube.api.KubeAPI` in memory; thread-safe."""

    def __init__(
        self,
        *,
        consumable_capacity: bool = True,
        version: versions.Version = (1, 37),
        gates: dict[str, bool] | None = None,
    ) -> None:
        self.consumable_capacity = consumable_capacity
        self.version = version
        self.gates = {gate: versions.gate_default(gate, version) for gate in versions.GATE_SINCE}
        """The release's defaults for the gates `kube.versions` knows, with `gates` over them."""
        self.gates.update(gates or {})
        self._lock = threading.RLock()
        self._objects: dict[_Key, Obj] = {}
        self._rv = 0
        self._history: list[tuple[int, str, str, Obj]] = []
        self._watchers: list[_Watcher] = []
        self.calls: list[tuple[str, str]] = []  # (verb, kind): lets tests count API traffic
        self.tokens: dict[str, Obj] = {}
        """Bearer token -> the user a TokenReview of it names (`kube.fake_reviews`)."""

    # -- helpers ---------------------------------------------------------------------------------
    def _resource(self, kind: str) -> Resource:
        try:
            return RESOURCES[kind]
        except KeyError:
            raise NotFound(f"the server doesn't have a resource type {kind!r}") from None

    @staticmethod
    def _key(res: Resource, name: str, namespace: str | None) -> _Key:
        return (res.kind, (namespace or "") if res.namespaced else "", name)

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, kind: str, event: str, obj: Obj) -> None:
        snapshot = copy.deepcopy(obj)
        self._history.append((self._rv, kind, event, snapshot))
        del self._history[:-_HISTORY]
        for watcher in self._watchers:
            if watcher.wants(kind, snapshot):
                watcher.events.put((event, copy.deepcopy(snapshot)))

    @staticmethod
    def _qualified(res: Resource) -> str:
        return f"{res.plural}.{res.group}" if res.group else res.plural

    def _conflict(self, res: Resource, name: str) -> Conflict:
        return Conflict(
            f'Operation cannot be fulfilled on {self._qualified(res)} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        )

    def _admit(self, res: Resource, obj: Obj) -> None:
        if not self.consumable_capacity:
            _drop_consumable_capacity(res.kind, obj)
        if res.kind == "ResourceSlice":
            _drop_gated_counter_fields(obj, self.gates)
            validate_resource_slice(obj)
        elif res.kind == "DeviceClass":
            validate_device_class(obj)

    # -- KubeAPI ---------------------------------------------------------------------------------
    def server_version(self) -> tuple[int, int]:
        return self.version

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        res = self._resource(kind)
        with self._lock:
            self.calls.append(("get", kind))
            obj = self._objects.get(self._key(res, name, namespace))
            if obj is None:
                raise NotFound(f'{self._qualified(res)} "{name}" not found')
            copied: Obj = _own_copy(obj)
            return copied

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        res = self._resource(kind)
        with self._lock:
            self.calls.append(("list", kind))
            items = [
                _own_copy(o)
                for (k, ns, _), o in sorted(self._objects.items())
                if k == kind
                and (not namespace or not res.namespaced or ns == namespace)
                and field_matches(o, field_selector)
                and label_matches(o, label_selector)
            ]
            return items, str(self._rv)

    def create(self, kind: str, obj: Obj) -> Obj:
        res = self._resource(kind)
        if kind in REVIEW_KINDS:
            return self._review(kind, obj)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        with self._lock:
            self.calls.append(("create", kind))
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise Invalid(f"{kind}: metadata.name: Required value: name or generateName is required")
                meta["name"] = prefix + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            namespace = meta.get("namespace") if res.namespaced else None
            if res.namespaced and not namespace:
                namespace = meta["namespace"] = "default"
            key = self._key(res, meta["name"], namespace)
            if key in self._objects:
                raise AlreadyExists(f'{self._qualified(res)} "{meta["name"]}" already exists')
            if res.has_status and res.kind != "Node":
                obj.pop("status", None)
            self._admit(res, obj)
            meta.update(
                uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1, resourceVersion=self._bump()
            )
            meta.pop("deletionTimestamp", None)
            obj.setdefault("apiVersion", res.api_version)
            obj.setdefault("kind", kind)
            self._objects[key] = obj
            self._emit(kind, "ADDED", obj)
            return copy.deepcopy(obj)

    def _review(self, kind: str, review: Obj) -> Obj:
        """A review is answered and never stored, as kube-apiserver does."""
        with self._lock:
            self.calls.append(("create", kind))
            if kind == "TokenReview":
                return token_review(review, self.tokens)
            stored = [
                o for (k, _, _), o in self._objects.items() if k in ("ClusterRole", "ClusterRoleBinding")
            ]
            roles = [o for o in stored if o["kind"] == "ClusterRole"]
            bindings = [o for o in stored if o["kind"] == "ClusterRoleBinding"]
            return access_review(review, roles, bindings)

    def _current(self, res: Resource, obj: Obj) -> tuple[_Key, Obj]:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        key = self._key(res, name, meta.get("namespace"))
        current = self._objects.get(key)
        if current is None:
            raise NotFound(f'{self._qualified(res)} "{name}" not found')
        rv = meta.get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise self._conflict(res, name)
        uid = meta.get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise Conflict(
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {current['metadata']['uid']}"
            )
        return key, current

    def _store(self, res: Resource, key: _Key, obj: Obj) -> Obj:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[key]
            meta["resourceVersion"] = self._bump()
            self._emit(res.kind, "DELETED", obj)
        else:
            meta["resourceVersion"] = self._bump()
            self._objects[key] = obj
            self._emit(res.kind, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def update(self, kind: str, obj: Obj) -> Obj:
        res = self._resource(kind)
        obj = copy.deepcopy(obj)
        with self._lock:
            self.calls.append(("update", kind))
            key, current = self._current(res, obj)
            if res.has_status:
                if "status" in current:
                    obj["status"] = copy.deepcopy(current["status"])
                else:
                    obj.pop("status", None)
            if kind == "ResourceClaim" and obj.get("spec") != current.get("spec"):
                raise Invalid(
                    f'ResourceClaim.resource.k8s.io "{obj["metadata"]["name"]}" is invalid: spec: Invalid value: '
                    '"object": field is immutable'
                )
            self._admit(res, obj)
            meta, old = obj["metadata"], current["metadata"]
            for field in ("uid", "creationTimestamp", "deletionTimestamp"):
                if field in old:
                    meta[field] = old[field]
            meta["generation"] = old.get("generation", 1) + (obj.get("spec") != current.get("spec"))
            if old.get("deletionTimestamp") and set(meta.get("finalizers") or []) - set(
                old.get("finalizers") or []
            ):
                raise Invalid(
                    f'{kind} "{meta["name"]}": no new finalizers can be added if the object is being deleted'
                )
            return self._store(res, key, obj)

    def update_status(self, kind: str, obj: Obj) -> Obj:
        res = self._resource(kind)
        if not res.has_status:
            raise NotFound(f"{kind} has no status subresource")
        with self._lock:
            self.calls.append(("update_status", kind))
            key, current = self._current(res, obj)
            new_status = copy.deepcopy(obj.get("status") or {})
            if kind == "ResourceClaim":
                self._check_claim_status(current, new_status)
            merged = copy.deepcopy(current)
            merged["status"] = new_status
            return self._store(res, key, merged)

    @staticmethod
    def _check_claim_status(current: Obj, status: Obj) -> None:
        name = current["metadata"]["name"]
        old_alloc = objects.allocation(current)
        new_alloc = status.get("allocation")
        if old_alloc and new_alloc and old_alloc != new_alloc:
            raise Invalid(
                f'ResourceClaim.resource.k8s.io "{name}" is invalid: status.allocation: Invalid value: '
                '"object": field is immutable'
            )
        requests = {r.name for r in objects.device_requests(current)}
        for i, result in enumerate(objects.raw_results(new_alloc)):
            if result.get("request", "").split("/", 1)[0] not in requests:
                raise Invalid(
                    f'ResourceClaim.resource.k8s.io "{name}" is invalid: status.allocation.devices.results[{i}].request: '
                    f'Invalid value: "{result.get("request")}": must be the name of a request in the claim'
                )
        old_reserved = {c.get("uid") for c in objects.reserved_for(current)}
        new_reserved = {c.get("uid") for c in status.get("reservedFor") or []}
        if current["metadata"].get("deletionTimestamp") and new_reserved - old_reserved:
            raise Invalid(
                f'ResourceClaim.resource.k8s.io "{name}" is invalid: status.reservedFor: Forbidden: '
                "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set"
            )
        if len(new_reserved) > 256:
            raise Invalid(f'ResourceClaim.resource.k8s.io "{name}" is invalid: status.reservedFor: Too many')

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        res = self._resource(kind)
        with self._lock:
            self.calls.append(("delete", kind))
            key = self._key(res, name, namespace)
            current = self._objects.get(key)
            if current is None:
                raise NotFound(f'{self._qualified(res)} "{name}" not found')
            meta = current["metadata"]
            if uid and uid != meta["uid"]:
                raise Conflict(
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}"
                )
            if resource_version and resource_version != meta["resourceVersion"]:
                raise Conflict(
                    f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                    f"ResourceVersion in object meta: {meta['resourceVersion']}"
                )
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = _now()
                    meta["resourceVersion"] = self._bump()
                    self._emit(kind, "MODIFIED", current)
                return
            del self._objects[key]
            meta["resourceVersion"] = self._bump()
            self._emit(kind, "DELETED", current)

    def delete_collection(
        self, kind: str, namespace: str | None = None, field_selector: str | None = None
    ) -> None:
        items, _ = self.list(kind, namespace, field_selector)
        for item in items:
            meta = item["metadata"]
            with contextlib.suppress(NotFound):
                self.delete(kind, meta["name"], meta.get("namespace"))

    def watch(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_s: float = 60.0,
        stop: threading.Event | None = None,
    ) -> Iterator[WatchEvent]:
        self._resource(kind)
        watcher = _Watcher(kind, namespace, field_selector, label_selector)
        with self._lock:
            self.calls.append(("watch", kind))
            if resource_version:
                since = int(resource_version)
                if self._history and since < self._history[0][0] - 1 and len(self._history) >= _HISTORY:
                    raise Gone(f"too old resource version: {since} ({self._history[0][0]})")
                for rv, k, event, obj in self._history:
                    if rv > since and watcher.wants(k, obj):
                        watcher.events.put((event, copy.deepcopy(obj)))
            self._watchers.append(watcher)
        return self._stream(watcher, timeout_s, stop)

    def _stream(
        self, watcher: _Watcher, timeout_s: float, stop: threading.Event | None
    ) -> Iterator[WatchEvent]:
        deadline = time.monotonic() + timeout_s
        try:
            while not (stop and stop.is_set()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    event, obj = watcher.events.get(timeout=min(remaining, 0.05))
                except queue.Empty:
                    continue
                yield WatchEvent(type=event, object=obj)
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    # -- test conveniences ---------------------------------------------------------------------
    def objects(self, kind: str) -> builtins.list[Obj]:
        items, _ = FakeKube.list(self, kind)
        return items
