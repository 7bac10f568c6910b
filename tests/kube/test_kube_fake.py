"""The in-memory API server keeps the semantics the driver relies on (checked against a real 1.36)."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import yaml

from dra_gpu.kube import AlreadyExists, Conflict, Invalid, NotFound
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.validation import slice_errors

FIXTURES = "tests/fixtures/k8s-1.36-real"


def load_slice() -> dict:
    with open(f"{FIXTURES}/slice.yaml") as f:
        return yaml.safe_load(f)


def claim(name: str = "c") -> dict:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gpu.io"}}]}
        },
    }


def test_stale_update_is_a_conflict_with_the_real_message() -> None:
    api = FakeKube()
    created = api.create("ResourceClaim", claim())
    first = copy.deepcopy(created)
    first["metadata"]["finalizers"] = ["gpu.dra-gpu.io/allocation"]
    api.update("ResourceClaim", first)
    created["metadata"]["labels"] = {"x": "y"}
    with pytest.raises(
        Conflict, match=r'resourceclaims\.resource\.k8s\.io "c": the object has been modified'
    ):
        api.update("ResourceClaim", created)


def test_each_read_is_the_clients_own_copy() -> None:
    """As a real client decodes its own answer: changing what get or list returned changes nothing stored
    and nothing another read returned."""
    api = FakeKube()
    api.create("ResourceClaim", claim())
    first = api.get("ResourceClaim", "c", "default")
    (listed,), _ = api.list("ResourceClaim")
    first["spec"]["devices"]["requests"][0]["name"] = "changed"
    listed["metadata"]["labels"] = {"changed": "yes"}
    again = api.get("ResourceClaim", "c", "default")
    assert again["spec"]["devices"]["requests"][0]["name"] == "gpu" and "labels" not in again["metadata"]
    assert again == api.list("ResourceClaim")[0][0] and again is not first


def test_generate_name_not_found_and_already_exists() -> None:
    api = FakeKube()
    obj = api.create(
        "ResourceSlice", {**load_slice(), "metadata": {"generateName": "node-1-gpu.dra-gpu.io-"}}
    )
    assert obj["metadata"]["name"].startswith("node-1-gpu.dra-gpu.io-") and len(obj["metadata"]["name"]) > 23
    with pytest.raises(NotFound):
        api.get("ResourceClaim", "missing", "default")
    api.create("ResourceClaim", claim())
    with pytest.raises(AlreadyExists):
        api.create("ResourceClaim", claim())


def test_status_subresource_and_write_once_allocation() -> None:
    api = FakeKube()
    c = api.create("ResourceClaim", claim())
    alloc = {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.dra-gpu.io", "pool": "n", "device": "gpu-0"}]
        }
    }
    c["status"] = {"allocation": alloc}
    api.update("ResourceClaim", c)  # main resource ignores status
    assert "allocation" not in api.get("ResourceClaim", "c", "default").get("status", {})
    c = api.get("ResourceClaim", "c", "default")
    c["status"] = {"allocation": alloc}
    c = api.update_status("ResourceClaim", c)
    changed = copy.deepcopy(c)
    changed["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    with pytest.raises(Invalid, match=r"status\.allocation: Invalid value.*field is immutable"):
        api.update_status("ResourceClaim", changed)
    bad = copy.deepcopy(c)
    bad["status"] = {
        "allocation": {"devices": {"results": [{**alloc["devices"]["results"][0], "request": "nope"}]}}
    }
    bad["status"]["allocation"] = None
    api.update_status("ResourceClaim", bad)  # clearing is allowed
    assert api.get("ResourceClaim", "c", "default")["status"].get("allocation") is None


def test_claim_spec_is_immutable() -> None:
    api = FakeKube()
    c = api.create("ResourceClaim", claim())
    c["spec"]["devices"]["requests"][0]["name"] = "other"
    with pytest.raises(Invalid, match="field is immutable"):
        api.update("ResourceClaim", c)


def test_finalizers_hold_deletion_until_removed() -> None:
    api = FakeKube()
    c = claim()
    c["metadata"]["finalizers"] = ["gpu.dra-gpu.io/allocation"]
    api.create("ResourceClaim", c)
    api.delete("ResourceClaim", "c", "default")
    held = api.get("ResourceClaim", "c", "default")
    assert held["metadata"]["deletionTimestamp"]
    held["metadata"]["finalizers"] = []
    api.update("ResourceClaim", held)
    with pytest.raises(NotFound):
        api.get("ResourceClaim", "c", "default")


def test_delete_preconditions() -> None:
    api = FakeKube()
    s = api.create("ResourceSlice", load_slice())
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition"):
        api.delete("ResourceSlice", s["metadata"]["name"], uid="other")
    api.delete("ResourceSlice", s["metadata"]["name"], uid=s["metadata"]["uid"])
    assert api.objects("ResourceSlice") == []


def test_watch_sees_events_after_resource_version_and_delete_collection() -> None:
    api = FakeKube()
    _, rv = api.list("ResourceSlice")
    stop = threading.Event()
    events: list[tuple[str, str]] = []

    def consume() -> None:
        for ev in api.watch(
            "ResourceSlice",
            field_selector="spec.nodeName=node-1",
            resource_version=rv,
            timeout_s=5,
            stop=stop,
        ):
            events.append((ev["type"], ev["object"]["spec"]["nodeName"]))
            if ev["type"] == "DELETED":
                stop.set()

    t = threading.Thread(target=consume)
    t.start()
    api.create("ResourceSlice", load_slice())
    other = load_slice()
    other["metadata"]["name"] = "node-2-slice"
    other["spec"]["nodeName"] = other["spec"]["pool"]["name"] = "node-2"
    api.create("ResourceSlice", other)
    api.delete_collection("ResourceSlice", field_selector="spec.nodeName=node-1")
    t.join(5)
    assert events == [("ADDED", "node-1"), ("DELETED", "node-1")]
    assert [s["spec"]["nodeName"] for s in api.objects("ResourceSlice")] == ["node-2"]


def test_dropped_fields_match_a_real_server_with_consumable_capacity_off() -> None:
    with open(f"{FIXTURES}/slice-returned-with-DRAConsumableCapacity-off.json") as f:
        real = json.load(f)
    returned = FakeKube(consumable_capacity=False).create("ResourceSlice", load_slice())
    assert returned["spec"]["devices"] == real["spec"]["devices"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["attributes"].update({f"a{i}": {"int": i} for i in range(40)}),
            "the total number of attributes and capacities must not exceed 32",
        ),
        (
            lambda d: d["attributes"].update({"Bad_Name!": {"int": 1}}),
            'Invalid value: "Bad_Name!": a valid C identifier',
        ),
        (
            lambda d: d.update(name="GPU_0"),
            'spec.devices[0].name: Invalid value: "GPU_0": a lowercase RFC 1123 label',
        ),
        (
            lambda d: d["capacity"]["memory"]["requestPolicy"].update(default="100Gi"),
            "default is more than max: 80Gi",
        ),
        (
            lambda d: d.pop("allowMultipleAllocations"),
            "requestPolicy: Forbidden: allowMultipleAllocations must be true",
        ),
        (
            lambda d: d["attributes"].update(uuid={"int": 1, "string": "x"}),
            "exactly one value must be specified",
        ),
    ],
)
def test_slice_validation_uses_the_api_servers_words(mutate, expected) -> None:
    s = load_slice()
    mutate(s["spec"]["devices"][0])
    with open(f"{FIXTURES}/slice-validation-errors.txt") as f:
        real_messages = f.read()
    assert expected in real_messages  # the wording we assert is the real server's
    with pytest.raises(Invalid) as exc:
        FakeKube().create("ResourceSlice", s)
    assert expected in str(exc.value)


def test_too_many_devices() -> None:
    s = load_slice()
    base = s["spec"]["devices"][1]
    s["spec"]["devices"] = [{**base, "name": f"gpu-{i}"} for i in range(129)]
    assert slice_errors(s) == ["spec.devices: Too many: 129: must have at most 128 items"]
