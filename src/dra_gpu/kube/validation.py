"""ResourceSlice validation with the API server's limits and wording (1.36, `k8s-1.36-real/`).

Used by the fake API server, and by the slice publisher to refuse a bad slice before sending it.
`driver_name_errors` adds the rule Kubernetes 1.38's publishing helpers enforce on the driver side
(the API server still accepts such names): attribute and capacity names are written without the
driver's own domain, since an unqualified name already belongs to it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dra_gpu.kube import objects
from dra_gpu.kube.errors import Invalid
from dra_gpu.quantity import QuantityError, parse_quantity

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VALUE_KEYS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
_C_IDENT_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric "
    "characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is "
    "'[A-Za-z_][A-Za-z0-9_]*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def _qualified_name_ok(name: str) -> bool:
    domain, sep, ident = name.rpartition("/")
    if sep and (len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain)):
        return False
    return bool(_C_IDENT.match(ident)) and len(ident) <= 32


def slice_errors(obj: dict[str, Any]) -> list[str]:
    """Every problem the API server would report for this slice, in its words."""
    errors: list[str] = []
    spec = obj.get("spec") or {}
    devices = spec.get("devices") or []
    tainted = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS if tainted else MAX_DEVICES_PER_SLICE
    if len(devices) > limit:
        errors.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
    if not spec.get("driver") or not _DNS_SUBDOMAIN.match(spec.get("driver", "")):
        errors.append(f'spec.driver: Invalid value: "{spec.get("driver", "")}": must be a DNS subdomain')
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errors.append("spec.pool.name: Required value")
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        errors.append("spec.pool.resourceSliceCount: Invalid value: must be greater than zero")
    if sum(1 for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)) != 1:
        errors.append(
            "spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required"
        )
    errors.extend(_counter_errors(spec))
    names: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        name = device.get("name", "")
        if not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(f'{where}.name: Invalid value: "{name}": {_LABEL_MSG}')
        if name in names:
            errors.append(f'{where}.name: Duplicate value: "{name}"')
        names.add(name)
        attributes = device.get("attributes") or {}
        capacity = device.get("capacity") or {}
        total = len(attributes) + len(capacity)
        if total > MAX_ATTRIBUTES_AND_CAPACITIES:
            errors.append(
                f"{where}: Invalid value: {total}: the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}"
            )
        for attr, value in attributes.items():
            if not _qualified_name_ok(attr):
                errors.append(f'{where}.attributes: Invalid value: "{attr}": {_C_IDENT_MSG}')
            set_keys = [k for k in _VALUE_KEYS if isinstance(value, dict) and value.get(k) is not None]
            if len(set_keys) != 1:
                errors.append(
                    f"{where}.attributes[{attr}]: Invalid value: {json.dumps(value)}: exactly one value must be specified"
                )
            elif set_keys[0] == "string" and len(str(value["string"])) > MAX_STRING_ATTRIBUTE:
                errors.append(f"{where}.attributes[{attr}].string: Too long: may not be more than 64 bytes")
        for cap_name, cap in capacity.items():
            if not _qualified_name_ok(cap_name):
                errors.append(f'{where}.capacity: Invalid value: "{cap_name}": {_C_IDENT_MSG}')
            errors.extend(
                _capacity_errors(
                    f"{where}.capacity[{cap_name}]", cap, bool(device.get("allowMultipleAllocations"))
                )
            )
    return errors


MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMES_COUNTERS_PER_DEVICE = 2


def _counter_errors(spec: dict[str, Any]) -> list[str]:
    """The 1.35+ partitionable-device rules (`reference/dra-protocol.md` §2.5)."""
    errors: list[str] = []
    sets = spec.get("sharedCounters") or []
    if sets and spec.get("devices"):
        errors.append("spec: Invalid value: a slice may carry devices or sharedCounters, not both")
    if len(sets) > MAX_COUNTER_SETS_PER_SLICE:
        errors.append(
            f"spec.sharedCounters: Too many: {len(sets)}: must have at most {MAX_COUNTER_SETS_PER_SLICE} items"
        )
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        where = f"spec.sharedCounters[{i}]"
        name = str(counter_set.get("name", ""))
        if not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(f'{where}.name: Invalid value: "{name}": {_LABEL_MSG}')
        if name in seen:
            errors.append(f'{where}.name: Duplicate value: "{name}"')
        seen.add(name)
        errors.extend(_counters_errors(where, counter_set.get("counters") or {}))
    for i, device in enumerate(spec.get("devices") or []):
        consumes = device.get("consumesCounters") or []
        where = f"spec.devices[{i}].consumesCounters"
        if len(consumes) > MAX_CONSUMES_COUNTERS_PER_DEVICE:
            errors.append(
                f"{where}: Too many: {len(consumes)}: must have at most {MAX_CONSUMES_COUNTERS_PER_DEVICE} items"
            )
        for j, entry in enumerate(consumes):
            errors.extend(_counters_errors(f"{where}[{j}]", entry.get("counters") or {}))
    return errors


def _counters_errors(where: str, counters: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    if len(counters) > MAX_COUNTERS_PER_SET:
        errors.append(
            f"{where}.counters: Too many: {len(counters)}: must have at most {MAX_COUNTERS_PER_SET} items"
        )
    for name, counter in counters.items():
        if not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(f'{where}.counters: Invalid value: "{name}": {_LABEL_MSG}')
        try:
            parse_quantity((counter or {}).get("value", ""))
        except QuantityError:
            errors.append(f"{where}.counters[{name}].value: Required value")
    return errors


def _capacity_errors(where: str, cap: dict[str, Any], shared: bool) -> list[str]:
    try:
        parse_quantity(cap.get("value", ""))
    except QuantityError:
        return [
            f'{where}.value: Invalid value: "{cap.get("value")}": quantities must match the regular expression'
        ]
    policy = cap.get("requestPolicy")
    if policy is None:
        return []
    if not shared:
        return [f"{where}.requestPolicy: Forbidden: allowMultipleAllocations must be true"]
    errors = []
    valid_range = policy.get("validRange")
    if valid_range and policy.get("validValues"):
        errors.append(f"{where}.requestPolicy: Invalid value: exactly one of validValues or validRange")
    if (valid_range or policy.get("validValues")) and policy.get("default") is None:
        errors.append(f"{where}.requestPolicy.default: Required value")
    if valid_range and policy.get("default") is not None:
        default = parse_quantity(policy["default"])
        if valid_range.get("max") is not None and default > parse_quantity(valid_range["max"]):
            errors.append(
                f'{where}.requestPolicy.validRange.max: Invalid value: "{policy["default"]}": default is more than max: '
                f"{valid_range['max']}"
            )
        if valid_range.get("min") is not None and default < parse_quantity(valid_range["min"]):
            errors.append(
                f'{where}.requestPolicy.validRange.min: Invalid value: "{policy["default"]}": default is less than min: '
                f"{valid_range['min']}"
            )
    return errors


def driver_name_errors(device: dict[str, Any], driver: str, where: str = "device") -> list[str]:
    """Attribute and capacity names that carry the driver's own domain (`<driver>/<name>`).

    Kubernetes 1.38's slice-publishing helpers refuse them: `<driver>/memory` and `memory` are the
    same name, and only the short form is canonical. Other domains (`resource.kubernetes.io/...`)
    are fine. Requests and CEL may still use either form.
    """
    errors: list[str] = []
    for field in ("attributes", "capacity"):
        for name in device.get(field) or {}:
            domain, sep, ident = str(name).rpartition("/")
            if sep and domain == driver:
                errors.append(
                    f'{where}.{field}: Invalid value: "{name}": must not carry the driver\'s own domain '
                    f'"{driver}/" (write "{ident}"; Kubernetes 1.38 refuses the qualified form)'
                )
    return errors


def validate_resource_slice(obj: dict[str, Any]) -> None:
    """Raise Invalid with the API server's message format if the slice would be refused."""
    errors = slice_errors(obj)
    if errors:
        name = objects.name(obj) or str(objects.metadata(obj).get("generateName") or "")
        raise Invalid(f'The ResourceSlice "{name}" is invalid: ' + "; ".join(errors))
