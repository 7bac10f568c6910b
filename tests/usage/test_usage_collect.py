"""`dra_gpu.usage.collect`: who holds which GPU, from real 1.36 objects and from hand-made edge cases."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import pytest
from repo_paths import TESTS

from dra_gpu import DRIVER_NAME
from dra_gpu.controller.owned_classes import with_marker
from dra_gpu.quantity import parse_quantity
from dra_gpu.slices.devices import unhealthy_taint
from dra_gpu.usage import Gpu, Usage, collect, render_table, to_json
from dra_gpu.usage.render import MPS_ISOLATION

FIXTURES = TESTS / "fixtures" / "k8s-1.36-real"
Obj = dict[str, Any]


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def real() -> Usage:
    return collect(
        [load("resourceslice-as-stored.json")], load("resourceclaims-after-scheduling.json")["items"]
    )


def gpu_of(usage: Usage, device: str, node: str | None = None) -> Gpu:
    found = [g for n in usage.nodes for g in n.gpus if g.device == device and node in (None, n.name)]
    assert len(found) == 1, f"{device} on {node}: {found}"
    return found[0]


def holders(gpu: Gpu) -> dict[str, Any]:
    return {h.claim: h for h in gpu.holders}


# --- hand-made objects ---------------------------------------------------------------------------


def device(name: str, index: int, *, memory: str = "80Gi", shared: bool = True, **extra: Any) -> Obj:
    dev: Obj = {
        "name": name,
        "attributes": {
            "index": {"int": index},
            "uuid": {"string": f"GPU-{name}"},
            "sharing": {"string": "Shared" if shared else "Exclusive"},
        },
        "capacity": {"memory": {"value": memory}, "cores": {"value": "100"}},
        **extra,
    }
    if shared:
        dev["allowMultipleAllocations"] = True
    return dev


def slice_of(
    node: str, devices: list[Obj], generation: int = 1, driver: str = DRIVER_NAME, suffix: str = ""
) -> Obj:
    return {
        "metadata": {"name": f"{node}-{driver}{suffix}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def result(
    node: str,
    dev: str,
    consumed: dict[str, str] | None = None,
    request: str = "gpu",
    driver: str = DRIVER_NAME,
) -> Obj:
    out: Obj = {"driver": driver, "pool": node, "device": dev, "request": request}
    if consumed:
        out["consumedCapacity"] = consumed
        out["shareID"] = f"share-{dev}-{request}"
    return out


def claim(
    name: str,
    results: list[Obj] | None,
    *,
    node: str = "node-a",
    device_class: str = "limiter.gpu.dra-gpu.io",
    config: list[Obj] | None = None,
    pods: Sequence[str] = (),
    finalizers: Sequence[str] = ("resource.kubernetes.io/delete-protection",),
    capacity: dict[str, str] | None = None,
    count: int = 1,
) -> Obj:
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    obj: Obj = {
        "metadata": {"name": name, "namespace": "team", "finalizers": list(finalizers)},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {},
    }
    if results is not None:
        obj["status"]["allocation"] = {
            "devices": {"results": results, "config": config or []},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    return obj


def limiter_config(source: str = "FromClass", parameters: Obj | None = None) -> Obj:
    params = parameters or {
        "apiVersion": "gpu.dra-gpu.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Limiter"},
    }
    return {"source": source, "requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": params}}


# --- the real 1.36 objects -----------------------------------------------------------------------


def test_real_claims_on_the_shared_gpu_are_all_listed_with_their_shares(real: Usage) -> None:
    gpu0 = gpu_of(real, "gpu-0", "node-1")
    held = holders(gpu0)
    assert sorted(held) == [
        "default/ctrl-alloc",
        "default/ctrl-alloc-ts",
        "default/rbac-probe",
        "default/share-a",
        "default/share-b",
        "default/shared",
    ]
    # 10.5Gi was rounded up to the 1Gi step by the scheduler: the consumed 11Gi is what counts.
    assert held["default/share-b"].consumed == {"cores": "30", "memory": "11Gi"}
    assert held["default/share-a"].share_id == "169a99b2-6ee5-41fd-bf56-9cc1e25d5c5b"
    assert gpu0.used() == {"cores": 92, "memory": parse_quantity("32Gi")}
    assert gpu0.free() == {"cores": 8, "memory": parse_quantity("48Gi")}
    assert gpu0.sharing == "Limiter" and gpu0.shareable and not gpu0.overcommitted


def test_real_pods_and_allocators(real: Usage) -> None:
    held = holders(gpu_of(real, "gpu-0"))
    assert held["default/shared"].pods == ["pod-s1", "pod-s2"]  # one claim, two pods
    assert held["default/ctrl-alloc"].pods == []  # never reserved: no timestamp, the pod never bound
    assert held["default/ctrl-alloc-ts"].pods == ["pod-ctrl-ts"]
    assert held["default/ctrl-alloc"].allocated_by == "controller"
    assert held["default/share-a"].allocated_by == "scheduler"
    assert held["default/rbac-probe"].allocated_by == "other"  # status written by hand, no finalizer


def test_real_strategy_comes_from_the_merged_config(real: Usage) -> None:
    held = holders(gpu_of(real, "gpu-0"))
    assert held["default/share-a"].strategy == "Limiter"
    # No config in the allocation: the default GpuConfig, Exclusive.
    assert held["default/ctrl-alloc-ts"].strategy == "Exclusive"
    # share-b's claim-level config carries a field GpuConfig does not have: shown, not a crash.
    bad = held["default/share-b"]
    assert bad.strategy is None
    assert bad.strategy_text.startswith("invalid config: FromClaim config #1 for request 'gpu'")
    assert "note: unknown field" in bad.strategy_text


def test_real_template_claim_holds_the_whole_plain_gpu(real: Usage) -> None:
    gpu1 = gpu_of(real, "gpu-1")
    assert [h.claim for h in gpu1.holders] == ["default/pod-t-gpu-fmmjp"]
    holder = gpu1.holders[0]
    assert holder.whole and holder.pods == ["pod-t"]
    assert gpu1.used() == gpu1.capacity and not gpu1.shareable and gpu1.sharing == "Exclusive"


def test_real_pending_claims_with_what_they_ask(real: Usage) -> None:
    pending = {p.claim: p for p in real.pending}
    assert sorted(pending) == [
        "default/share-c-asks-nothing",
        "default/share-d-too-many-cores",
        "default/whole-2",
    ]
    too_many = pending["default/share-d-too-many-cores"].requests
    assert [(r.request, r.device_class, r.capacity) for r in too_many] == [
        ("gpu", "limiter.gpu.dra-gpu.io", {"cores": "25", "memory": "10Gi"})
    ]
    assert pending["default/share-c-asks-nothing"].requests[0].capacity == {}
    assert pending["default/whole-2"].requests[0].device_class == "gpu.dra-gpu.io"


def test_real_table_names_every_holder_under_its_gpu(real: Usage) -> None:
    text = render_table(real)
    gpu0_block, gpu1_block = text.split("  gpu-1  ")[0], text.split("  gpu-1  ")[1].split("pending claims")[0]
    assert "memory 32 GiB of 80 GiB, cores 92 of 100 used" in gpu0_block
    assert "default/shared" in gpu0_block and "pod-s1, pod-s2" in gpu0_block
    assert "default/pod-t-gpu-fmmjp" in gpu1_block and "whole GPU taken" in gpu1_block
    assert "default/pod-t-gpu-fmmjp" not in gpu0_block
    share_b = next(line for line in gpu0_block.splitlines() if "default/share-b" in line)
    assert "11Gi memory, 30 cores" in share_b and "invalid config: " in share_b
    assert "default/share-d-too-many-cores" in text.split("pending claims")[1]


# --- hand-made cases -----------------------------------------------------------------------------


def test_a_claim_on_two_gpus_appears_under_both_and_counts_on_each() -> None:
    slices = [slice_of("node-a", [device("gpu-0", 0), device("gpu-1", 1)])]
    two = claim(
        "pair",
        [
            result("node-a", "gpu-0", {"memory": "20Gi", "cores": "50"}),
            result("node-a", "gpu-1", {"memory": "20Gi", "cores": "50"}),
        ],
        config=[limiter_config()],
        pods=["trainer"],
        count=2,
    )
    usage = collect(slices, [two])
    for name in ("gpu-0", "gpu-1"):
        gpu = gpu_of(usage, name)
        assert [(h.claim, h.strategy, h.pods) for h in gpu.holders] == [("team/pair", "Limiter", ["trainer"])]
        assert gpu.used() == {"cores": 50, "memory": parse_quantity("20Gi")}


def test_a_workload_claim_reserved_for_a_pod_group_shows_the_group() -> None:
    """Workload claims (1.37 beta) put a PodGroup, not Pods, into `reservedFor`."""
    slices = [slice_of("node-a", [device("gpu-0", 0)])]
    workload = claim("train", [result("node-a", "gpu-0", {"memory": "40Gi", "cores": "50"})])
    workload["status"]["reservedFor"] = [
        {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers", "uid": "uid-g"},
        {"resource": "pods", "name": "debug", "uid": "uid-d"},
    ]
    usage = collect(slices, [workload])
    (holder,) = gpu_of(usage, "gpu-0").holders
    assert holder.pods == ["debug", "podgroups/trainers"]
    assert "debug, podgroups/trainers" in render_table(usage)
    assert gpu_of(usage, "gpu-0").used() == {"cores": 50, "memory": parse_quantity("40Gi")}


def test_node_filter_keeps_one_node_and_leaves_out_pending_claims() -> None:
    slices = [slice_of("node-a", [device("gpu-0", 0)]), slice_of("node-b", [device("gpu-0", 0)])]
    claims = [
        claim("on-a", [result("node-a", "gpu-0", {"memory": "1Gi", "cores": "1"})], node="node-a"),
        claim("on-b", [result("node-b", "gpu-0", {"memory": "2Gi", "cores": "2"})], node="node-b"),
        claim("waiting", None),
    ]
    everything = collect(slices, claims)
    assert [n.name for n in everything.nodes] == ["node-a", "node-b"]
    assert [p.claim for p in everything.pending] == ["team/waiting"]

    only_b = collect(slices, claims, node="node-b")
    assert [n.name for n in only_b.nodes] == ["node-b"]
    assert [h.claim for h in only_b.nodes[0].gpus[0].holders] == ["team/on-b"]
    assert only_b.pending == []
    assert collect(slices, claims, node="node-z").nodes == []
    assert render_table(collect(slices, claims, node="node-z")) == f"no GPUs of {DRIVER_NAME} on node node-z"


def test_an_invalid_opaque_config_is_shown_with_its_reason_and_nothing_else_breaks() -> None:
    slices = [slice_of("node-a", [device("gpu-0", 0)])]
    bad_params = {
        "apiVersion": "gpu.dra-gpu.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Turbo"},
    }
    claims = [
        claim(
            "bad",
            [result("node-a", "gpu-0", {"memory": "1Gi", "cores": "1"})],
            config=[limiter_config("FromClaim", bad_params)],
        ),
        claim(
            "good", [result("node-a", "gpu-0", {"memory": "1Gi", "cores": "1"})], config=[limiter_config()]
        ),
    ]
    held = holders(gpu_of(collect(slices, claims), "gpu-0"))
    assert held["team/bad"].strategy_text == (
        "invalid config: FromClaim config #0 for request 'gpu': invalid GpuConfig: "
        "sharing.strategy: unknown sharing strategy 'Turbo'; allowed: Exclusive, TimeSlicing, MPS, Limiter"
    )
    assert held["team/good"].strategy_text == "Limiter"


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = slice_of(
        "node-a", [device("gpu-0", 0, memory="80Gi"), device("gpu-9", 9)], generation=1, suffix="-old"
    )
    new = slice_of("node-a", [device("gpu-0", 0, memory="40Gi")], generation=2)
    usage = collect([old, new], [])
    assert [g.device for n in usage.nodes for g in n.gpus] == ["gpu-0"]
    assert gpu_of(usage, "gpu-0").capacity["memory"] == parse_quantity("40Gi")


def test_another_drivers_slices_claims_and_classes_are_ignored() -> None:
    slices = [
        slice_of("node-a", [device("gpu-0", 0)]),
        slice_of("node-a", [device("nic-0", 0)], driver="net.example.com"),
    ]
    mixed = claim(
        "mixed",
        [
            result("node-a", "gpu-0", {"memory": "1Gi", "cores": "1"}),
            result("node-a", "nic-0", driver="net.example.com"),
        ],
    )
    foreign = claim(
        "nic-only", [result("node-a", "nic-0", driver="net.example.com")], device_class="nic.example.com"
    )
    foreign_pending = claim("nic-waiting", None, device_class="nic.example.com")
    nic_class = {
        "metadata": {"name": "nic.example.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "net.example.com"'}}]},
    }
    usage = collect(slices, [mixed, foreign, foreign_pending], [nic_class])
    assert [g.device for n in usage.nodes for g in n.gpus] == ["gpu-0"]
    assert [h.claim for h in gpu_of(usage, "gpu-0").holders] == ["team/mixed"]
    assert usage.pending == []


def test_a_class_of_ours_is_recognised_by_its_content_not_only_its_name() -> None:
    custom = {
        "metadata": {"name": "big-gpus"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
    }
    managed = with_marker({"metadata": {"name": "packed"}, "spec": {"config": [limiter_config()]}})
    claims = [
        claim("custom", None, device_class="big-gpus", capacity={"memory": "8Gi"}),
        claim("placed", None, device_class="packed", count=2),
        claim("unknown-class", None, device_class="big-gpus-elsewhere"),
    ]
    pending = {p.claim: p for p in collect([], claims, [custom, managed]).pending}
    assert sorted(pending) == ["team/custom", "team/placed"]
    assert pending["team/custom"].allocator == "scheduler"
    assert pending["team/placed"].allocator == "controller"
    assert pending["team/placed"].requests[0].count == 2


def test_a_tainted_gpu_is_reported_unhealthy_with_its_taint() -> None:
    taint = unhealthy_taint("XID 79: fallen off the bus", "2026-01-01T00:00:00Z")
    usage = collect([slice_of("node-a", [device("gpu-0", 0, taints=[taint]), device("gpu-1", 1)])], [])
    sick, fine = gpu_of(usage, "gpu-0"), gpu_of(usage, "gpu-1")
    assert not sick.healthy and fine.healthy
    assert str(sick.taints[0]) == f"{DRIVER_NAME}/unhealthy=XID-79-fallen-off-the-bus:NoSchedule"
    text = render_table(usage)
    sick_block = text.split("  gpu-1  ")[0]
    assert "UNHEALTHY" in sick_block and f"taint {DRIVER_NAME}/unhealthy=XID-79" in sick_block
    assert "UNHEALTHY" not in text.split("  gpu-1  ")[1]
    assert to_json(usage)["nodes"][0]["gpus"][0]["taints"][0]["key"] == f"{DRIVER_NAME}/unhealthy"


def test_a_whole_gpu_holder_next_to_a_share_is_overcommitted() -> None:
    slices = [slice_of("node-a", [device("gpu-0", 0)])]
    claims = [
        claim("whole", [result("node-a", "gpu-0")], device_class=DRIVER_NAME),
        claim("share", [result("node-a", "gpu-0", {"memory": "1Gi", "cores": "1"})]),
    ]
    gpu = gpu_of(collect(slices, claims), "gpu-0")
    assert gpu.overcommitted
    assert gpu.free() == {"cores": -1, "memory": -parse_quantity("1Gi")}
    assert "OVERCOMMITTED" in render_table(collect(slices, claims))


def test_a_held_device_that_no_slice_publishes_is_still_shown_on_its_node() -> None:
    claims = [claim("orphan", [result("pool-x", "gpu-3", {"memory": "1Gi", "cores": "1"})], node="node-x")]
    usage = collect([], claims)
    gpu = gpu_of(usage, "gpu-3", "node-x")
    assert not gpu.published and [h.claim for h in gpu.holders] == ["team/orphan"]
    assert "NOT PUBLISHED" in render_table(usage)


def test_collect_does_not_change_its_inputs() -> None:
    slices = [load("resourceslice-as-stored.json")]
    claims = load("resourceclaims-after-scheduling.json")["items"]
    before = copy.deepcopy((slices, claims))
    collect(slices, claims)
    assert (slices, claims) == before


def test_mps_claims_are_shown_with_what_they_share_with_each_other() -> None:
    gpu0, gpu1 = device("gpu-0", 0), device("gpu-1", 1)
    gpu0["attributes"]["sharing"] = {"string": "MPS"}
    mps = limiter_config(
        parameters={
            "apiVersion": "gpu.dra-gpu.io/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS"},
        }
    )
    share = {"memory": "8Gi", "cores": "25"}
    claims = [
        claim("infer-a", [result("node-a", "gpu-0", share)], device_class="mps.gpu.dra-gpu.io", config=[mps]),
        claim("infer-b", [result("node-a", "gpu-0", share)], device_class="mps.gpu.dra-gpu.io", config=[mps]),
        claim("train", [result("node-a", "gpu-1", share)], config=[limiter_config()]),
    ]
    usage = collect([slice_of("node-a", [gpu0, gpu1])], claims)
    text = render_table(usage)
    assert f"isolation: 2 claims: {MPS_ISOLATION}" in text
    assert text.count("isolation:") == 1  # the limiter's GPU shares nothing tenant-writable
    gpus = to_json(usage)["nodes"][0]["gpus"]
    assert gpus[0]["isolation"] == f"2 claims: {MPS_ISOLATION}" and gpus[1]["isolation"] is None
