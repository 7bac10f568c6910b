"""What the publisher adds to the kinds' devices, and what it checks them against: taints and the API
server's rules that `dra_gpu.kube.validation` does not check.

The devices themselves come from the device kinds (`devicekinds/`: the whole GPU in `gpu.py`, with the
published capacities and versions explained there; MIG instances in `mig.py`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from dra_gpu.config.modes import SHAREABLE_NODE_MODES
from dra_gpu.kube import names, objects
from dra_gpu.quantity import QuantityError, parse_quantity
from dra_gpu.vocabulary.device import MAX_STRING, TYPE_ATTRIBUTE, UNHEALTHY_TAINT_EFFECT, UNHEALTHY_TAINT_KEY

Obj = dict[str, Any]

SHAREABLE_MODES = SHAREABLE_NODE_MODES
"""Published shareable: the node settings of the modes that split a GPU (`config/modes.py`)."""

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def taint_value(reason: str) -> str:
    """A health reason as a label value (the API's rule for taint values): `XID 79: ...` -> `XID-79-...`."""
    cleaned = _LABEL_VALUE_BAD.sub("-", reason).strip("-._")[:63].rstrip("-._")
    return cleaned or "Unhealthy"


def unhealthy_taint(reason: str, since: str) -> Obj:
    return {
        "key": UNHEALTHY_TAINT_KEY,
        "value": taint_value(reason),
        "effect": UNHEALTHY_TAINT_EFFECT,
        "timeAdded": since,
    }


def with_compatibility_groups(devices: list[Obj]) -> list[Obj]:
    """`devices` with KEP-5963 compatibility groups on each counter consumption: the device's `type`
    (`mig` for a dynamic MIG placement), so that only devices of one kind share a GPU's counter set.

    DRADeviceCompatibilityGroups (alpha 1.37, beta planned 1.38; field `consumesCounters[].compatibilityGroups`
    from kubernetes/kubernetes PR #139795): the scheduler co-allocates two devices consuming one counter set
    only where neither names groups or their groups intersect. Today every device that consumes counters is a
    MIG placement, so the groups change no allocation: a server that drops them (gate off) allocates the
    same, and the groups are in place for a whole-GPU or shared device consuming the same set later (which
    would carry a group of its own and so never be co-allocated with an instance)."""
    out = []
    for device in devices:
        group = ((device.get("attributes") or {}).get(TYPE_ATTRIBUTE) or {}).get("string")
        entries = device.get("consumesCounters")
        if not entries or not isinstance(group, str) or names.dns1123_label(group):
            out.append(device)
            continue
        out.append({**device, "consumesCounters": [{**e, "compatibilityGroups": [group]} for e in entries]})
    return out


def _q(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def device_errors(device: Obj, where: str = "device") -> list[str]:
    """Rules of the real API server that `dra_gpu.kube.validation` does not check, in its words.

    Request-policy ranges (`default` and `max` must be `min + n * step`, `min`/`max` within the
    capacity) and semver `version` attributes, which a real API server refuses; and negative
    capacities, which it accepts although no request could ever fit.
    """
    errors: list[str] = []
    for name, attribute in (device.get("attributes") or {}).items():
        version = (attribute or {}).get("version")
        if version is not None and (len(version) > MAX_STRING or not _SEMVER.match(version)):
            errors.append(
                f'{where}.attributes[{name}].version: Invalid value: "{version}": '
                "must be a string compatible with semver.org spec 2.0.0"
            )
    for name, capacity in objects.device_capacity(device).items():
        value = _q(capacity.get("value"))
        if value is not None and value < 0:  # the API server accepts it; nothing could ever fit
            errors.append(
                f'{where}.capacity[{name}].value: Invalid value: "{capacity["value"]}": must not be negative'
            )
        valid_range = (capacity.get("requestPolicy") or {}).get("validRange")
        if value is None or not valid_range:
            continue
        path = f"{where}.capacity[{name}].requestPolicy.validRange"
        minimum, maximum, step = (_q(valid_range.get(k)) for k in ("min", "max", "step"))
        default = _q(capacity["requestPolicy"].get("default"))
        if minimum is None:
            errors.append(f"{path}.min: Required value: required when validRange is defined")
            continue
        if minimum > value:
            errors.append(
                f"{path}.min: Invalid value: min is larger than capacity value: {capacity['value']}"
            )
        if maximum is not None and maximum > value:
            errors.append(
                f"{path}.max: Invalid value: max is larger than capacity value: {capacity['value']}"
            )
        if step is not None and step > 0:
            for label, amount in (("default", default), ("max", maximum)):
                if amount is not None and (amount - minimum) % step:
                    errors.append(
                        f"{path}.step: Invalid value: {label} is not a multiple of a given step "
                        f"({valid_range['step']}) from ({valid_range['min']})"
                    )
    return errors
