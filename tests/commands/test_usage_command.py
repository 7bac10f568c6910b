"""`dra-gpu usage` end to end: the real 1.36 objects in the API fake, printed as a table and as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import unused_port
from repo_paths import TESTS

from dra_gpu.cli import main
from dra_gpu.commands import usage as usage_command
from dra_gpu.kube import Forbidden, KubeAPI
from dra_gpu.kube.fake import FakeKube

FIXTURES = TESTS / "fixtures" / "k8s-1.36-real"


def cluster() -> FakeKube:
    """The recorded control plane's slice, classes and claims (with their status) in the fake."""
    api = FakeKube()
    api.create("ResourceSlice", json.loads((FIXTURES / "resourceslice-as-stored.json").read_text()))
    for device_class in yaml.safe_load_all((FIXTURES / "classes.yaml").read_text()):
        api.create("DeviceClass", device_class)
    claims = json.loads((FIXTURES / "resourceclaims-after-scheduling.json").read_text())["items"]
    for recorded in claims:
        created = api.create("ResourceClaim", {k: v for k, v in recorded.items() if k != "status"})
        if recorded.get("status"):
            api.update_status("ResourceClaim", {**created, "status": recorded["status"]})
    return api


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    api = cluster()

    def build_api(args: argparse.Namespace) -> KubeAPI:
        return api

    monkeypatch.setattr(usage_command, "build_api", build_api)
    return api


def test_table_lists_each_gpu_with_its_holders_and_the_pending_claims(
    fake: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["usage"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "node node-1 (2 GPUs)"
    gpu0 = next(line for line in lines if line.startswith("  gpu-0  "))
    assert "GPU-00000000-0000-4000-8000-000000000000" in gpu0 and "sharing Limiter" in gpu0
    assert "memory 32 GiB of 80 GiB, cores 92 of 100 used" in gpu0
    shared = next(line for line in lines if "default/shared " in line).split()
    assert shared[:2] == ["default/shared", "gpu"] and "pod-s1," in shared and "pod-s2" in shared
    ctrl = next(line for line in lines if "default/ctrl-alloc " in line)
    assert "4Gi memory, 10 cores" in ctrl and "controller" in ctrl and ctrl.rstrip().endswith("Limiter")
    whole = next(line for line in lines if "default/pod-t-gpu-fmmjp" in line)
    assert "whole GPU" in whole and "pod-t" in whole
    pending = out.split("pending claims (not allocated yet)\n")[1]
    assert [line.split()[0] for line in pending.splitlines()[1:]] == [
        "default/share-c-asks-nothing",
        "default/share-d-too-many-cores",
        "default/whole-2",
    ]
    assert "10Gi memory, 25 cores" in pending


def test_json_has_stable_keys_and_the_same_facts(fake: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["driver", "nodeFilter", "nodes", "pending"]
    (node,) = data["nodes"]
    gpus = {g["device"]: g for g in node["gpus"]}
    gpu0 = gpus["gpu-0"]
    assert gpu0["capacity"] == {"cores": "100", "memory": "80Gi"}
    assert gpu0["used"] == {"cores": "92", "memory": "32Gi"}
    assert gpu0["free"] == {"cores": "8", "memory": "48Gi"}
    assert gpu0["healthy"] is True and gpu0["taints"] == [] and gpu0["overcommitted"] is False
    claims = {c["name"]: c for c in gpu0["claims"]}
    assert claims["shared"]["pods"] == ["pod-s1", "pod-s2"]
    assert claims["share-b"]["strategy"] is None and "note: unknown field" in claims["share-b"]["configError"]
    assert claims["ctrl-alloc"]["allocatedBy"] == "controller"
    assert [c["name"] for c in gpus["gpu-1"]["claims"]] == ["pod-t-gpu-fmmjp"]
    assert gpus["gpu-1"]["claims"][0]["wholeGpu"] is True
    too_many = next(p for p in data["pending"] if p["name"] == "share-d-too-many-cores")
    assert too_many["requests"][0]["capacity"] == {"cores": "25", "memory": "10Gi"}


def test_node_flag_and_its_environment_variable_filter(
    fake: FakeKube, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["usage", "--node", "node-2", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nodeFilter"] == "node-2" and data["nodes"] == [] and data["pending"] == []
    monkeypatch.setenv("DRA_GPU_NODE", "node-1")
    assert main(["usage"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node node-1 (2 GPUs)") and "pending claims" not in out


def test_lists_only_our_drivers_slices(fake: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    fake.calls.clear()
    assert main(["usage"]) == 0
    assert sorted(kind for verb, kind in fake.calls if verb == "list") == [
        "DeviceClass",
        "ResourceClaim",
        "ResourceSlice",
    ]
    assert not [verb for verb, _ in fake.calls if verb != "list"]  # read-only


def test_a_missing_kubeconfig_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["usage", "--kubeconfig", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot configure the Kubernetes client from --kubeconfig {missing}: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_kubeconfig_environment_variable_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "from-env.yaml"
    monkeypatch.setenv("DRA_GPU_KUBECONFIG", str(missing))
    assert main(["usage"]) == 1
    assert f"--kubeconfig {missing}" in capsys.readouterr().err


def test_an_unreachable_api_server_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{unused_port()}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    assert main(["usage", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach https://127.0.0.1:")
    assert "Connection refused" in err and err.count("\n") == 1 and "Traceback" not in err


class _NoClasses(FakeKube):
    def list(self, kind: str, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        if kind == "DeviceClass":
            raise Forbidden(
                'deviceclasses.resource.k8s.io is forbidden: User "alice" cannot list resource "deviceclasses"'
            )
        return super().list(kind, *args, **kwargs)


def test_a_refused_list_names_the_resource(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_command.run_with_api(argparse.Namespace(node=None, output="table"), _NoClasses()) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        'error: cannot list deviceclasses: deviceclasses.resource.k8s.io is forbidden: User "alice" '
        'cannot list resource "deviceclasses"\n'
    )
