"""DeviceTaintRules, honoured by the controller's allocator as the scheduler honours them.

The upstream rules (kubernetes/kubernetes `staging/src/k8s.io/api/resource/v1/types.go`, `DeviceTaintRule`,
`DeviceTaintSelector`, `DeviceToleration`; GA in 1.37): a rule adds its one taint to every device its
`deviceSelector` matches, as if the driver had put the taint in the slice; `driver`, `pool` and `device`
each narrow the selector where set, an empty selector matches all devices and a rule without one matches none
(1.38, kubernetes/kubernetes#141648). A `NoSchedule` or `NoExecute` taint keeps a device from being
allocated unless a toleration of the request matches it (`ToleratesTaint`: a toleration's empty key or
effect matches any; `Exists` ignores the value, `Equal`, the default, compares it); a `None` taint only
informs.
"""

from __future__ import annotations

from typing import Any

import pytest
from allocator_support import (
    DRIVER,
    WHOLE_CLASS,
    claim,
    devices_of,
    gpu,
    make_allocator,
    node_slice,
    request,
    standard_classes,
)

from dra_gpu.allocator import AllocationError, AllocationInput, Allocator
from dra_gpu.kube import builders

SLICES = [node_slice("node-1", [gpu("gpu-0"), gpu("gpu-1")]), node_slice("node-2", [gpu("gpu-0")])]
MAINTENANCE = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


def placed(rules: list[dict[str, Any]], **req: Any) -> set[str]:
    """Every device a one-device claim can get, one claim after another."""
    alloc = make_allocator(SLICES, taint_rules=rules)
    got: set[str] = set()
    for n in range(3):
        try:
            allocation = alloc.allocate(claim(f"c{n}", request(device_class=WHOLE_CLASS, **req)))
        except AllocationError:
            break
        got.update(devices_of(allocation))
        alloc.commit(builders.with_allocation(claim(f"c{n}", request(device_class=WHOLE_CLASS)), allocation))
    return got


@pytest.mark.parametrize(
    ("selector", "left"),
    [
        ({"driver": DRIVER, "pool": "node-1", "device": "gpu-1"}, {"node-1/gpu-0", "node-2/gpu-0"}),
        ({"device": "gpu-0"}, {"node-1/gpu-1"}),
        ({"pool": "node-1"}, {"node-2/gpu-0"}),
        ({"driver": DRIVER}, set()),
        ({}, set()),
        ({"driver": "other.example.com"}, {"node-1/gpu-0", "node-1/gpu-1", "node-2/gpu-0"}),
        (None, {"node-1/gpu-0", "node-1/gpu-1", "node-2/gpu-0"}),
    ],
    ids=["one device", "a name in every pool", "a pool", "a driver", "empty: all", "another driver", "none"],
)
def test_a_rule_taints_the_devices_its_selector_matches(
    selector: dict[str, Any] | None, left: set[str]
) -> None:
    assert placed([builders.device_taint_rule("r", MAINTENANCE, selector)]) == left


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "example.com/maintenance", "operator": "Exists"}, True),
        ({"key": "example.com/maintenance", "value": "true"}, True),
        ({"key": "example.com/maintenance", "operator": "Equal", "value": "false"}, False),
        ({"operator": "Exists"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_request_tolerating_the_rules_taint_gets_the_device(
    toleration: dict[str, Any], tolerated: bool
) -> None:
    rules = [builders.device_taint_rule("r", MAINTENANCE, {})]
    assert (placed(rules, tolerations=[toleration]) != set()) == tolerated


def test_no_execute_blocks_and_an_informational_taint_does_not() -> None:
    evict = builders.device_taint_rule("evict", {"key": "broken", "effect": "NoExecute"}, {"pool": "node-2"})
    note = builders.device_taint_rule("note", {"key": "note", "effect": "None"}, {})
    assert placed([evict, note]) == {"node-1/gpu-0", "node-1/gpu-1"}


def test_the_refusal_names_the_rules_taint_and_the_input_carries_the_rules() -> None:
    rule = builders.device_taint_rule("r", MAINTENANCE, {})
    alloc = Allocator.from_input(AllocationInput(SLICES, standard_classes(), taint_rules=[rule]))
    with pytest.raises(
        AllocationError, match=r"3 tainted, not tolerated \(.*example.com/maintenance=true:NoSchedule"
    ):
        alloc.allocate(claim("c", request(device_class=WHOLE_CLASS)))
