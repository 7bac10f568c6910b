"""Reading the Kubernetes objects the driver handles: one accessor per field, instead of a `.get(` chain each time.

Objects stay the JSON dicts the API server sends (the driver passes them back, patches them and compares them),
so these are functions over mappings, typed by what they return. Each is tolerant exactly as the API is loose:
a missing or null field reads as empty (`{}`, `[]`, `""`) or as None where "absent" means something (a claim
without an allocation). Schemas: `resource.k8s.io/v1` (ResourceClaim, ResourceSlice, DeviceClass) and `v1`
metadata.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]
"""What the accessors read."""
Json = dict[str, Any]
"""What they return: the object's own dicts (JSON decoded), not copies."""


MAX_DEPTH = 64
"""Nesting kept when a document is too deep to decode whole (from the document's root: a list's
items start at depth 3). The API server accepts far deeper objects (its limit is 10,000 levels), and
Python's decoder stops at its recursion limit (about 1,000), failing the whole list."""
TOO_DEEP = f"<dropped by dra-gpu: nested deeper than {MAX_DEPTH} levels>"
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
"""A JSON string (skipped whole, brackets inside it are text) or a bracket."""


def loads(data: str | bytes) -> Any:
    """JSON as the API server sends it. A document too deep for Python's recursion limit (one object
    of a list, with opaque parameters nested a thousand levels) is decoded with each part deeper than
    MAX_DEPTH replaced by the string TOO_DEEP: that object then fails wherever its deep part is read
    (a config that does not parse), never the list it came in, and nothing downstream recurses deeply.
    """
    try:
        return json.loads(data)
    except RecursionError:
        text = data.decode() if isinstance(data, bytes | bytearray) else data
        return json.loads(cap_depth(text, MAX_DEPTH))


def cap_depth(text: str, limit: int) -> str:
    """`text` (JSON) with every object or array deeper than `limit` replaced by the string TOO_DEEP;
    iterative, so that any depth is fine."""
    pieces: list[str] = []
    copied = 0
    depth = 0
    cut: int | None = None
    for match in _STRUCTURE.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            depth += 1
            if depth > limit and cut is None:
                cut = match.start()
            continue
        if depth == limit + 1 and cut is not None:
            pieces += [text[copied:cut], json.dumps(TOO_DEEP)]
            copied, cut = match.end(), None
        depth -= 1
    pieces.append(text[copied:])
    return "".join(pieces)


def _map(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ---- metadata (every object) ----


def metadata(obj: Obj) -> Json:
    return _map(obj.get("metadata"))


def name(obj: Obj) -> str:
    return str(metadata(obj).get("name") or "")


def namespace(obj: Obj) -> str:
    return str(metadata(obj).get("namespace") or "")


def uid(obj: Obj) -> str:
    return str(metadata(obj).get("uid") or "")


def resource_version(obj: Obj) -> str:
    return str(metadata(obj).get("resourceVersion") or "")


def labels(obj: Obj) -> Json:
    return _map(metadata(obj).get("labels"))


def finalizers(obj: Obj) -> list[str]:
    return [str(f) for f in _list(metadata(obj).get("finalizers"))]


def owner_references(obj: Obj) -> list[Json]:
    return _list(metadata(obj).get("ownerReferences"))


def creation_timestamp(obj: Obj) -> str:
    """`metadata.creationTimestamp` (RFC 3339, so its text sorts by time), "" when not set."""
    return str(metadata(obj).get("creationTimestamp") or "")


def deleting(obj: Obj) -> bool:
    """Whether the object is being deleted (`metadata.deletionTimestamp` set)."""
    return bool(metadata(obj).get("deletionTimestamp"))


def spec(obj: Obj) -> Json:
    return _map(obj.get("spec"))


def status(obj: Obj) -> Json:
    return _map(obj.get("status"))


# ---- ResourceClaim ----


def allocation(claim: Obj) -> Json | None:
    """`status.allocation`, None while the claim is not allocated."""
    found = status(claim).get("allocation")
    return found if isinstance(found, dict) and found else None


def raw_results(allocated: Obj | None) -> list[Json]:
    """`devices.results` of an allocation as the API sent them (for the fake API server, which checks them);
    readers use `device_results`."""
    return _list(_map(_map(allocated).get("devices")).get("results"))


@dataclass(frozen=True)
class DeviceResult:
    """One entry of an allocation's `devices.results`, parsed once. A field of the wrong JSON type reads as
    absent; the API server's validation leaves none."""

    request: str
    """The request's name (`req/sub` for a subrequest)."""
    driver: str
    pool: str
    device: str
    share_id: str | None
    """`shareID`: set on a share of a device that allows several allocations; None for a whole device."""
    consumed: Json | None
    """`consumedCapacity`: capacity name -> quantity; None when the result names none."""
    admin_access: bool


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def device_result(result: Obj) -> DeviceResult:
    consumed = result.get("consumedCapacity")
    share_id = result.get("shareID")
    return DeviceResult(
        request=_text(result.get("request")),
        driver=_text(result.get("driver")),
        pool=_text(result.get("pool")),
        device=_text(result.get("device")),
        share_id=share_id if isinstance(share_id, str) and share_id else None,
        consumed=consumed if isinstance(consumed, dict) else None,
        admin_access=bool(result.get("adminAccess")),
    )


def device_results(allocated: Obj | None) -> list[DeviceResult]:
    """An allocation's results, typed: one per allocated device."""
    return [device_result(_map(r)) for r in raw_results(allocated)]


def allocation_config(allocated: Obj | None) -> list[Json]:
    """`devices.config` of an allocation: the opaque configs from the claim and its classes."""
    return _list(_map(_map(allocated).get("devices")).get("config"))


def allocation_node(allocated: Obj) -> str | None:
    """The one node a node-local allocation names (`nodeSelector` term `matchFields metadata.name In [node]`, as
    the scheduler writes it); None for an allocation not tied to one node."""
    for term in _list(_map(allocated.get("nodeSelector")).get("nodeSelectorTerms")):
        for req in _list(_map(term).get("matchFields")):
            values = _list(_map(req).get("values"))
            if req.get("key") == "metadata.name" and req.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


def reserved_for(claim: Obj) -> list[Json]:
    """`status.reservedFor`: the consumers (pods) the claim is reserved for."""
    return _list(status(claim).get("reservedFor"))


def raw_device_requests(claim: Obj) -> list[Json]:
    """`spec.devices.requests` of a claim as the API sent them (for the fake API server, which edits them);
    readers use `device_requests`."""
    return _list(_map(spec(claim).get("devices")).get("requests"))


@dataclass(frozen=True)
class DeviceChoice:
    """A request's `exactly`, or one of its `firstAvailable` subrequests: which devices, how many, how much of
    each. A field of the wrong JSON type reads as absent, except `count`, kept as written so that the
    allocator can refuse a client-built claim by name (the API server only stores an int)."""

    name: str
    """The name its results carry: the request's (`exactly`), or `request/subrequest`."""
    subrequest: str | None
    """The subrequest's own name; None for `exactly`."""
    device_class: str
    """`deviceClassName`, "" when missing."""
    allocation_mode: str
    """`allocationMode` as written, "" when absent (the API's default is ExactCount)."""
    count: object
    """`count` as written, None when absent (the API's default is 1 for ExactCount)."""
    selectors: tuple[str, ...]
    """Each selector's CEL expression ("" for a selector without one)."""
    tolerations: tuple[Json, ...]
    capacity: Json
    """`capacity.requests`: capacity name -> quantity; empty when it names none."""
    admin_access: bool


@dataclass(frozen=True)
class DeviceRequest:
    """One entry of a claim's `spec.devices.requests`: a `name` and either `exactly` or `firstAvailable`."""

    name: str
    exactly: DeviceChoice | None
    """None when absent or empty."""
    first_available: tuple[DeviceChoice, ...]

    @property
    def choices(self) -> tuple[DeviceChoice, ...]:
        """What may satisfy it, in order: `exactly`, else the subrequests."""
        return (self.exactly,) if self.exactly is not None else self.first_available


def _choice(request: str, subrequest: str | None, raw: Obj) -> DeviceChoice:
    return DeviceChoice(
        name=f"{request}/{subrequest}" if subrequest is not None else request,
        subrequest=subrequest,
        device_class=_text(raw.get("deviceClassName")),
        allocation_mode=_text(raw.get("allocationMode")),
        count=raw.get("count"),
        selectors=tuple(cel_expression(_map(s)) for s in _list(raw.get("selectors"))),
        tolerations=tuple(_map(t) for t in _list(raw.get("tolerations"))),
        capacity=_map(_map(raw.get("capacity")).get("requests")),
        admin_access=bool(raw.get("adminAccess")),
    )


def device_request(raw: Obj) -> DeviceRequest:
    name = _text(raw.get("name"))
    exactly = _map(raw.get("exactly"))
    subs = [_map(s) for s in _list(raw.get("firstAvailable"))]
    return DeviceRequest(
        name=name,
        exactly=_choice(name, None, exactly) if exactly else None,
        first_available=tuple(_choice(name, _text(s.get("name")), s) for s in subs),
    )


def device_requests(claim: Obj) -> list[DeviceRequest]:
    """A claim's (or a claim template's) `spec.devices.requests`, typed."""
    return [device_request(_map(r)) for r in raw_device_requests(claim)]


@dataclass(frozen=True)
class DeviceConstraint:
    """One entry of `spec.devices.constraints`: the requests it names (all when empty) and the attribute
    that must match across their devices, or differ between them ("" when not set)."""

    requests: tuple[str, ...]
    match_attribute: str
    distinct_attribute: str


def device_constraints(claim: Obj) -> list[DeviceConstraint]:
    found = []
    for raw in _list(_map(spec(claim).get("devices")).get("constraints")):
        entry = _map(raw)
        found.append(
            DeviceConstraint(
                requests=tuple(str(r) for r in _list(entry.get("requests"))),
                match_attribute=_text(entry.get("matchAttribute")),
                distinct_attribute=_text(entry.get("distinctAttribute")),
            )
        )
    return found


def claim_configs(claim: Obj) -> list[Json]:
    """`spec.devices.config` of a claim: its own opaque configs, each naming the requests it applies to."""
    return _list(_map(spec(claim).get("devices")).get("config"))


def opaque_parameters(config: Obj) -> tuple[str, Any]:
    """A config entry's `opaque` driver name and parameters ("", None when it has none)."""
    opaque = _map(config.get("opaque"))
    return str(opaque.get("driver") or ""), opaque.get("parameters")


# ---- Pod and Node (`v1`) ----


def pod_phase(pod: Obj) -> str:
    """`status.phase` (Pending, Running, Succeeded, Failed, Unknown), "" when not reported yet."""
    return str(status(pod).get("phase") or "")


def pod_node(pod: Obj) -> str:
    """`spec.nodeName`, "" while the pod is not bound."""
    return str(spec(pod).get("nodeName") or "")


def pod_claim_refs(pod: Obj) -> list[Json]:
    """`spec.resourceClaims`: the pod's entries naming a claim or a claim template."""
    return _list(spec(pod).get("resourceClaims"))


CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
"""The three lists of a pod's spec that hold containers, in the order the kubelet starts them."""


def pod_containers(pod: Obj, kinds: tuple[str, ...] = CONTAINER_KINDS) -> list[Json]:
    """The containers of `spec` in the given lists (every container of the pod by default)."""
    found = spec(pod)
    return [_map(c) for kind in kinds for c in _list(found.get(kind))]


def pod_container_statuses(pod: Obj) -> list[Json]:
    """`status.initContainerStatuses`, `containerStatuses` and `ephemeralContainerStatuses`, in that order."""
    found = status(pod)
    kinds = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
    return [_map(c) for kind in kinds for c in _list(found.get(kind))]


def pod_claim_statuses(pod: Obj) -> list[Json]:
    """`status.resourceClaimStatuses`: the claim each of the pod's entries names (once made from a template)."""
    return _list(status(pod).get("resourceClaimStatuses"))


def pod_extended_claim(pod: Obj) -> str | None:
    """`status.extendedResourceClaimStatus.resourceClaimName`: the claim the scheduler made for the pod's
    extended resources; None when it has none."""
    name = _map(status(pod).get("extendedResourceClaimStatus")).get("resourceClaimName")
    return str(name) if name else None


def pod_tolerations(pod: Obj) -> list[Json]:
    return _list(spec(pod).get("tolerations"))


def pod_node_selector(pod: Obj) -> Json:
    """`spec.nodeSelector`: label -> value the node must have."""
    return _map(spec(pod).get("nodeSelector"))


def pod_required_node_affinity(pod: Obj) -> Json | None:
    """`spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution` (a node selector), or None."""
    required = _map(
        _map(_map(spec(pod).get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    return required or None


def node_unschedulable(node: Obj) -> bool:
    """Whether the node is cordoned (`spec.unschedulable`)."""
    return bool(spec(node).get("unschedulable"))


def node_taints(node: Obj) -> list[Json]:
    return _list(spec(node).get("taints"))


# ---- DeviceClass ----


def class_selectors(device_class: Obj) -> list[Json]:
    return _list(spec(device_class).get("selectors"))


def class_configs(device_class: Obj) -> list[Json]:
    return _list(spec(device_class).get("config"))


def taint_rule(rule: Obj) -> tuple[Json | None, Json]:
    """A DeviceTaintRule's `deviceSelector` (None when it has none) and `taint`."""
    selector = spec(rule).get("deviceSelector")
    return (selector if isinstance(selector, dict) else None), _map(spec(rule).get("taint"))


def cel_expression(selector: Obj) -> str:
    """A selector's CEL expression, "" when it has none."""
    return str(_map(selector.get("cel")).get("expression") or "")


# ---- ResourceSlice ----


def slice_pool(slice_obj: Obj) -> Json:
    return _map(spec(slice_obj).get("pool"))


def pool_name(slice_obj: Obj) -> str:
    return str(slice_pool(slice_obj).get("name") or "")


def pool_generation(slice_obj: Obj) -> int:
    return int(slice_pool(slice_obj).get("generation") or 0)


def pool_slice_count(slice_obj: Obj) -> int:
    """How many slices the pool's generation has (`pool.resourceSliceCount`, 1 when absent)."""
    return int(slice_pool(slice_obj).get("resourceSliceCount") or 1)


def slice_devices(slice_obj: Obj) -> list[Json]:
    return _list(spec(slice_obj).get("devices"))


def slice_node(slice_obj: Obj) -> str:
    return str(spec(slice_obj).get("nodeName") or "")


def per_device_node_selection(slice_obj: Obj) -> bool:
    """`spec.perDeviceNodeSelection`: each device names its own node (or selector)."""
    return bool(spec(slice_obj).get("perDeviceNodeSelection"))


def slice_driver(slice_obj: Obj) -> str:
    return str(spec(slice_obj).get("driver") or "")


def shared_counters(slice_obj: Obj) -> list[Json]:
    """`spec.sharedCounters`: the counter sets a slice declares (partitionable devices)."""
    return _list(spec(slice_obj).get("sharedCounters"))


# ---- Lease (`coordination.k8s.io/v1`) ----


def lease_holder(lease: Obj) -> str:
    """`spec.holderIdentity`, "" when nobody holds it."""
    return str(spec(lease).get("holderIdentity") or "")


def lease_renew_time(lease: Obj) -> str:
    return str(spec(lease).get("renewTime") or "")


def lease_duration_s(lease: Obj) -> int | None:
    """`spec.leaseDurationSeconds`, None when not set."""
    value = spec(lease).get("leaseDurationSeconds")
    return int(value) if value else None


def lease_transitions(lease: Obj) -> int:
    return int(spec(lease).get("leaseTransitions") or 0)


# ---- Device (in a slice) ----


def device_attributes(device: Obj) -> Json:
    return _map(device.get("attributes"))


def device_attribute(device: Obj, key: str) -> Json:
    """One attribute's value object (`{"string": ...}`, `{"int": ...}`, ...), empty when absent."""
    return _map(device_attributes(device).get(key))


def device_capacity(device: Obj) -> Json:
    return _map(device.get("capacity"))


def capacity_value(entry: Any) -> Any:
    """A capacity entry's `value` (a quantity string), None when absent."""
    return _map(entry).get("value")
