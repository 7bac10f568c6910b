"""Every object the project emits, against the real OpenAPI schemas of each supported Kubernetes version.

The schemas are the API server's own (the `kubernetes-validate` package), in strict mode: an unknown or
misspelt field, a wrong type or a field a version does not have is refused as the server would refuse it.
Rules beyond the schema (name formats, limits, cross-field rules) are `kube/validation.py`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from repo_paths import ROOT

from dra_gpu.cli import main
from dra_gpu.kube.validation import device_class_errors, slice_errors
from dra_gpu.manifests import load_values, render

Obj = dict[str, Any]
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
"""Kubernetes 1.34+ (README); the package has schemas up to 1.37."""

VALUE_SETS = {
    "default": "",
    "kind": (ROOT / "e2e" / "values-kind.yaml").read_text(),
    "every option": (
        "namespace: gpus\n"
        "image: {repository: registry.example/dra-gpu, tag: '1.2.3', pullPolicy: Always}\n"
        "kubeletPlugin:\n"
        "  privileged: true\n  runtimeClassName: nvidia\n  priorityClassName: high\n"
        "  nodeSelector: {nvidia.com/gpu.present: 'true'}\n  gpuNodeLabels: []\n  migDynamic: true\n"
        "  mpsCgroup: null\n"
        "  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule},"
        " {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 30}]\n"
        "controller: {replicas: 1}\n"
        "deviceClasses: {timeSlicingInterval: Long, extendedResourceNames: {gpu.dra-gpu.io: dra-gpu.io/gpu}}\n"
        "grafanaDashboard: {namespace: monitoring, folder: GPUs}\n"
    ),
    "minimal": "controller: {enabled: false}\nvalidatingAdmissionPolicy: {enabled: false}\n",
}

SLICE_SPECS = (
    ("1xH100-80GB", "*=Shared"),
    ("3xH100-80GB", "*=Shared,0=Exclusive,1=MPS"),
    ("1xH100-80GB:mig=1g.10gb*7", "*=Shared"),
    ("1xH100-80GB:mig=3g.40gb/1g.10gb*4", "*=MPS"),
    ("1xH200-141GB:mig", "*=Shared"),
    ("1xA100-40GB:mig", "*=Shared"),
    ("1xA30-24GB:mig,1xB200-180GB:mig", "*=Shared"),
    ("1xA30-24GB:mig=2g.12gb/1g.6gb*2", "*=MPS"),
    ("2xH100-80GB,2xH100-80GB:mig,2xA100-80GB:mig=3g.40gb*2", "*=Shared,0=Exclusive,1=MPS"),
    ("16xH200-141GB:mig", "*=Shared"),
    ("128xH100-80GB", "*=Exclusive"),
    ("2xH100-80GB,driver=615.71.09", "*=Shared"),
)


def rendered_objects(values_text: str, tmp_path: Path) -> list[Obj]:
    path = tmp_path / "values.yaml"
    path.write_text(values_text or "{}\n")
    files = render(load_values(path))
    objects = [d for text in files.values() for d in yaml.safe_load_all(text) if d]
    return [d for d in objects if d["kind"] != "Kustomization"]  # kustomize's file, not an API object


def published_slices(spec: str, sharing: str, capsys: pytest.CaptureFixture[str]) -> list[Obj]:
    assert main(["slices", "--simulate", spec, "--sharing", sharing, "-o", "json"]) == 0
    slices: list[Obj] = json.loads(capsys.readouterr().out)
    for i, s in enumerate(slices):  # as the publisher sends them: named by the server from a prefix
        s.setdefault("metadata", {"generateName": f"0000{i}-gpu.dra-gpu.io-node-1-"})
    return slices


def schema_errors(obj: Obj, version: str) -> str:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{obj['kind']} {obj.get('metadata', {}).get('name', '')}: {exc.message} at {list(exc.path)}"
    return ""


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_rendered_manifest_is_valid_for_each_version(values: str, version: str, tmp_path: Path) -> None:
    objects = rendered_objects(VALUE_SETS[values], tmp_path)
    assert {"DaemonSet", "DeviceClass", "Namespace"} <= {o["kind"] for o in objects}
    assert [e for o in objects if (e := schema_errors(o, version))] == []
    assert [e for o in objects if o["kind"] == "DeviceClass" for e in device_class_errors(o)] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_every_published_slice_is_valid_for_each_version(
    version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for spec, sharing in SLICE_SPECS:
        for s in published_slices(spec, sharing, capsys):
            assert schema_errors(s, version) == "", spec
            assert slice_errors(s) == [], spec


def test_the_schemas_refuse_what_the_server_refuses(tmp_path: Path) -> None:
    """The check can fail: a misspelt field and a wrong type are refused."""
    [device_class] = [o for o in rendered_objects("", tmp_path) if o["kind"] == "DeviceClass"][:1]
    misspelt = {**device_class, "spec": {**device_class["spec"], "selector": []}}
    assert "selector" in schema_errors(misspelt, "1.36.0")
    extended = {**device_class, "spec": {**device_class["spec"], "extendedResourceName": "dra-gpu.io/gpu"}}
    assert schema_errors(extended, "1.36.0") == ""
    wrong = {**device_class, "spec": {**device_class["spec"], "config": "Limiter"}}
    assert "'Limiter' is not of type 'array'" in schema_errors(wrong, "1.34.0")
