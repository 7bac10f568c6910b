"""The DeviceClasses users pick a sharing mode with, built from the same models the driver uses.

Each class pairs a CEL selector on the `sharing` attribute the slice publisher puts on every device
with an opaque `GpuConfig` that picks the mode. The configs come from `dra_gpu.config.GpuConfig`, so
the kubelet plugin parses exactly what the classes carry.

| class | matches | strategy |
|---|---|---|
| `gpu.dra-gpu.io` | `sharing == "Exclusive" && !migEnabled` | Exclusive: the whole GPU, never one that hosts shares or has MIG enabled |
| `timeslice.gpu.dra-gpu.io` | `sharing == "Shared"` | TimeSlicing |
| `limiter.gpu.dra-gpu.io` | `sharing == "Shared"` | Limiter |
| `mps.gpu.dra-gpu.io` | `sharing == "MPS"` | MPS |
| `isolated.gpu.dra-gpu.io` | `sharing == "Shared" && memoryIsolation == "driver"` | Limiter, with the memory cap enforced by the NVIDIA driver on the container's cgroup (hard isolation: never allocated on a node whose driver cannot) |
| `mig.gpu.dra-gpu.io` | `sharing == "Exclusive" && type == "mig"` | Exclusive: one whole MIG instance, static or made at prepare (dynamic); select the profile by attribute |

Shared static MIG instances are published `Shared` like GPUs, so the limiter and time-slicing
classes already select them (with the GPUs: add a selector on `type` to ask for an instance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.config import GpuConfig, GpuSharingMode, Priority, Strategy
from dra_gpu.config.modes import MODES
from dra_gpu.controller.owned_classes import MANAGED_SELECTOR
from dra_gpu.devicekinds.mig import MIG_TYPE
from dra_gpu.inventory.capabilities import MemoryIsolation
from dra_gpu.kube import builders, objects
from dra_gpu.manifests.values import ControllerClass, Values
from dra_gpu.vocabulary.device import (
    MEMORY_ISOLATION_ATTRIBUTE,
    MIG_ENABLED_ATTRIBUTE,
    SHARING_ATTRIBUTE,
    TYPE_ATTRIBUTE,
)

Obj = dict[str, Any]


@dataclass(frozen=True)
class ClassSpec:
    name: str
    strategy: Strategy
    mode: GpuSharingMode | None
    """The GPU sharing mode the class selects; None selects every GPU of the driver."""
    isolation: MemoryIsolation | None = None
    """The memory isolation the class requires; None accepts any."""
    mig: bool = False
    """Selects MIG instances (and placements) instead of whole GPUs."""


MODE_FOR_STRATEGY = {strategy: mode.node_mode for strategy, mode in MODES.items()}
"""The GPUs a class of each strategy selects: those of its mode's node setting (`config/modes.py`)."""

CLASSES = (
    ClassSpec(DRIVER_NAME, Strategy.EXCLUSIVE, MODE_FOR_STRATEGY[Strategy.EXCLUSIVE]),
    ClassSpec(f"timeslice.{DRIVER_NAME}", Strategy.TIME_SLICING, MODE_FOR_STRATEGY[Strategy.TIME_SLICING]),
    ClassSpec(f"mps.{DRIVER_NAME}", Strategy.MPS, MODE_FOR_STRATEGY[Strategy.MPS]),
    ClassSpec(f"limiter.{DRIVER_NAME}", Strategy.LIMITER, MODE_FOR_STRATEGY[Strategy.LIMITER]),
    ClassSpec(
        f"isolated.{DRIVER_NAME}",
        Strategy.LIMITER,
        MODE_FOR_STRATEGY[Strategy.LIMITER],
        MemoryIsolation.DRIVER,
    ),
    ClassSpec(f"mig.{DRIVER_NAME}", Strategy.EXCLUSIVE, MODE_FOR_STRATEGY[Strategy.EXCLUSIVE], mig=True),
)


def selector_expression(
    mode: GpuSharingMode | None,
    driver: str = DRIVER_NAME,
    isolation: MemoryIsolation | None = None,
    mig: bool = False,
) -> str:
    expression = f'device.driver == "{driver}"'
    if mode is not None:
        expression += f' && device.attributes["{driver}"].{SHARING_ATTRIBUTE} == "{mode.value}"'
    if isolation is not None:
        expression += f' && device.attributes["{driver}"].{MEMORY_ISOLATION_ATTRIBUTE} == "{isolation.value}"'
    if mig:
        kind = f'device.attributes["{driver}"].{TYPE_ATTRIBUTE}'
        expression += f' && has({kind}) && {kind} == "{MIG_TYPE}"'
    elif mode is GpuSharingMode.EXCLUSIVE:
        # A GPU in MIG mode (whole, or its instances) is not a whole GPU to hand out: its compute
        # belongs to its instances, which the MIG class selects.
        enabled = f'device.attributes["{driver}"].{MIG_ENABLED_ATTRIBUTE}'
        expression += f" && !(has({enabled}) && {enabled})"
    return expression


def gpu_config(strategy: Strategy, values: Values, placement: Obj | None = None) -> Obj:
    sharing: Obj = {"strategy": strategy.value}
    if strategy is Strategy.TIME_SLICING:
        sharing["timeSlicing"] = {"interval": values.deviceClasses.timeSlicingInterval}
    data: Obj = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "sharing": sharing}
    if placement is not None:
        data["placement"] = placement
    return GpuConfig.model_validate(data).to_dict()


def device_class(
    name: str, expression: str, parameters: Obj, extended_resource_name: str | None = None
) -> Obj:
    return builders.device_class(
        name,
        [expression],
        [builders.opaque_config(DRIVER_NAME, parameters)],
        extended_resource_name=extended_resource_name,
    )


def device_classes(values: Values) -> list[Obj]:
    names = values.deviceClasses.extendedResourceNames
    return [
        device_class(
            c.name,
            selector_expression(c.mode, isolation=c.isolation, mig=c.mig),
            gpu_config(c.strategy, values),
            names.get(c.name),
        )
        for c in CLASSES
    ]


PRIORITY_CLASSES = tuple((f"{p.value}.limiter.{DRIVER_NAME}", p) for p in Priority)
"""One limiter class per priority, each granting that priority and a compute ceiling up to the whole GPU
(config/grants.py): not installed with the driver, an admin grants them to namespaces by quota
(docs/elastic-compute.md, "Who grants priority")."""
LATENCY_QUOTA_NAMESPACE = "inference"
"""The namespace of the example quota that grants the latency class."""


def priority_classes() -> list[Obj]:
    """The limiter class's selectors with a GpuConfig granting each priority."""
    limiter = MODE_FOR_STRATEGY[Strategy.LIMITER]
    classes = []
    for name, priority in PRIORITY_CLASSES:
        parameters = GpuConfig.model_validate(
            {
                "apiVersion": CONFIG_API_VERSION,
                "kind": CONFIG_KIND,
                "sharing": {
                    "strategy": Strategy.LIMITER.value,
                    "limiter": {"compute": {"limit": 100, "priority": priority.value}},
                },
            }
        ).to_dict()
        classes.append(device_class(name, selector_expression(limiter), parameters))
    return classes


def latency_quota() -> Obj:
    """A ResourceQuota granting one namespace up to 4 devices of the latency class."""
    name = PRIORITY_CLASSES[0][0]
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "dra-gpu-latency", "namespace": LATENCY_QUOTA_NAMESPACE},
        "spec": {"hard": {f"{name}.deviceclass.resource.k8s.io/devices": "4"}},
    }


def controller_class(spec: ControllerClass, values: Values) -> Obj:
    """A class whose claims the cluster controller places; selectors as for the strategy's own class.

    The extra `MANAGED_SELECTOR` matches no device, so the scheduler never allocates these claims
    itself; the controller drops it and allocates them with the class's placement policy.
    """
    placement = spec.placement.model_dump(mode="json", exclude_none=True)
    parameters = gpu_config(spec.strategy, values, placement)
    obj = device_class(spec.name, selector_expression(MODE_FOR_STRATEGY[spec.strategy]), parameters)
    return builders.with_selectors(obj, [*objects.class_selectors(obj), MANAGED_SELECTOR])


def controller_classes(values: Values) -> list[Obj]:
    return [controller_class(c, values) for c in values.controller.classes]
