"""Capacities named with the driver's domain (`gpu.dra-gpu.io/memory`): the claim admission policy and the
in-tree allocator give the same answer, for an install below Kubernetes 1.38 (the scheduler looks names up
verbatim: refused) and for one at 1.38 (the scheduler resolves them, kubernetes/kubernetes PR #142202:
accepted and charged as `memory`). The policy's CEL runs with the project's CEL and the Kubernetes library.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from allocator_support import (
    SHARED_CLASS,
    claim,
    gpu,
    make_allocator,
    node_slice,
    opaque,
    request,
    sharing_class,
)

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.allocator import AllocationError
from dra_gpu.allocator.cel_env import kubernetes_context
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.admission import CAPACITY_MESSAGE, LIMIT_MESSAGE
from dra_gpu.manifests.capacity_names import QUALIFIED_138_MESSAGE, QUALIFIED_MESSAGE
from dra_gpu.manifests.values import ValuesError

Obj = dict[str, Any]
OURS = f"{DRIVER_NAME}/"


@functools.cache
def compiled(min_version: str) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The claim policy of an install with `kubernetesMinVersion: <min_version>`, compiled once."""
    values = load_values().model_copy(update={"kubernetesMinVersion": min_version})
    docs = yaml.safe_load_all(render(values)["validatingadmissionpolicy.yaml"])
    spec = next(d for d in docs if d and d["metadata"]["name"] == "dra-gpu-resourceclaims")["spec"]
    variables = [(v["name"], cel.compile(v["expression"])) for v in spec["variables"]]
    rules = [(v["message"], cel.compile(v["expression"])) for v in spec["validations"]]
    return variables, rules


def refusals(min_version: str, obj: Obj) -> list[str]:
    variables, rules = compiled(min_version)
    context = kubernetes_context()
    context.add_variable("object", obj)
    values: Obj = {}
    for name, program in variables:
        context.add_variable("variables", values)
        values[name] = program.execute(context)
    context.add_variable("variables", values)
    return [message for message, program in rules if program.execute(context) is not True]


def allocated(resolve: bool, obj: Obj) -> Obj | None:
    """The allocation the in-tree allocator makes on one shared H100, or None if it refuses the claim."""
    slices = [node_slice("node-a", [gpu("gpu-0", shared=True)])]
    allocator = make_allocator(
        slices, {SHARED_CLASS: sharing_class(SHARED_CLASS, "Limiter")}, resolve_qualified_names=resolve
    )
    try:
        return allocator.allocate(obj)
    except AllocationError:
        return None


def consumed(allocation: Obj) -> Obj:
    (result,) = allocation["devices"]["results"]
    return dict(result["consumedCapacity"])


CASES = {
    "unqualified": ({"memory": "10Gi", "cores": "30"}, True),
    "qualified": ({f"{OURS}memory": "10Gi", f"{OURS}cores": "30"}, True),
    "mixed": ({f"{OURS}memory": "10Gi", "cores": "30"}, True),
    "both-forms": ({"memory": "10Gi", f"{OURS}memory": "12Gi", "cores": "30"}, False),
    "foreign-domain": ({"example.com/memory": "10Gi", "example.com/cores": "30"}, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_policy_and_allocator_agree_on_qualified_names_before_and_from_1_38(case: str) -> None:
    capacity, ok_on_138 = CASES[case]
    obj = claim("c", request(capacity=capacity))
    qualified = any("/" in name for name in capacity)
    # Below 1.38: any domain is refused, with the one-line message of before, and never allocated.
    before = refusals("1.37", obj)
    assert (QUALIFIED_MESSAGE in before, before != []) == (qualified, qualified)
    assert (allocated(False, obj) is not None) == (not qualified)
    # From 1.38: the driver's own domain is the device's name; another domain or both forms stay refused.
    assert refusals("1.38", obj) == ([] if ok_on_138 else [QUALIFIED_138_MESSAGE])
    allocation = allocated(True, obj)
    assert (allocation is not None) == ok_on_138
    if allocation is not None:
        assert consumed(allocation) == {"memory": "10Gi", "cores": "30"}, "charged as the unqualified request"


def test_on_1_38_the_other_rules_read_a_qualified_capacity_as_the_plain_one() -> None:
    one = claim("c", request(capacity={f"{OURS}memory": "10Gi"}))
    assert refusals("1.38", one) == [CAPACITY_MESSAGE], "one of memory/cores named, under its qualified name"
    params = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}
    config = opaque({**params, "sharing": {"strategy": "Limiter", "limiter": {"memoryLimit": "8Gi"}}})
    low = claim("c", request(capacity={f"{OURS}memory": "10Gi", f"{OURS}cores": "30"}), config=[config])
    assert refusals("1.38", low) == [LIMIT_MESSAGE]


@pytest.mark.parametrize(("written", "stored"), [('"1.38"', "1.38"), ("1.38", "1.38"), ("v1.40.2", "1.40")])
def test_the_minimum_kubernetes_version_value_is_read_as_major_minor(
    tmp_path: Path, written: str, stored: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(f"kubernetesMinVersion: {written}\n")
    assert load_values(path).kubernetesMinVersion == stored
    assert load_values().kubernetesMinVersion == "1.34", "the default is the oldest supported release"
    for bad in ('"1.33"', "latest"):
        path.write_text(f"kubernetesMinVersion: {bad}\n")
        with pytest.raises(ValuesError, match="kubernetesMinVersion"):
            load_values(path)
