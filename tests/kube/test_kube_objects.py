"""Reading claims and slices as the real 1.36 API server returned them (tests/fixtures/k8s-1.36-real)."""

from __future__ import annotations

import json
from typing import Any

from repo_paths import TESTS

from dra_gpu.kube import objects

REAL = TESTS / "fixtures" / "k8s-1.36-real"


def _claims() -> list[dict[str, Any]]:
    return list(json.loads((REAL / "resourceclaims-after-scheduling.json").read_text())["items"])


def test_an_allocated_claim_reads_its_uid_and_config() -> None:
    claim = next(c for c in _claims() if objects.name(c) == "ctrl-alloc")
    assert objects.uid(claim) == "6cb903cc-ab58-4a81-a5d1-ffe49132d8ec"
    [config] = objects.allocation_config(objects.allocation(claim))
    driver, parameters = objects.opaque_parameters(config)
    assert driver == "gpu.dra-gpu.io" and parameters["sharing"] == {"strategy": "Limiter"}


def test_an_allocated_claim_reads_as_typed_device_results() -> None:
    claim = next(c for c in _claims() if objects.name(c) == "ctrl-alloc")
    [result] = objects.device_results(objects.allocation(claim))
    assert result.driver == "gpu.dra-gpu.io" and (result.pool, result.device, result.request) == (
        "node-1",
        "gpu-0",
        "gpu",
    )
    assert result.consumed == {"cores": "10", "memory": "4Gi"} and result.share_id and not result.admin_access


def test_a_device_result_reads_missing_null_and_mistyped_fields_as_absent() -> None:
    allocated = {"devices": {"results": [{"device": "gpu-1", "shareID": "", "consumedCapacity": None}, None]}}
    whole, empty = objects.device_results(allocated)
    assert (whole.device, whole.driver, whole.share_id, whole.consumed) == ("gpu-1", "", None, None)
    assert empty == objects.DeviceResult("", "", "", "", None, None, False)
    assert objects.device_results(None) == []


def test_a_claim_without_status_has_no_allocation_and_no_results() -> None:
    claim = {k: v for k, v in _claims()[0].items() if k != "status"}
    assert objects.allocation(claim) is None
    assert objects.device_results(objects.allocation(claim)) == []
    assert objects.reserved_for(claim) == []


def test_null_and_missing_fields_read_as_empty() -> None:
    claim: dict[str, Any] = {"metadata": None, "status": {"allocation": None, "reservedFor": None}}
    assert (objects.name(claim), objects.uid(claim), objects.labels(claim)) == ("", "", {})
    assert objects.allocation(claim) is None and objects.reserved_for(claim) == []
    assert not objects.deleting(claim)
    assert objects.deleting({"metadata": {"deletionTimestamp": "2026-11-26T10:00:00Z"}})


def test_a_stored_slice_reads_its_pool_node_and_devices() -> None:
    stored = json.loads((REAL / "resourceslice-as-stored.json").read_text())
    assert (objects.pool_name(stored), objects.pool_generation(stored), objects.slice_node(stored)) == (
        "node-1",
        1,
        "node-1",
    )
    devices = objects.slice_devices(stored)
    assert len(devices) == 2
    assert objects.capacity_value(objects.device_capacity(devices[0])["memory"]) == "80Gi"
    assert "string" in objects.device_attribute(devices[0], "architecture")
    assert objects.device_attribute(devices[0], "no-such-attribute") == {}


def test_capping_depth_keeps_strings_with_brackets_and_escapes_whole() -> None:
    text = '{"a":"}{][\\"","b":[[[1]]],"c":{"d":{"e":2}}}'
    assert objects.cap_depth(text, 10) == text
    assert json.loads(objects.cap_depth(text, 2)) == {
        "a": '}{]["',
        "b": [objects.TOO_DEEP],
        "c": {"d": objects.TOO_DEEP},
    }
    deep = "[" * 100_000 + "]" * 100_000  # far past any recursion limit: decoded all the same
    assert json.loads(objects.cap_depth(deep, 3)) == [[[objects.TOO_DEEP]]]
    assert objects.loads(deep.encode()) == objects.loads(objects.cap_depth(deep, objects.MAX_DEPTH))


def test_a_claims_requests_read_as_typed_requests() -> None:
    claim = next(c for c in _claims() if objects.name(c) == "share-b")
    [request] = objects.device_requests(claim)
    assert request.name == "gpu" and request.first_available == ()
    assert request.choices == (request.exactly,)
    exactly = request.exactly
    assert exactly is not None
    assert (exactly.name, exactly.subrequest, exactly.device_class) == ("gpu", None, "limiter.gpu.dra-gpu.io")
    assert (exactly.allocation_mode, exactly.count, exactly.capacity) == (
        "ExactCount",
        1,
        {"cores": "30", "memory": "10752Mi"},
    )
    assert not exactly.admin_access and exactly.selectors == () and exactly.tolerations == ()


def test_first_available_subrequests_are_named_as_their_results_are() -> None:
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {
                                "name": "big",
                                "deviceClassName": "a",
                                "selectors": [{"cel": {"expression": "x"}}],
                            },
                            {
                                "name": "small",
                                "deviceClassName": "b",
                                "count": 2,
                                "tolerations": [{"key": "k"}],
                            },
                        ],
                    }
                ],
                "constraints": [
                    {"requests": ["gpu/big"], "matchAttribute": "d/model"},
                    {"distinctAttribute": "d/u"},
                ],
            }
        }
    }
    [request] = objects.device_requests(claim)
    assert request.exactly is None
    assert [(c.name, c.subrequest, c.device_class) for c in request.choices] == [
        ("gpu/big", "big", "a"),
        ("gpu/small", "small", "b"),
    ]
    big, small = request.first_available
    assert big.selectors == ("x",) and big.count is None and small.count == 2
    assert small.tolerations == ({"key": "k"},)
    assert objects.device_constraints(claim) == [
        objects.DeviceConstraint(("gpu/big",), "d/model", ""),
        objects.DeviceConstraint((), "", "d/u"),
    ]


def test_a_request_reads_missing_null_and_mistyped_fields_as_absent_and_keeps_count_as_written() -> None:
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": 3,
                            "capacity": None,
                            "count": "2",
                            "selectors": [None],
                        },
                    },
                    {"name": "none", "exactly": {}},
                    None,
                ]
            }
        }
    }
    odd, empty, missing = objects.device_requests(claim)
    assert odd.exactly is not None
    assert (odd.exactly.device_class, odd.exactly.capacity, odd.exactly.count, odd.exactly.selectors) == (
        "",
        {},
        "2",
        ("",),
    )
    assert empty.exactly is None and empty.choices == ()
    assert missing == objects.DeviceRequest("", None, ())
    assert objects.device_requests({"spec": None}) == [] and objects.device_constraints({}) == []


def test_pods_as_the_real_server_returned_them_read_their_claims_containers_and_placement() -> None:
    pods = {
        objects.name(p): p for p in json.loads((REAL / "pods-after-scheduling.json").read_text())["items"]
    }
    templated = pods["pod-t"]
    assert [s["resourceClaimName"] for s in objects.pod_claim_statuses(templated)] == ["pod-t-gpu-fmmjp"]
    assert [c["name"] for c in objects.pod_containers(templated)] == ["c"]
    assert objects.pod_node(templated) == "node-1" and objects.pod_node(pods["pod-c"]) == ""
    extended = json.loads((REAL / "extended-resource-pod.json").read_text())
    [made] = json.loads((REAL / "extended-resource-claim.json").read_text())["items"]
    assert objects.pod_extended_claim(extended) == objects.name(made) == "pod-ext-extended-resources-8r44w"
    assert objects.pod_extended_claim(templated) is None


def test_a_pods_containers_statuses_and_scheduling_fields_read_missing_as_empty() -> None:
    pod = {
        "spec": {
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "main"}],
            "ephemeralContainers": [{"name": "debug"}],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "nodeSelector": {"zone": "a"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"x": 1}}},
        },
        "status": {"containerStatuses": [{"name": "main"}], "initContainerStatuses": [{"name": "init"}]},
    }
    assert [c["name"] for c in objects.pod_containers(pod)] == ["init", "main", "debug"]
    assert [c["name"] for c in objects.pod_containers(pod, ("containers",))] == ["main"]
    assert [c["name"] for c in objects.pod_container_statuses(pod)] == ["init", "main"]
    assert objects.pod_tolerations(pod) == [{"key": "gpu", "operator": "Exists"}]
    assert objects.pod_node_selector(pod) == {"zone": "a"}
    assert objects.pod_required_node_affinity(pod) == {"x": 1}
    bare: dict[str, Any] = {"spec": {"affinity": None, "containers": None}, "status": None}
    assert objects.pod_containers(bare) == [] and objects.pod_container_statuses(bare) == []
    assert objects.pod_tolerations(bare) == [] and objects.pod_node_selector(bare) == {}
    assert objects.pod_required_node_affinity(bare) is None and objects.pod_extended_claim(bare) is None
