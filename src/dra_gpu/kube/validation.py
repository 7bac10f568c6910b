"""ResourceSlice and DeviceClass validation with the API server's limits and wording (1.36/1.37).

Written from `pkg/apis/resource/validation/validation.go` and the limits of `k8s.io/api/resource/v1`; the
messages follow the real server's (`k8s-1.36-real/slice-validation-errors.txt`). Used by the fake API
server, so that it refuses what a real one refuses, and by the slice publisher to refuse a bad slice
before sending it. Lengths are bytes, as Go counts them. `driver_name_errors` adds the rule Kubernetes
1.38's publishing helpers enforce on the driver side (the API server still accepts such names):
attribute and capacity names are written without the driver's own domain, since an unqualified name
already belongs to it.

Longer than 500 lines: the API server's rules for two kinds, field by field in `validation.go`'s order, so that
the two can be read side by side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from dra_gpu.kube import names, objects
from dra_gpu.kube.errors import Invalid
from dra_gpu.quantity import QuantityError, parse_quantity

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
"""Also with counter consumption or list attributes: such devices are larger."""
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64
MAX_LIST_ATTRIBUTE_VALUES = 48
MAX_ID_LENGTH = 32
MAX_DRIVER_NAME = 63
MAX_POOL_NAME = 253
MAX_TAINTS = 16
MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = 10
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMES_COUNTERS_PER_DEVICE = 2
MAX_COMPATIBILITY_GROUPS = 2
"""KEP-5963 (DRADeviceCompatibilityGroups, alpha 1.37, beta planned 1.38): `maxItems` of
`consumesCounters[].compatibilityGroups`, 2 since the review of kubernetes/kubernetes PR #139795 (8 before)."""
MAX_SELECTORS = 32
MAX_CONFIGS = 32
MAX_OPAQUE_PARAMETERS = 10 * 1024
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")

_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?"
)
_SCALAR_KEYS = ("int", "bool", "string", "version")
_LIST_KEYS = ("ints", "bools", "strings", "versions")
_VALUE_KEYS = _SCALAR_KEYS + _LIST_KEYS
_C_IDENT_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric "
    "characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is "
    "'[A-Za-z_][A-Za-z0-9_]*')"
)

Obj = dict[str, Any]


def _q(value: Any) -> Any:
    return json.dumps(value)


def _invalid(where: str, value: Any, messages: list[str]) -> list[str]:
    return [f"{where}: Invalid value: {_q(value)}: {m}" for m in messages]


def _required(where: str, value: str, check: Callable[[str], list[str]]) -> list[str]:
    """`value` is required at `where`, and must pass `check` (messages as `_invalid` words them)."""
    return _invalid(where, value, check(value)) if value else [f"{where}: Required value"]


def driver_errors(driver: str, where: str) -> list[str]:
    """ValidateCSIDriverName: at most 63 bytes, a DNS subdomain once lower-cased."""
    errors = []
    if not driver:
        return [f"{where}: Required value"]
    if names.byte_length(driver) > MAX_DRIVER_NAME:
        errors.append(f"{where}: Too long: may not be more than {MAX_DRIVER_NAME} bytes")
    if names.dns1123_subdomain(driver.lower()) and not errors:
        errors += _invalid(where, driver, [names.SUBDOMAIN_MESSAGE])
    return errors


def pool_name_errors(pool: str, where: str) -> list[str]:
    """`/`-separated DNS subdomains, at most 253 bytes in all."""
    if not pool:
        return [f"{where}: Required value"]
    errors = []
    if names.byte_length(pool) > MAX_POOL_NAME:
        errors.append(f"{where}: Too long: may not be more than {MAX_POOL_NAME} bytes")
    for part in pool.split("/"):  # each part is checked on its own, as upstream does
        errors += _invalid(where, part, names.dns1123_subdomain(part))
    return errors


def _qualified_name_errors(name: str, where: str) -> list[str]:
    """An attribute or capacity name: a C identifier of at most 32 bytes, optionally behind a driver domain."""
    parts = name.split("/")
    errors: list[str] = []
    if len(parts) == 2:
        if not parts[0]:
            errors.append(f'{where}: Invalid value: "": the domain must not be empty')
        else:
            errors += driver_errors(parts[0], where)
    ident = parts[-1] if len(parts) <= 2 else name
    if len(parts) == 2 and not ident:
        return [*errors, f'{where}: Invalid value: "": the name must not be empty']
    if names.byte_length(ident) > MAX_ID_LENGTH:
        errors.append(f"{where}: Too long: may not be more than {MAX_ID_LENGTH} bytes")
    if not _C_IDENT.fullmatch(ident):
        errors.append(f"{where}: Invalid value: {_q(name)}: {_C_IDENT_MSG}")
    return errors


def metadata_errors(obj: Obj) -> list[str]:
    """ObjectMeta of a cluster-scoped object named as a DNS subdomain (a generateName prefix too)."""
    if "metadata" not in obj:
        return []
    meta = obj.get("metadata") or {}
    name, prefix = str(meta.get("name") or ""), str(meta.get("generateName") or "")
    if not name and not prefix:
        return ["metadata.name: Required value: name or generateName is required"]
    errors = []
    if name:
        errors += _invalid("metadata.name", name, names.dns1123_subdomain(name))
    if prefix:  # a prefix may end in '-' (the server appends 5 characters)
        errors += _invalid("metadata.generateName", prefix, names.dns1123_subdomain(prefix.rstrip("-") + "a"))
    return errors


def _node_selector_errors(selector: Any, where: str) -> list[str]:
    terms = (selector or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return [
            f"{where}.nodeSelectorTerms: Invalid value: {_q(terms)}: must have exactly one node selector term"
        ]
    return []


def _node_selection_errors(spec: Obj) -> list[str]:
    errors: list[str] = []
    chosen: list[str] = []
    if "nodeName" in spec and spec["nodeName"] is not None:
        if spec["nodeName"]:
            chosen.append("`nodeName`")
            errors += _invalid("spec.nodeName", spec["nodeName"], names.dns1123_subdomain(spec["nodeName"]))
        else:
            errors.append(
                'spec.nodeName: Invalid value: "": must be either unset or set to a non-empty string'
            )
    if spec.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        errors += _node_selector_errors(spec["nodeSelector"], "spec.nodeSelector")
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(flag) is not None:
            if spec[flag]:
                chosen.append(f"`{flag}`")
            else:
                errors.append(f"spec.{flag}: Invalid value: false: must be either unset or set to true")
    required = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not chosen:
        errors.append(f"spec: Required value: {required}")
    elif len(chosen) > 1:
        errors.append(
            f'spec: Invalid value: "{{{", ".join(chosen)}}}": {required}, but multiple fields are set'
        )
    return errors


def _has_list_attribute(device: Obj) -> bool:
    return any(
        isinstance(v, dict) and any(v.get(k) is not None for k in _LIST_KEYS)
        for v in (device.get("attributes") or {}).values()
    )


def slice_errors(obj: Obj) -> list[str]:
    """Every problem the API server would report for this slice, in its words."""
    errors: list[str] = metadata_errors(obj)
    spec = obj.get("spec") or {}
    devices = spec.get("devices") or []
    errors += driver_errors(str(spec.get("driver") or ""), "spec.driver")
    pool = spec.get("pool") or {}
    errors += pool_name_errors(str(pool.get("name") or ""), "spec.pool.name")
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        errors.append(
            f"spec.pool.resourceSliceCount: Invalid value: {int(pool.get('resourceSliceCount') or 0)}: "
            "must be greater than zero"
        )
    if int(pool.get("generation") or 0) < 0:
        errors.append(
            f"spec.pool.generation: Invalid value: {pool['generation']}: must be greater than or equal to zero"
        )
    errors += _node_selection_errors(spec)
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        errors.append('spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed')
    large = any(d.get("taints") or d.get("consumesCounters") or _has_list_attribute(d) for d in devices)
    limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS if large else MAX_DEVICES_PER_SLICE
    if len(devices) > limit:
        return [*errors, f"spec.devices: Too many: {len(devices)}: must have at most {limit} items"]
    errors += _named_counters_errors(
        spec.get("sharedCounters") or [], "spec.sharedCounters", "name", MAX_COUNTER_SETS_PER_SLICE
    )
    seen: set[str] = set()
    per_device = bool(spec.get("perDeviceNodeSelection"))
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        name = str(device.get("name") or "")
        errors += _required(f"{where}.name", name, names.dns1123_label)
        if name in seen:
            errors.append(f'spec.devices[{i}]: Duplicate value: "{name}"')
        seen.add(name)
        errors += _device_errors(device, where, per_device)
    return errors


def _device_errors(device: Obj, where: str, per_device: bool) -> list[str]:
    errors: list[str] = []
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            f"{where}: Invalid value: {total}: the total number of attributes and capacities must not exceed "
            f"{MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for attr, value in attributes.items():
        errors += _qualified_name_errors(attr, f"{where}.attributes")
        errors += _attribute_errors(value, f"{where}.attributes[{attr}]")
    shared = bool(device.get("allowMultipleAllocations"))
    for cap_name, cap in capacity.items():
        errors += _qualified_name_errors(cap_name, f"{where}.capacity")
        errors += _capacity_errors(f"{where}.capacity[{cap_name}]", cap or {}, shared)
    errors += _taint_errors(device.get("taints") or [], f"{where}.taints")
    errors += _named_counters_errors(
        device.get("consumesCounters") or [],
        f"{where}.consumesCounters",
        "counterSet",
        MAX_CONSUMES_COUNTERS_PER_DEVICE,
    )
    node_fields = [f for f in ("nodeName", "nodeSelector", "allNodes") if device.get(f) is not None]
    if per_device:
        chosen = [f"`{f}`" for f in node_fields if device.get(f) not in ("", False)]
        if device.get("nodeName") == "":
            errors.append(f'{where}.nodeName: Invalid value: "": must not be empty')
        elif device.get("nodeName"):
            errors += _invalid(
                f"{where}.nodeName", device["nodeName"], names.dns1123_subdomain(device["nodeName"])
            )
        if device.get("nodeSelector") is not None:
            errors += _node_selector_errors(device["nodeSelector"], f"{where}.nodeSelector")
        if device.get("allNodes") is False:
            errors.append(f"{where}.allNodes: Invalid value: false: must be either unset or set to true")
        rule = (
            "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` "
            "is set to true in the ResourceSlice spec"
        )
        if not chosen:
            errors.append(f"{where}: Required value: {rule}")
        elif len(chosen) > 1:
            errors.append(f'{where}: Invalid value: "{{{", ".join(chosen)}}}": {rule}')
    elif node_fields:
        errors.append(
            f"{where}: Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can only be set if "
            "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
        )
    errors += _binding_errors(device, where)
    return errors


def _attribute_errors(value: Any, where: str) -> list[str]:
    set_keys = [k for k in _VALUE_KEYS if isinstance(value, dict) and value.get(k) is not None]
    if len(set_keys) != 1:
        return [f"{where}: Invalid value: {json.dumps(value)}: exactly one value must be specified"]
    key = set_keys[0]
    items = value[key] if key in _LIST_KEYS else [value[key]]
    errors: list[str] = []
    if key in _LIST_KEYS:
        if not isinstance(items, list) or not items:
            return [f"{where}.{key}: Required value"]
        if len(items) > MAX_LIST_ATTRIBUTE_VALUES:
            return [
                f"{where}.{key}: Too many: {len(items)}: must have at most {MAX_LIST_ATTRIBUTE_VALUES} items"
            ]
    for n, item in enumerate(items):
        at = f"{where}.{key}" + (f"[{n}]" if key in _LIST_KEYS else "")
        if key in ("version", "versions") and not _SEMVER.fullmatch(str(item)):
            errors.append(
                f"{at}: Invalid value: {_q(item)}: must be a string compatible with semver.org spec 2.0.0"
            )
        if (
            key in ("string", "strings", "version", "versions")
            and names.byte_length(str(item)) > MAX_STRING_ATTRIBUTE
        ):
            errors.append(f"{at}: Too long: may not be more than {MAX_STRING_ATTRIBUTE} bytes")
    return errors


def _taint_errors(taints: list[Obj], where: str) -> list[str]:
    if len(taints) > MAX_TAINTS:
        return [f"{where}: Too many: {len(taints)}: must have at most {MAX_TAINTS} items"]
    errors: list[str] = []
    for i, taint in enumerate(taints):
        at = f"{where}[{i}]"
        key = str(taint.get("key") or "")
        errors += _required(f"{at}.key", key, names.qualified_name)
        if taint.get("value"):
            errors += _invalid(f"{at}.value", taint["value"], names.label_value(str(taint["value"])))
        effect = taint.get("effect") or ""
        if not effect:
            errors.append(f"{at}.effect: Required value")
        elif effect not in TAINT_EFFECTS:
            supported = ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
            errors.append(f'{at}.effect: Unsupported value: "{effect}": supported values: {supported}')
    return errors


def _binding_errors(device: Obj, where: str) -> list[str]:
    conditions = list(device.get("bindingConditions") or [])
    failures = list(device.get("bindingFailureConditions") or [])
    errors: list[str] = []
    for field, values in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(values) > MAX_BINDING_CONDITIONS:
            errors.append(
                f"{where}.{field}: Too many: {len(values)}: must have at most {MAX_BINDING_CONDITIONS} items"
            )
            continue
        seen: set[str] = set()
        for i, value in enumerate(values):
            errors += _invalid(f"{where}.{field}[{i}]", value, names.qualified_name(str(value)))
            if value in seen:
                errors.append(f'{where}.{field}[{i}]: Duplicate value: "{value}"')
            seen.add(value)
            if field == "bindingFailureConditions" and value in conditions:
                errors.append(
                    f'{where}.{field}[{i}]: Invalid value: "{value}": bindingFailureConditions must not overlap '
                    "with bindingConditions"
                )
    if failures and not conditions:
        errors.append(
            f"{where}.bindingConditions: Invalid value: []: bindingConditions are required to use "
            "bindingFailureConditions"
        )
    if conditions and not failures:
        errors.append(
            f"{where}.bindingFailureConditions: Invalid value: []: bindingFailureConditions are required to use "
            "bindingConditions"
        )
    return errors


def _named_counters_errors(entries: list[Obj], where: str, key: str, limit: int) -> list[str]:
    """A slice's counter sets (`key` "name") and a device's consumption of them (`key` "counterSet") have
    the same rules upstream: at most `limit` entries, each naming a DNS label once, with counters."""
    if len(entries) > limit:
        return [f"{where}: Too many: {len(entries)}: must have at most {limit} items"]
    errors: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        name = str(entry.get(key) or "")
        errors += _required(f"{at}.{key}", name, names.dns1123_label)
        if name in seen:
            errors.append(f'{at}: Duplicate value: "{name}"')
        seen.add(name)
        errors += _counters_errors(at, entry.get("counters") or {}, consumed=key == "counterSet")
        if "compatibilityGroups" in entry:
            errors += _compatibility_groups_errors(entry["compatibilityGroups"], f"{at}.compatibilityGroups")
    return errors


def _compatibility_groups_errors(groups: Any, where: str) -> list[str]:
    """KEP-5963's groups of one counter consumption, as kubernetes/kubernetes PR #139795 declares them
    (`+listType=atomic`, `+k8s:maxItems`, unique names): at most two, each named once. That a name is a
    DNS label is this fake's reading of the KEP (opaque names "meaningful only within the publishing
    driver's pool"); the release's validation code could not be read to confirm it."""
    if not isinstance(groups, list):
        return [f"{where}: Invalid value: {json.dumps(groups)}: must be a list of group names"]
    if len(groups) > MAX_COMPATIBILITY_GROUPS:
        return [f"{where}: Too many: {len(groups)}: must have at most {MAX_COMPATIBILITY_GROUPS} items"]
    errors: list[str] = []
    seen: set[str] = set()
    for i, group in enumerate(groups):
        name = group if isinstance(group, str) else ""
        if not name:
            errors.append(f"{where}[{i}]: Required value")
            continue
        errors += _invalid(f"{where}[{i}]", name, names.dns1123_label(name))
        if name in seen:
            errors.append(f'{where}[{i}]: Duplicate value: "{name}"')
        seen.add(name)
    return errors


def _counters_errors(where: str, counters: Obj, consumed: bool = False) -> list[str]:
    if not counters:
        return [f"{where}.counters: Required value"]
    if len(counters) > MAX_COUNTERS_PER_SET:
        return [
            f"{where}.counters: Too many: {len(counters)}: must have at most {MAX_COUNTERS_PER_SET} items"
        ]
    errors: list[str] = []
    for name, counter in counters.items():
        errors += _invalid(f"{where}.counters[{name}]", name, names.dns1123_label(name))
        value_from = (counter or {}).get("valueFrom") if consumed else None
        if value_from is not None:
            errors += _value_from_errors(f"{where}.counters[{name}]", counter or {}, value_from)
            continue
        try:
            parse_quantity((counter or {}).get("value", ""))
        except QuantityError:
            errors.append(f"{where}.counters[{name}].value: Required value")
    return errors


def _value_from_errors(where: str, counter: Obj, value_from: Any) -> list[str]:
    """KEP-5941 (DRASharedConsumableCapacity, alpha planned 1.38; kubernetes/kubernetes PR #140084, open when
    last seen): a consumed counter has exactly one of `value` and `valueFrom`, whose `capacityName` names a
    capacity of the claim's request (a qualified name)."""
    if counter.get("value") not in (None, ""):
        return [
            f'{where}: Invalid value: "value, valueFrom": exactly one of `value` or `valueFrom` is required'
        ]
    capacity = (value_from or {}).get("capacityName") if isinstance(value_from, dict) else None
    if not capacity:
        return [f"{where}.valueFrom.capacityName: Required value"]
    return _qualified_name_errors(str(capacity), f"{where}.valueFrom.capacityName")


def _capacity_errors(where: str, cap: Obj, shared: bool) -> list[str]:
    try:
        capacity = parse_quantity(cap.get("value", ""))
    except QuantityError:
        return [
            f'{where}.value: Invalid value: "{cap.get("value")}": quantities must match the regular expression'
        ]
    policy = cap.get("requestPolicy")
    if policy is None:
        return []
    where = f"{where}.requestPolicy"
    if not shared:
        return [f"{where}: Forbidden: allowMultipleAllocations must be true"]
    valid_values = policy.get("validValues") or []
    valid_range = policy.get("validRange")
    if valid_values and valid_range is not None:
        return [
            f'{where}: Forbidden: exactly one policy can be specified, cannot specify "validValues" and "validRange" '
            "at the same time"
        ]
    if not valid_values and valid_range is None:
        return []
    if policy.get("default") is None:
        kind = "validValues" if valid_values else "validRange"
        return [f"{where}.default: Required value: required when {kind} is defined"]
    try:
        default = parse_quantity(policy["default"])
        if valid_values:
            return _valid_values_errors(f"{where}.validValues", default, capacity, valid_values, cap["value"])
        return _valid_range_errors(
            f"{where}.validRange", policy["default"], default, capacity, valid_range, cap["value"]
        )
    except QuantityError as exc:
        return [f"{where}: Invalid value: {exc}"]


def _valid_values_errors(where: str, default: Any, capacity: Any, values: list[str], shown: str) -> list[str]:
    errors: list[str] = []
    parsed = [parse_quantity(v) for v in values]
    for i in range(len(parsed) - 1):
        if parsed[i] > parsed[i + 1]:
            errors.append(
                f'{where}[{i + 1}]: Invalid value: "{values[i + 1]}": values must be sorted in ascending order'
            )
    if len(values) > MAX_VALID_VALUES:
        return [*errors, f"{where}: Too many: {len(values)}: must have at most {MAX_VALID_VALUES} items"]
    for i, option in enumerate(parsed):
        if option > capacity:
            errors.append(
                f'{where}[{i}]: Invalid value: "{values[i]}": option is larger than capacity value: {shown}'
            )
    if default not in parsed:
        errors.append(
            f"{where}: Invalid value: {_q(str(default))}: default value is not valid according to the requestPolicy"
        )
    return errors


def _valid_range_errors(
    where: str, shown_default: str, default: Any, capacity: Any, valid_range: Obj, shown: str
) -> list[str]:
    if valid_range.get("min") is None:
        return [f"{where}.min: Required value: required when validRange is defined"]
    minimum = parse_quantity(valid_range["min"])
    errors: list[str] = []
    if minimum < 0:  # upstream validateInt64Range (kubernetes/kubernetes pkg/apis/resource/validation)
        errors.append(
            f'{where}.min: Invalid value: "{valid_range["min"]}": must be greater than or equal to 0'
        )
    if minimum > capacity:
        errors.append(
            f'{where}.min: Invalid value: "{valid_range["min"]}": min is larger than capacity value: {shown}'
        )
    if default < minimum:
        errors.append(
            f'{where}.min: Invalid value: "{shown_default}": default is less than min: {valid_range["min"]}'
        )
    maximum = parse_quantity(valid_range["max"]) if valid_range.get("max") is not None else None
    if maximum is not None:
        if minimum > maximum:
            errors.append(
                f'{where}.max: Invalid value: "{valid_range["min"]}": min is larger than max: {valid_range["max"]}'
            )
        if maximum > capacity:
            errors.append(
                f'{where}.max: Invalid value: "{valid_range["max"]}": max is larger than capacity value: {shown}'
            )
        if default > maximum:
            errors.append(
                f'{where}.max: Invalid value: "{shown_default}": default is more than max: {valid_range["max"]}'
            )
    if valid_range.get("step") is not None:
        step = parse_quantity(valid_range["step"])
        if step <= 0:
            return [
                *errors,
                f'{where}.step: Invalid value: "{valid_range["step"]}": must be greater than zero',
            ]
        if minimum + step > capacity:
            errors.append(
                f'{where}.step: Invalid value: "{valid_range["step"]}": one step {minimum + step} is larger than '
                f"capacity value: {shown}"
            )
        for value, text in ((default, shown_default), (maximum, valid_range.get("max"))):
            if value is not None and (value - minimum) % step != 0:
                errors.append(
                    f'{where}.step: Invalid value: "{text}": value is not a multiple of a given step '
                    f"({valid_range['step']}) from ({valid_range['min']})"
                )
    return errors


def device_class_errors(obj: Obj) -> list[str]:
    """Every problem the API server would report for this DeviceClass."""
    errors = metadata_errors(obj)
    spec = obj.get("spec") or {}
    selectors = spec.get("selectors") or []
    if len(selectors) > MAX_SELECTORS:
        errors.append(f"spec.selectors: Too many: {len(selectors)}: must have at most {MAX_SELECTORS} items")
    for i, selector in enumerate(selectors[:MAX_SELECTORS]):
        if not ((selector or {}).get("cel") or {}).get("expression"):
            errors.append(f"spec.selectors[{i}].cel.expression: Required value")
    configs = spec.get("config") or []
    if len(configs) > MAX_CONFIGS:
        errors.append(f"spec.config: Too many: {len(configs)}: must have at most {MAX_CONFIGS} items")
    for i, config in enumerate(configs[:MAX_CONFIGS]):
        opaque = (config or {}).get("opaque")
        if opaque is None:
            errors.append(f"spec.config[{i}].opaque: Required value")
            continue
        errors += driver_errors(str(opaque.get("driver") or ""), f"spec.config[{i}].opaque.driver")
        parameters = opaque.get("parameters")
        where = f"spec.config[{i}].opaque.parameters"
        if parameters is None:
            errors.append(f"{where}: Required value")
        elif not isinstance(parameters, dict):
            errors.append(f'{where}: Invalid value: "<value omitted>": must be a valid JSON object')
        elif len(json.dumps(parameters, separators=(",", ":")).encode()) > MAX_OPAQUE_PARAMETERS:
            errors.append(f"{where}: Too long: may not be more than {MAX_OPAQUE_PARAMETERS} bytes")
    extended = spec.get("extendedResourceName")
    if extended is not None and names.extended_resource_name(str(extended)):
        errors.append(
            f"spec.extendedResourceName: Invalid value: {_q(extended)}: must be a valid extended resource name"
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


def validate_device_class(obj: Obj) -> None:
    errors = device_class_errors(obj)
    if errors:
        raise Invalid(f'DeviceClass.resource.k8s.io "{objects.name(obj)}" is invalid: ' + "; ".join(errors))


def validate_resource_slice(obj: dict[str, Any]) -> None:
    """Raise Invalid with the API server's message format if the slice would be refused."""
    errors = slice_errors(obj)
    if errors:
        name = objects.name(obj) or str(objects.metadata(obj).get("generateName") or "")
        raise Invalid(f'The ResourceSlice "{name}" is invalid: ' + "; ".join(errors))
