"""Building the Kubernetes objects the driver, the demo, the benchmarks and the tests write, and the edits a
controller makes to an object it read (a finalizer, an allocation, a reservation, a pod's node, a lease).

Objects are the JSON dicts the API server stores (`resource.k8s.io/v1`, `coordination.k8s.io/v1`, core
`v1`), with the field names and defaults it fills in. `kube/objects.py` reads them; this module is the one
place outside it that writes `metadata`, `spec` or `status`. Each edit returns a changed deep copy and
leaves the object it was given as it was, so a cached object never changes under its readers.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.kube import objects
from dra_gpu.kube.resources import RESOURCES

Obj = dict[str, Any]

RESOURCE_API = "resource.k8s.io/v1"
LEASE_API = "coordination.k8s.io/v1"


# ---- core v1: Node, Pod ----


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    unschedulable: bool = False,
) -> Obj:
    """A Ready Node labelled with its hostname."""
    spec: Obj = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    meta: Obj = {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(
    name: str,
    claims: Sequence[str],
    *,
    namespace: str = "default",
    node_name: str | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    node_selector: Mapping[str, str] | None = None,
    image: str = "busybox:1.36",
) -> Obj:
    """A pod whose one container uses each named claim (`spec.resourceClaims[].resourceClaimName`)."""
    refs = [{"name": f"claim-{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    spec: Obj = {
        "containers": [
            {"name": "main", "image": image, "resources": {"claims": [{"name": r["name"]} for r in refs]}}
        ],
        "resourceClaims": refs,
    }
    if node_name:
        spec["nodeName"] = node_name
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def bound(pod_obj: Obj, node_name: str) -> Obj:
    """The pod bound to a node (`spec.nodeName`), as the scheduler's binding sets it."""
    changed = copy.deepcopy(pod_obj)
    changed.setdefault("spec", {})["nodeName"] = node_name
    return changed


def with_container_ids(pod_obj: Obj, container_ids: Mapping[str, str]) -> Obj:
    """The pod with `status.containerStatuses` naming each container's runtime id (`containerd://...`), as
    the kubelet reports them once the containers run."""
    changed = copy.deepcopy(pod_obj)
    statuses = [{"name": n, "containerID": i} for n, i in container_ids.items()]
    changed["status"] = {**objects.status(changed), "containerStatuses": statuses}
    return changed


# ---- resource.k8s.io/v1: DeviceClass, ResourceClaim, ResourceSlice ----


def device_class(
    name: str,
    selectors: Sequence[str] = (),
    configs: Sequence[Mapping[str, Any]] = (),
    *,
    extended_resource_name: str | None = None,
) -> Obj:
    """A DeviceClass: CEL selectors and opaque configs (`opaque_config` entries)."""
    spec: Obj = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if configs:
        spec["config"] = [dict(c) for c in configs]
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {"apiVersion": RESOURCE_API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def device_taint_rule(name: str, taint: Mapping[str, Any], selector: Mapping[str, Any] | None = None) -> Obj:
    """A DeviceTaintRule adding `taint` (`key`, `value`, `effect`) to the devices `selector` (`driver`, `pool`,
    `device`; {} for all) matches; without a selector it matches none."""
    spec: Obj = {"taint": dict(taint)}
    if selector is not None:
        spec["deviceSelector"] = dict(selector)
    return {"apiVersion": RESOURCE_API, "kind": "DeviceTaintRule", "metadata": {"name": name}, "spec": spec}


def with_selectors(device_class_obj: Mapping[str, Any], selectors: Sequence[Mapping[str, Any]]) -> Obj:
    """The class with these selector entries (`{"cel": {"expression": ...}}`) instead of its own."""
    changed = copy.deepcopy(dict(device_class_obj))
    changed.setdefault("spec", {})["selectors"] = [copy.deepcopy(dict(s)) for s in selectors]
    return changed


def opaque_config(
    driver: str, parameters: Any, *, source: str | None = None, requests: Sequence[str] = ()
) -> Obj:
    """One `config` entry with opaque parameters, for the named requests (all when none); `source`
    (FromClass, FromClaim) in an allocation only."""
    entry: Obj = {"source": source} if source else {}
    if requests:
        entry["requests"] = list(requests)
    entry["opaque"] = {"driver": driver, "parameters": parameters}
    return entry


def exact_request(
    name: str,
    device_class_name: str,
    *,
    capacity: Mapping[str, str] | None = None,
    count: int = 1,
    selectors: Sequence[str] = (),
) -> Obj:
    """One `spec.devices.requests[]` entry with `exactly`, defaults filled in as the API server stores it.

    selectors: CEL expressions the device must match (`device.attributes[...]`).
    """
    exactly: Obj = {"deviceClassName": device_class_name, "allocationMode": "ExactCount", "count": count}
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def claim_spec(
    requests: Sequence[Mapping[str, Any]],
    *,
    configs: Sequence[Mapping[str, Any]] = (),
    constraints: Sequence[Mapping[str, Any]] = (),
) -> Obj:
    """A ResourceClaim's (or a template's claim) `spec`: its requests, constraints and opaque configs."""
    devices: Obj = {"requests": [copy.deepcopy(dict(r)) for r in requests]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if configs:
        devices["config"] = [dict(c) for c in configs]
    return {"devices": devices}


def resource_claim(
    name: str,
    requests: Sequence[Mapping[str, Any]],
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    configs: Sequence[Mapping[str, Any]] = (),
    constraints: Sequence[Mapping[str, Any]] = (),
    uid: str | None = None,
) -> Obj:
    """A ResourceClaim with these requests (`exact_request` entries, or `firstAvailable` ones); `uid` for a
    claim that stands for a stored one without being stored."""
    meta: Obj = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if labels:
        meta["labels"] = dict(labels)
    spec = claim_spec(requests, configs=configs, constraints=constraints)
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaim", "metadata": meta, "spec": spec}


def claim(
    name: str,
    device_class_name: str,
    *,
    namespace: str = "default",
    capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    count: int = 1,
    request: str | Sequence[str] = "gpu",
    selectors: Sequence[str] = (),
) -> Obj:
    """A ResourceClaim with one `exactly` request of this class (or one per name given as `request`)."""
    names = [request] if isinstance(request, str) else list(request)
    requests = [
        exact_request(n, device_class_name, capacity=capacity, count=count, selectors=selectors)
        for n in names
    ]
    return resource_claim(name, requests, namespace=namespace, labels=labels)


def claim_template(name: str, spec: Mapping[str, Any], *, namespace: str = "default") -> Obj:
    """A ResourceClaimTemplate whose claims get this `spec` (`claim_spec`)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": copy.deepcopy(dict(spec))},
    }


def device_result(
    request: str,
    driver: str,
    pool: str,
    device: str,
    *,
    share_id: str | None = None,
    consumed: Mapping[str, str] | None = None,
    admin_access: bool = False,
) -> Obj:
    """One `status.allocation.devices.results[]` entry; `shareID`, `consumedCapacity` and `adminAccess` only
    when set."""
    result: Obj = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id:
        result["shareID"] = share_id
    if consumed is not None:
        result["consumedCapacity"] = dict(consumed)
    if admin_access:
        result["adminAccess"] = True
    return result


def allocation(
    results: Sequence[Mapping[str, Any]],
    configs: Sequence[Mapping[str, Any]] = (),
    *,
    node_name: str | None = None,
    timestamp: str | None = None,
) -> Obj:
    """A claim's `status.allocation`: its device results and configs, the node it is tied to (the one
    `matchFields metadata.name In [node]` term the scheduler writes) and `allocationTimestamp`."""
    devices: Obj = {"results": [dict(r) for r in results]}
    if configs:
        devices["config"] = [dict(c) for c in configs]
    allocated: Obj = {"devices": devices}
    if node_name:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        allocated["nodeSelector"] = {"nodeSelectorTerms": [term]}
    if timestamp:
        allocated["allocationTimestamp"] = timestamp
    return allocated


def with_allocation(claim_obj: Obj, allocated: Mapping[str, Any]) -> Obj:
    """The claim with `status.allocation` set (the rest of its status kept)."""
    changed = copy.deepcopy(claim_obj)
    changed["status"] = {**objects.status(changed), "allocation": copy.deepcopy(dict(allocated))}
    return changed


def without_allocation(claim_obj: Obj) -> Obj:
    """The claim deallocated: `status.allocation`, `reservedFor` and `devices` gone, the rest kept."""
    changed = copy.deepcopy(claim_obj)
    dropped = ("allocation", "reservedFor", "devices")
    changed["status"] = {k: v for k, v in objects.status(changed).items() if k not in dropped}
    return changed


def pod_reference(name: str, uid: str) -> Obj:
    """A `status.reservedFor[]` entry naming a pod."""
    return {"resource": "pods", "name": name, "uid": uid}


def consumer(pod_obj: Obj) -> Obj:
    """A pod as a `status.reservedFor[]` entry."""
    return pod_reference(objects.name(pod_obj), objects.uid(pod_obj))


def with_reservation(claim_obj: Obj, *consumers: Mapping[str, Any]) -> Obj:
    """The claim reserved for these consumers as well (`status.reservedFor`; one already there is kept
    once)."""
    changed = copy.deepcopy(claim_obj)
    reserved = list(objects.reserved_for(changed))
    known = {r.get("uid") for r in reserved}
    reserved += [dict(c) for c in consumers if c.get("uid") not in known]
    changed["status"] = {**objects.status(changed), "reservedFor": reserved}
    return changed


def allocated_claim(claim_obj: Obj, allocated: Mapping[str, Any], *consumers: Mapping[str, Any]) -> Obj:
    """The claim as the API server returns it after scheduling: allocated, and reserved when consumers are
    given."""
    changed = with_allocation(claim_obj, allocated)
    return with_reservation(changed, *consumers) if consumers else changed


def resource_slice(
    spec: Mapping[str, Any],
    *,
    name: str | None = None,
    generate_name: str | None = None,
    owner_references: Sequence[Mapping[str, Any]] | None = None,
) -> Obj:
    """A ResourceSlice with this spec (`slice_spec`), named or to be named by the server."""
    meta: Obj = {}
    if name:
        meta["name"] = name
    if generate_name:
        meta["generateName"] = generate_name
    if owner_references is not None:
        meta["ownerReferences"] = [dict(r) for r in owner_references]
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", "metadata": meta, "spec": dict(spec)}


def slice_spec(
    driver: str,
    node_name: str,
    pool: str,
    *,
    devices: Sequence[Mapping[str, Any]] | None = None,
    shared_counters: Sequence[Mapping[str, Any]] | None = None,
    generation: int | None = None,
    slice_count: int | None = None,
) -> Obj:
    """A node-local slice's spec: its devices or its shared counter sets, in `pool` (generation and slice
    count set when given)."""
    pool_obj: Obj = {"name": pool}
    if generation is not None:
        pool_obj["generation"] = generation
    if slice_count is not None:
        pool_obj["resourceSliceCount"] = slice_count
    spec: Obj = {"driver": driver, "nodeName": node_name, "pool": pool_obj}
    if devices is not None:
        spec["devices"] = [dict(d) for d in devices]
    if shared_counters is not None:
        spec["sharedCounters"] = [dict(c) for c in shared_counters]
    return spec


def with_spec(obj: Obj, spec: Mapping[str, Any], owner_references: Sequence[Mapping[str, Any]] | None) -> Obj:
    """A stored object with a new spec (and owner references, when given), for an update."""
    changed = copy.deepcopy(obj)
    changed["spec"] = dict(spec)
    if owner_references is not None:
        changed.setdefault("metadata", {})["ownerReferences"] = [dict(r) for r in owner_references]
    return changed


# ---- any object ----


def subject(kind: str, name: str, namespace: str | None, uid: str) -> Obj:
    """An object known by its identity only (`kind`, name, namespace, uid), e.g. as the subject of an Event."""
    meta: Obj = {"uid": uid, "name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": RESOURCES[kind].api_version, "kind": kind, "metadata": meta}


def with_status(obj: Mapping[str, Any], status: Mapping[str, Any]) -> Obj:
    """The object with this `status` instead of its own (a create carries none; a status write sets it)."""
    changed = copy.deepcopy(dict(obj))
    changed["status"] = copy.deepcopy(dict(status))
    return changed


def with_finalizer(obj: Obj, finalizer: str) -> Obj:
    """The object with `finalizer` added to `metadata.finalizers` (once)."""
    changed = copy.deepcopy(obj)
    present = objects.finalizers(changed)
    if finalizer not in present:
        changed.setdefault("metadata", {})["finalizers"] = [*present, finalizer]
    return changed


def without_finalizer(obj: Obj, finalizer: str) -> Obj:
    """The object with `finalizer` gone from `metadata.finalizers`."""
    changed = copy.deepcopy(obj)
    changed.setdefault("metadata", {})["finalizers"] = [
        f for f in objects.finalizers(changed) if f != finalizer
    ]
    return changed


# ---- coordination.k8s.io/v1: Lease ----


def lease(name: str, namespace: str, holder: str, duration_s: int, stamp: str) -> Obj:
    """A new Lease held by `holder`, acquired and renewed at `stamp` (a MicroTime)."""
    spec: Obj = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_s,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": 0,
    }
    return {
        "apiVersion": LEASE_API,
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def renewed(lease_obj: Obj, holder: str, duration_s: int, stamp: str) -> Obj:
    """The Lease renewed by `holder` at `stamp`; taken over (acquired, one more transition) when another
    held it. An empty `holder` releases it."""
    changed = copy.deepcopy(lease_obj)
    spec = changed.setdefault("spec", {})
    if holder and holder != objects.lease_holder(lease_obj):
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = objects.lease_transitions(lease_obj) + 1
    spec.update(holderIdentity=holder, leaseDurationSeconds=duration_s, renewTime=stamp)
    return changed
