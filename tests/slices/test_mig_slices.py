"""What a MIG node publishes: static instances as devices, dynamic GPUs as counters and placements."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest

from dra_gpu.cli import main
from dra_gpu.config import NodeSharing
from dra_gpu.inventory import open_inventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.validation import slice_errors
from dra_gpu.slices import SlicePublisher

Obj = dict[str, Any]


def preview(capsys: pytest.CaptureFixture[str], profile: str, *extra: str) -> list[Obj]:
    assert main(["slices", "--simulate", profile, "-o", "json", *extra]) == 0
    slices: list[Obj] = json.loads(capsys.readouterr().out)
    return slices


def devices_of(slices: list[Obj]) -> list[Obj]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def test_dynamic_gpu_publishes_counters_alone_and_one_device_per_placement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slices = preview(capsys, "1xH100-80GB:mig")
    counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
    assert len(counter_slices) == 1 and "devices" not in counter_slices[0]["spec"]
    (counter_set,) = counter_slices[0]["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-0-mig"
    assert counter_set["counters"]["memory-slice-7"] == {"value": "1"}
    assert counter_set["counters"]["compute-slices"] == {"value": "7"}
    devices = devices_of(slices)
    assert len(devices) == 7 + 7 + 4 + 3 + 2 + 1 + 1  # every valid placement of every H100 profile
    three_g_at_4 = next(d for d in devices if d["name"] == "gpu-0-mig-3g40gb-4")
    (consumes,) = three_g_at_4["consumesCounters"]
    assert consumes["counterSet"] == "gpu-0-mig"
    assert {k for k in consumes["counters"] if k.startswith("memory-slice")} == {
        "memory-slice-4", "memory-slice-5", "memory-slice-6", "memory-slice-7"
    }  # fmt: skip
    assert three_g_at_4["attributes"]["profile"] == {"string": "3g.40gb"}
    assert three_g_at_4["attributes"]["placementStart"] == {"int": 4}
    assert "allowMultipleAllocations" not in three_g_at_4  # the instance exists only for one claim


def test_eight_dynamic_gpus_obey_the_slice_limits(capsys: pytest.CaptureFixture[str]) -> None:
    slices = preview(capsys, "8xH100-80GB:mig")
    for s in slices:
        assert not (s["spec"].get("devices") and s["spec"].get("sharedCounters"))
        assert len(s["spec"].get("devices") or []) <= 64
        assert len(s["spec"].get("sharedCounters") or []) <= 8
        assert all(len(d.get("consumesCounters") or []) <= 2 for d in s["spec"].get("devices") or [])
        assert slice_errors({"metadata": {"name": "x"}, **s}) == []
    assert len(devices_of(slices)) == 8 * 25
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}


def test_static_instances_are_shareable_devices_keyed_by_their_mig_uuid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    devices = devices_of(preview(capsys, "1xH100-80GB:mig=3g.40gb/1g.10gb*4"))
    assert [d["name"] for d in devices] == [
        "gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1", "gpu-0-mig-1g10gb-2", "gpu-0-mig-1g10gb-3",
        "gpu-0-mig-3g40gb-4",
    ]  # fmt: skip
    three_g = devices[-1]
    attributes = three_g["attributes"]
    assert attributes["uuid"] == attributes["migUUID"]
    assert attributes["migUUID"]["string"].startswith("MIG-")
    assert attributes["parentUUID"]["string"].startswith("GPU-")
    assert attributes["computeSlices"] == {"int": 3} and attributes["copyEngines"] == {"int": 3}
    assert three_g["allowMultipleAllocations"] is True  # --sharing default: Shared
    assert three_g["capacity"]["memory"]["value"] == "40448Mi"  # NVML reports 39.50 GiB for an H100 3g.40gb
    assert "consumesCounters" not in three_g


def test_a_slice_with_devices_and_counters_is_refused_as_the_api_server_would() -> None:
    bad = {
        "spec": {
            "driver": "gpu.dra-gpu.io",
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d", "consumesCounters": [{"counterSet": "a", "counters": {}}] * 3}],
            "sharedCounters": [{"name": "Bad_Set", "counters": {"x": {"value": "1"}}}],
        }
    }
    errors = slice_errors(bad)
    assert any("only one of `sharedCounters` or `devices` is allowed" in e for e in errors)
    assert any("consumesCounters: Too many: 3" in e for e in errors)
    assert any('sharedCounters[0].name: Invalid value: "Bad_Set"' in e for e in errors)


def test_slices_command_refuses_a_bad_profile_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slices", "--simulate", "1xT4-16GB:mig"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "T4-16GB has no MIG profiles" in err


def test_a_simulated_h200_publishes_the_memory_nvml_reports_not_the_names_rounding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """tests/fixtures/mig/h200-nvml-profiles.txt: 1g.18gb has 16384 MiB, 2g.35gb 33280 MiB, 7g.141gb 143360."""
    memory = {
        d["attributes"]["profile"]["string"]: d["capacity"]["memory"]["value"]
        for d in devices_of(preview(capsys, "1xH200-141GB:mig"))
    }
    assert memory["1g.18gb"] == "16Gi" and memory["2g.35gb"] == "33280Mi"
    assert memory["3g.71gb"] == "71424Mi" and memory["7g.141gb"] == "140Gi"


def test_an_a30_publishes_its_four_slices_and_a_b200_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    slices = preview(capsys, "1xA30-24GB:mig")
    (counter_set,) = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
    assert sorted(n for n in counter_set["counters"] if n.startswith("memory-slice")) == [
        f"memory-slice-{n}" for n in range(4)
    ]
    names = {d["name"] for d in devices_of(slices)}
    assert "gpu-0-mig-4g24gb-0" in names and "gpu-0-mig-2g12gbme-2" in names and len(names) == 13
    static = devices_of(preview(capsys, "1xB200-180GB:mig=3g.90gb*2"))
    assert [d["attributes"]["profile"]["string"] for d in static] == ["3g.90gb", "3g.90gb"]


def test_a_gpu_instance_split_into_compute_instances_is_left_out_saying_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeKube()
    api.create("Node", {"metadata": {"name": "node-1"}})
    gpu = open_inventory("simulated:1xH100-80GB:mig=3g.40gb*2", seed="node-1").gpus()[0]
    whole, _ = gpu.mig_instances
    split = [replace(whole, uuid=f"MIG-split-{ci}", profile="1c.3g.40gb", ci_id=ci) for ci in (0, 1, 2)]
    split_gpu = replace(gpu, mig_instances=(split[0], split[1], split[2], gpu.mig_instances[1]))
    inventory = open_inventory("simulated:1xH100-80GB", seed="node-1")
    inventory.gpus = lambda: [split_gpu]  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="dra_gpu.slices.publisher"):
        slices = SlicePublisher(api, "node-1", inventory, NodeSharing.parse("*=Exclusive")).sync()
    published = [d["attributes"]["migUUID"]["string"] for d in devices_of(slices)]
    assert published == [gpu.mig_instances[1].uuid]
    messages = [r.getMessage() for r in caplog.records]
    for instance in split:
        assert any(instance.uuid in m and "shares the GPU instance's memory" in m for m in messages), messages
