"""Priority and ceilings come from the DeviceClass: the grant policy (evaluated with the project's CEL, once per
DeviceClass as the API server does for a policy with `paramKind`) and the node (the shares prepare reads from
the allocated claim) admit and refuse the same claims, and both name the class.

A class grants what its GpuConfig's `sharing.limiter` sets (config/grants.py): `compute.priority` (else
`standard`), `compute.limit` (else the claim's floor), `memoryLimit` (else what the scheduler charged).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from policy_cel import refusals_in

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.allocator.cel_env import kubernetes_context
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube import builders, objects
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.classes import device_classes
from dra_gpu.plugin.claims import shares_of
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.preparer_core import device_name
from dra_gpu.plugin.sharing.plan import ClaimInfo

Obj = dict[str, Any]
LIMITER = f"limiter.{DRIVER_NAME}"
GPU = SimulatedInventory("1xH100-80GB", seed="grants").gpus()[0]
POOL = "node-1"
CHARGED = {"memory": "8Gi", "cores": "30"}
"""What every claim of the table asks for, and is charged: 8Gi is a multiple of the memory step."""


def limiter_class(name: str, **limiter: Any) -> Obj:
    """A limiter class as an admin writes one: the deployed limiter class with its own grant."""
    (plain,) = [c for c in device_classes(load_values()) if objects.name(c) == LIMITER]
    parameters = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CONFIG_KIND,
        "sharing": {"strategy": "Limiter", **({"limiter": limiter} if limiter else {})},
    }
    return builders.device_class(
        name,
        [objects.cel_expression(s) for s in objects.class_selectors(plain)],
        [builders.opaque_config(DRIVER_NAME, parameters)],
    )


CLASSES = {
    "limiter": limiter_class(LIMITER),
    "latency": limiter_class(f"latency.{LIMITER}", compute={"limit": 100, "priority": "latency"}),
    "besteffort": limiter_class(f"besteffort.{LIMITER}", compute={"limit": 100, "priority": "besteffort"}),
    "capped": limiter_class(f"capped.{LIMITER}", memoryLimit="16Gi", compute={"limit": 60}),
}

# class, the claim's sharing.limiter (None: no config), admitted
TABLE: list[tuple[str, Obj | None, bool]] = [
    ("limiter", None, True),
    ("limiter", {}, True),
    ("limiter", {"compute": {"priority": "besteffort"}}, True),
    ("limiter", {"compute": {"priority": "standard"}}, True),
    ("limiter", {"compute": {"priority": "latency"}}, False),
    ("limiter", {"compute": {"limit": 30}}, True),
    ("limiter", {"compute": {"limit": 31}}, False),
    ("limiter", {"compute": {"limit": 100}}, False),
    ("limiter", {"memoryLimit": "8Gi"}, True),
    ("limiter", {"memoryLimit": "8193Mi"}, False),
    ("limiter", {"memoryLimit": "80Gi"}, False),
    ("latency", None, True),
    ("latency", {"compute": {"priority": "latency", "limit": 100}}, True),
    ("latency", {"compute": {"priority": "besteffort", "limit": 50}}, True),
    ("latency", {"memoryLimit": "8Gi"}, True),
    ("latency", {"memoryLimit": "9Gi"}, False),
    ("besteffort", None, True),
    ("besteffort", {"compute": {"priority": "besteffort"}}, True),
    ("besteffort", {"compute": {"priority": "standard"}}, False),
    ("besteffort", {"compute": {"priority": "latency", "limit": 100}}, False),
    ("besteffort", {"compute": {"limit": 100}}, True),
    ("capped", None, True),
    ("capped", {"compute": {"limit": 60}}, True),
    ("capped", {"compute": {"limit": 61}}, False),
    ("capped", {"compute": {"priority": "latency"}}, False),
    ("capped", {"memoryLimit": "16Gi"}, True),
    ("capped", {"memoryLimit": "12Gi", "compute": {"limit": 40, "priority": "besteffort"}}, True),
    ("capped", {"memoryLimit": "17Gi"}, False),
]


def grant_policy() -> Obj:
    docs = yaml.safe_load_all(render(load_values())["validatingadmissionpolicy.yaml"])
    return next(d for d in docs if d and d["metadata"]["name"] == "dra-gpu-resourceclaims-grants")


def policy_refusals(obj: Obj, classes: list[Obj]) -> list[str]:
    """The messages the API server returns for `obj`: the policy runs once per DeviceClass its binding
    selects (`selector: {}`: all of them), with that class as `params`."""
    spec = grant_policy()["spec"]
    messages: list[str] = []
    for device_class in classes:
        context = kubernetes_context()
        context.add_variable("object", obj)
        context.add_variable("params", device_class)
        messages += refusals_in(context, spec)
    return messages


def claim_of(device_class: Obj, limiter: Obj | None) -> Obj:
    configs = []
    if limiter is not None:
        parameters = {
            "apiVersion": CONFIG_API_VERSION,
            "kind": CONFIG_KIND,
            "sharing": {"strategy": "Limiter", "limiter": limiter},
        }
        configs.append(builders.opaque_config(DRIVER_NAME, parameters))
    request = builders.exact_request("gpu", objects.name(device_class), capacity=CHARGED)
    return builders.resource_claim(
        "c", [request], configs=configs, uid="0c0c0c0c-0000-4000-8000-000000000001"
    )


def allocated(obj: Obj, device_class: Obj) -> Obj:
    """The claim as the scheduler allocates it: the class's configs first, then the claim's, the request
    charged what it asks for."""
    configs = [
        builders.opaque_config(DRIVER_NAME, objects.opaque_parameters(c)[1], source="FromClass")
        for c in objects.class_configs(device_class)
    ]
    configs += [
        builders.opaque_config(DRIVER_NAME, objects.opaque_parameters(c)[1], source="FromClaim")
        for c in objects.spec(obj)["devices"].get("config", [])
    ]
    result = builders.device_result(
        "gpu",
        DRIVER_NAME,
        POOL,
        device_name(GPU),
        share_id="0c0c0c0c-0000-4000-8000-00000000000a",
        consumed=CHARGED,
    )
    return builders.with_allocation(obj, builders.allocation([result], configs, node_name=POOL))


def node_refusal(obj: Obj, device_class: Obj) -> str | None:
    """What prepare says reading the allocated claim's shares."""
    try:
        shares_of(
            allocated(obj, device_class),
            ClaimInfo("0c0c", "default", "c"),
            DRIVER_NAME,
            POOL,
            {device_name(GPU): GPU},
        )
    except PrepareError as exc:
        return exc.message
    return None


@pytest.mark.parametrize(("name", "limiter", "admitted"), TABLE, ids=[f"{c}-{v}" for c, v, _ in TABLE])
def test_the_policy_and_the_node_give_the_same_answer_and_name_the_class(
    name: str, limiter: Obj | None, admitted: bool
) -> None:
    device_class = CLASSES[name]
    obj = claim_of(device_class, limiter)
    refused_at_create = policy_refusals(obj, list(CLASSES.values()))
    refused_on_node = node_refusal(obj, device_class)
    assert (not refused_at_create, refused_on_node is None) == (admitted, admitted), (
        refused_at_create,
        refused_on_node,
    )
    if not admitted:
        class_name = objects.name(device_class)
        assert len(refused_at_create) == 1 and f"DeviceClass {class_name} " in refused_at_create[0]
        assert refused_on_node is not None and f"DeviceClass {class_name}:" in refused_on_node
        assert "\n" not in refused_on_node + refused_at_create[0]
        assert refused_at_create == policy_refusals(
            builders.claim_template("t", objects.spec(obj)), [device_class]
        )


def test_what_a_claim_leaves_out_it_takes_from_its_class() -> None:
    """A claim of a latency class that writes only its memory ceiling stays latency, with the class's ceiling."""
    obj = claim_of(CLASSES["latency"], {"memoryLimit": "8Gi"})
    done = allocated(obj, CLASSES["latency"])
    (share,) = shares_of(done, ClaimInfo("0c0c", "default", "c"), DRIVER_NAME, POOL, {device_name(GPU): GPU})
    limiter = share.config.sharing.limiter
    assert limiter is not None and limiter.compute is not None
    assert (limiter.compute.priority.value, limiter.compute.limit, limiter.memoryLimit) == (
        "latency",
        100,
        "8Gi",
    )


def test_another_drivers_class_and_claims_of_other_classes_are_not_judged_by_it() -> None:
    foreign = builders.device_class("nic.example.com", ['device.driver == "nic.example.com"'])
    obj = claim_of(CLASSES["limiter"], {"compute": {"priority": "latency"}})
    assert policy_refusals(obj, [foreign, CLASSES["latency"]]) == []
    assert len(policy_refusals(obj, [foreign, CLASSES["limiter"]])) == 1
