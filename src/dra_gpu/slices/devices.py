"""One `resource.k8s.io/v1` device per GPU, in the shape the API server stores.

Choices a user notices:

- Capacity `memory` is the GPU's memory rounded *down* to `MEMORY_STEP` (256 MiB). The API server
  requires a request policy's `default` and `max` to be `min + n * step`, and NVML's totals are not
  round numbers (an H100 80GB reports 81559 MiB), so the published capacity is the largest multiple of
  the step; at most 255 MiB per GPU, which the driver and ECC reserve anyway, is never handed out.
  256 MiB is fine-grained enough for small inference shares and keeps a claim of `10Gi` exactly
  `10Gi` (the step divides every binary GiB amount). Requests round up to the step, as the scheduler
  rounds them.
- Capacity `cores` is a percentage of the GPU's SMs: 100, step 1.
- Both policies default to the whole capacity, so a claim that asks for nothing on a shareable GPU
  gets the whole GPU, and one that asks for `memory: 10Gi, cores: 30` gets that share. A request
  that names only one of them would be charged the whole of the other, leaving the GPU unshareable:
  the claim admission policy refuses it and says what to add.
- A GPU in MIG mode is published `Exclusive` (whole GPU only, attribute `migEnabled: true`),
  whatever `--sharing` says, until MIG devices are supported: the sharing backends cannot enforce a
  share of it, so no shared class may select it.
- Versions are published as `version` attributes when they can be written as semver (`9.0` ->
  `9.0.0`, `580.95.05` -> `580.95.5`: semver forbids leading zeros), else as strings.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from dra_gpu.config import GpuSharingMode
from dra_gpu.config.modes import SHAREABLE_NODE_MODES
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.kube import objects
from dra_gpu.quantity import QuantityError, format_quantity, parse_quantity
from dra_gpu.vocabulary.device import (
    CORES_CAPACITY,
    FULL_CORES,
    MAX_STRING,
    MEMORY_CAPACITY,
    MEMORY_ISOLATION_ATTRIBUTE,
    MIG_ENABLED_ATTRIBUTE,
    MPS_NAMESPACES_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    SHARING_ATTRIBUTE,
    UNHEALTHY_TAINT_EFFECT,
    UNHEALTHY_TAINT_KEY,
    device_name,
    published_memory,
)

Obj = dict[str, Any]

SHAREABLE_MODES = SHAREABLE_NODE_MODES
"""Published shareable: the node settings of the modes that split a GPU (`config/modes.py`)."""

_NUMERIC_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def semver(text: str) -> str | None:
    """`9.0` -> `9.0.0`, `580.95.05` -> `580.95.5`; None when the text is not a dotted number."""
    value = text.strip()
    if not _NUMERIC_VERSION.match(value):
        return None
    parts = [str(int(p)) for p in value.split(".")]
    parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def fit(text: str) -> str:
    """`text` cut to MAX_STRING bytes of UTF-8 without splitting a character."""
    return text.encode("utf-8")[:MAX_STRING].decode("utf-8", "ignore")


def version_attribute(text: str) -> Obj:
    version = semver(text)
    return {"version": version} if version else {"string": fit(text.strip())}


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


def effective_mode(gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
    """The mode the GPU is published in: what `--sharing` asks, except that a MIG GPU is never shared."""
    return GpuSharingMode.EXCLUSIVE if gpu.mig_enabled else configured


def _policy(value: str, minimum: str, step: str) -> Obj:
    return {"default": value, "validRange": {"min": minimum, "max": value, "step": step}}


def build_device(
    gpu: GpuInfo, mode: GpuSharingMode, *, consumable_capacity: bool = True, taints: list[Obj] | None = None
) -> Obj:
    """The device for one GPU. `consumable_capacity=False` publishes it unshared (older API servers)."""
    mode = effective_mode(gpu, mode)
    memory, step = published_memory(gpu.memory_bytes)
    memory_text, step_text = format_quantity(memory), format_quantity(step)
    cores_text = str(FULL_CORES)
    shared = consumable_capacity and mode in SHAREABLE_MODES
    device: Obj = {
        "name": device_name(gpu.index),
        "attributes": {
            "uuid": {"string": fit(gpu.uuid)},
            "index": {"int": gpu.index},
            "productName": {"string": fit(gpu.product_name.strip())},
            "architecture": {"string": fit(gpu.architecture.strip())},
            "cudaComputeCapability": version_attribute(gpu.cuda_compute_capability),
            "driverVersion": version_attribute(gpu.driver_version),
            "cudaDriverVersion": version_attribute(gpu.cuda_driver_version),
            PCI_BUS_ID_ATTRIBUTE: {"string": gpu.pci_bus_id},
            SHARING_ATTRIBUTE: {"string": mode.value},
            MEMORY_ISOLATION_ATTRIBUTE: {"string": gpu.memory_isolation},
            MPS_NAMESPACES_ATTRIBUTE: {"bool": gpu.mps_namespaces},
            MIG_ENABLED_ATTRIBUTE: {"bool": gpu.mig_enabled},
        },
        "capacity": {
            MEMORY_CAPACITY: {"value": memory_text},
            CORES_CAPACITY: {"value": cores_text},
        },
    }
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"][MEMORY_CAPACITY]["requestPolicy"] = _policy(memory_text, step_text, step_text)
        device["capacity"][CORES_CAPACITY]["requestPolicy"] = _policy(cores_text, "1", "1")
    if taints:
        device["taints"] = taints
    return device


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
