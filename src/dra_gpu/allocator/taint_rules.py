"""DeviceTaintRules: taints an admin puts on devices from outside their slices, honoured as the scheduler does.

The rules, from the upstream API (kubernetes/kubernetes `staging/src/k8s.io/api/resource/v1/types.go`,
`DeviceTaintRule`, GA in 1.37): a rule adds its one taint to every device its `deviceSelector` matches, "the
same effect as if the taint was specified directly in the ResourceSlice by the DRA driver"; `driver`, `pool`
and `device` each narrow the selector where set; an empty selector matches every device, and a rule without
a selector matches none (1.38, kubernetes/kubernetes#141648). Whether a request tolerates a taint, and which
effects keep a device from being allocated (NoSchedule, NoExecute), is then the same as for a slice's own
taints (`index.tolerates`, `index.blocking_taint`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dra_gpu.allocator.pools import Device
from dra_gpu.kube import objects


def matches(selector: Mapping[str, Any] | None, device: Device) -> bool:
    """Whether a rule's `deviceSelector` selects the device."""
    if selector is None:
        return False
    wanted = (selector.get("driver"), selector.get("pool"), selector.get("device"))
    return all(not want or want == have for want, have in zip(wanted, device.key, strict=True))


def apply_rules(devices: Iterable[Device], rules: Iterable[Mapping[str, Any]]) -> None:
    """Add each rule's taint to the devices it selects (after the slice's own taints)."""
    parsed = [objects.taint_rule(r) for r in rules]
    if not parsed:
        return
    for device in devices:
        added = tuple(taint for selector, taint in parsed if taint and matches(selector, device))
        if added:
            device.taints = device.taints + added
