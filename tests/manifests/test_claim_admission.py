"""The claim admission policy refuses, at creation, the claims the node would refuse after binding.

The policy's CEL runs here with a real CEL implementation against claims shaped as the API server
stores them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from policy_cel import refusals_in

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.allocator.cel_env import kubernetes_context
from dra_gpu.kube import builders, objects
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.admission import (
    CAPACITY_MESSAGE,
    COMPUTE_FLOOR_MESSAGE,
    LIMIT_MESSAGE,
    MPS_MESSAGE,
    STRATEGY_MESSAGE,
)
from dra_gpu.manifests.capacity_names import QUALIFIED_MESSAGE

Obj = dict[str, Any]


def policy() -> Obj:
    docs = yaml.safe_load_all(render(load_values())["validatingadmissionpolicy.yaml"])
    return next(d for d in docs if d and d["metadata"]["name"] == "dra-gpu-resourceclaims")


def admitted(operation: str, obj: Obj) -> bool:
    """Whether the API server lets `operation` on `obj` through: the policy runs only on the operations
    its matchConstraints name."""
    (rule,) = policy()["spec"]["matchConstraints"]["resourceRules"]
    return operation not in rule["operations"] or not refusals(obj)


def refusals(obj: Obj) -> list[str]:
    """The messages of the validations `obj` fails, as the API server would return them."""
    spec = policy()["spec"]
    context = kubernetes_context()  # CEL with the Kubernetes library (quantity) the API server has
    context.add_variable("object", obj)
    return refusals_in(context, spec)


def request(device_class: str, capacity: dict[str, str] | None = None, name: str = "gpu") -> Obj:
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def gpu_config(requests: list[str] | None = None, **sharing: Any) -> Obj:
    entry: Obj = {
        "opaque": {
            "driver": DRIVER_NAME,
            "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "sharing": sharing},
        }
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


def claim(*requests: Obj, config: list[Obj] | None = None) -> Obj:
    return builders.resource_claim("c", requests, configs=config or ())


def template(obj: Obj) -> Obj:
    return builders.claim_template("t", objects.spec(obj))


@pytest.mark.parametrize("device_class", ["limiter", "timeslice", "mps", "isolated", "spread.limiter"])
def test_a_share_that_names_one_capacity_is_refused_saying_what_to_add(device_class: str) -> None:
    name = f"{device_class}.{DRIVER_NAME}"
    for one in ({"cores": "10"}, {"memory": "10Gi"}):
        assert refusals(claim(request(name, one))) == [CAPACITY_MESSAGE]
        assert refusals(template(claim(request(name, one)))) == [CAPACITY_MESSAGE]
    assert refusals(claim(request(name, {"memory": "10Gi", "cores": "10"}))) == []
    assert refusals(claim(request(name))) == [], "no capacity at all asks for the whole GPU"


def test_a_one_capacity_alternative_of_a_prioritized_list_is_refused() -> None:
    alternatives = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": f"limiter.{DRIVER_NAME}",
                "capacity": {"requests": {"cores": "50"}},
            },
            {"name": "whole", "deviceClassName": DRIVER_NAME},
        ],
    }
    assert refusals(claim(alternatives)) == [CAPACITY_MESSAGE]


def test_a_whole_gpu_or_another_drivers_request_is_not_checked_for_capacities() -> None:
    assert refusals(claim(request(DRIVER_NAME, {"cores": "10"}))) == []
    assert refusals(claim(request("nic.example.com", {"bandwidth": "10G"}))) == []


def test_a_claim_config_that_changes_its_class_strategy_is_refused() -> None:
    share = request(f"limiter.{DRIVER_NAME}", {"memory": "10Gi", "cores": "10"})
    assert refusals(claim(share, config=[gpu_config(strategy="MPS")])) == [STRATEGY_MESSAGE]
    assert refusals(claim(share, config=[gpu_config(["gpu"], strategy="Exclusive")])) == [STRATEGY_MESSAGE]
    tuned = gpu_config(strategy="Limiter", limiter={"memoryLimit": "12Gi"})
    assert refusals(claim(share, config=[tuned])) == []
    other = request(DRIVER_NAME, name="whole")
    assert refusals(claim(share, other, config=[gpu_config(["whole"], strategy="Exclusive")])) == []


def test_a_claim_config_that_picks_its_own_time_slice_interval_is_refused() -> None:
    share = request(f"timeslice.{DRIVER_NAME}", {"memory": "8Gi", "cores": "20"})
    long = gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Long"})
    (message,) = refusals(claim(share, config=[long]))
    assert "sets sharing.timeSlicing.interval" in message and "(Default)" in message
    same = gpu_config(strategy="TimeSlicing", timeSlicing={"interval": "Default"})
    assert refusals(claim(share, config=[same])) == []


def test_an_mps_request_must_be_the_claims_only_request_for_one_gpu() -> None:
    mps = request(f"mps.{DRIVER_NAME}", {"memory": "8Gi", "cores": "20"})
    assert refusals(claim(mps)) == []
    two = copy.deepcopy(mps)
    two["exactly"]["count"] = 2
    assert refusals(claim(two)) == [MPS_MESSAGE]
    every = copy.deepcopy(mps)
    every["exactly"]["allocationMode"] = "All"
    assert refusals(claim(every)) == [MPS_MESSAGE]
    assert refusals(claim(mps, request(DRIVER_NAME, name="whole"))) == [MPS_MESSAGE]
    assert refusals(claim(request(DRIVER_NAME, name="a"), request(DRIVER_NAME, name="b"))) == []


def test_a_memory_limit_below_the_memory_the_scheduler_will_charge_is_refused() -> None:
    def limited(memory: str, memory_limit: str | int) -> Obj:
        share = request(f"limiter.{DRIVER_NAME}", {"memory": memory, "cores": "10"})
        config = gpu_config(strategy="Limiter", limiter={"memoryLimit": memory_limit})
        return claim(share, config=[config])

    assert refusals(limited("10Gi", "8Gi")) == [LIMIT_MESSAGE]
    assert refusals(limited("10100Mi", "10100Mi")) == [LIMIT_MESSAGE], "the scheduler charges 10240Mi"
    assert refusals(limited("10100Mi", "10240Mi")) == []
    assert refusals(limited("10Gi", 16 * 2**30)) == []
    assert refusals(claim(request(f"limiter.{DRIVER_NAME}"), config=[gpu_config(strategy="Limiter")])) == []


def elastic(cores: str, compute: Any, config_cores: Any = None) -> Obj:
    """An inference claim as a user writes it: a limiter share with a compute ceiling and class."""
    share = request(f"limiter.{DRIVER_NAME}", {"memory": "8Gi", "cores": cores})
    limiter: Obj = {"compute": compute}
    if config_cores is not None:
        limiter["cores"] = config_cores
    return claim(share, config=[gpu_config(strategy="Limiter", limiter=limiter)])


def test_a_compute_ceiling_and_class_a_user_writes_pass() -> None:
    assert refusals(elastic("30", {"limit": 100, "priority": "latency"})) == []
    assert refusals(elastic("30", {"limit": 30})) == []
    assert refusals(elastic("20", {"priority": "besteffort"})) == []
    assert refusals(template(elastic("30", {"limit": 80, "priority": "standard"}))) == []


def test_a_malformed_compute_section_is_refused_saying_what_is_allowed() -> None:
    for compute in ({"limit": 150}, {"limit": 0}, {"limit": "100"}, {"priority": "realtime"}, None):
        (message,) = refusals(elastic("30", compute))
        assert (
            "malformed at sharing.limiter.compute: it takes limit (a whole number 1..100), priority (one of "
            in (message)
            or ("malformed at sharing.limiter: " in message and compute is None)
        )


def test_a_compute_ceiling_below_the_floor_the_claim_asks_for_is_refused() -> None:
    assert refusals(elastic("40", {"limit": 30})) == [COMPUTE_FLOOR_MESSAGE]
    assert refusals(elastic("30", {"limit": 30}, config_cores=50)) == [COMPUTE_FLOOR_MESSAGE]
    assert refusals(elastic("30.5", {"limit": 30})) == [COMPUTE_FLOOR_MESSAGE]
    shares = claim(
        request(f"limiter.{DRIVER_NAME}", {"memory": "8Gi", "cores": "20"}, name="small"),
        request(f"limiter.{DRIVER_NAME}", {"memory": "8Gi", "cores": "60"}, name="big"),
        config=[gpu_config(["small"], strategy="Limiter", limiter={"compute": {"limit": 50}})],
    )
    assert refusals(shares) == [], "the config applies to the small request only"


def test_other_drivers_configs_and_claims_without_devices_pass() -> None:
    foreign = {"opaque": {"driver": "nic.example.com", "parameters": {"sharing": {"strategy": "MPS"}}}}
    assert refusals(claim(request(f"limiter.{DRIVER_NAME}"), config=[foreign])) == []
    assert refusals({"kind": "ResourceClaim", "spec": {}}) == []


@pytest.mark.parametrize(
    "device_class", ["limiter", "timeslice", "mps", "isolated", "spread.limiter", "mig", ""]
)
def test_a_capacity_named_with_the_drivers_domain_is_refused_saying_to_drop_it(device_class: str) -> None:
    """On 1.34-1.37 the scheduler looks `gpu.dra-gpu.io/memory` up verbatim: admitted, it is never allocated."""
    name = f"{device_class}.{DRIVER_NAME}" if device_class else DRIVER_NAME
    qualified = {f"{DRIVER_NAME}/memory": "10Gi", f"{DRIVER_NAME}/cores": "30"}
    assert refusals(claim(request(name, qualified))) == [QUALIFIED_MESSAGE]
    assert refusals(template(claim(request(name, {f"{DRIVER_NAME}/cores": "10"})))) == [QUALIFIED_MESSAGE]
    assert refusals(claim(request("nic.example.com", {"example.com/bandwidth": "10G"}))) == []


def test_a_memory_limit_below_a_qualified_memory_request_is_not_admitted() -> None:
    """On 1.38, which resolves the domain, the node would refuse this prepare forever."""
    share = request(f"limiter.{DRIVER_NAME}", {f"{DRIVER_NAME}/memory": "10Gi", "cores": "30"})
    config = gpu_config(strategy="Limiter", limiter={"memoryLimit": "8Gi"})
    assert refusals(claim(share, config=[config])) != []


def test_the_policy_judges_a_claim_when_it_is_created_not_when_its_metadata_changes() -> None:
    """A claim the rules refuse (made before the policy, or before a rule tightened) must still be able to
    lose its finalizer: the spec is immutable, so an update has nothing new to judge."""
    old = claim(request(f"limiter.{DRIVER_NAME}", {"cores": "10"}))
    assert not admitted("CREATE", old)
    old["metadata"]["finalizers"] = []
    assert admitted("UPDATE", old)
    assert admitted("UPDATE", template(old))


def test_claims_as_users_write_them_are_admitted() -> None:
    """The README's share, a whole GPU, an MPS share, a MIG profile by attribute, a prioritized list."""
    readme = claim(
        request(f"limiter.{DRIVER_NAME}", {"memory": "10Gi", "cores": "25"}),
        config=[gpu_config(["gpu"], strategy="Limiter", limiter={"memoryLimit": "12Gi"})],
    )
    mig = request(f"mig.{DRIVER_NAME}")
    mig["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].profile == "1g.10gb"'}}
    ]
    either = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "share",
                "deviceClassName": f"limiter.{DRIVER_NAME}",
                "capacity": {"requests": {"memory": "20Gi", "cores": "50"}},
            },
            {"name": "whole", "deviceClassName": DRIVER_NAME},
        ],
    }
    for obj in (
        readme,
        claim(request(DRIVER_NAME)),
        claim(request(f"mps.{DRIVER_NAME}", {"memory": "8Gi", "cores": "20"})),
        claim(mig),
        claim(either),
        template(readme),
    ):
        assert refusals(obj) == [], obj
