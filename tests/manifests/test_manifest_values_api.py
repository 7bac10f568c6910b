"""Every install value that becomes an API field is checked by `dra-gpu manifests` with the API server's rule,
so that `kubectl apply -k` does not fail halfway through on one object."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu.cli import main


@pytest.mark.parametrize(
    ("values", "named"),
    [
        # DeviceClass.spec.extendedResourceName: IsExtendedResourceName.
        (
            "deviceClasses:\n  extendedResourceNames: {gpu.dra-gpu.io: gpu}\n",
            "'gpu' is not a valid extended resource name",
        ),
        (
            "deviceClasses:\n  extendedResourceNames: {gpu.dra-gpu.io: kubernetes.io/gpu}\n",
            "'kubernetes.io/gpu' is not a valid extended resource name",
        ),
        (
            "deviceClasses:\n  extendedResourceNames: {gpu.dra-gpu.io: Example.com/gpu}\n",
            "'Example.com/gpu' is not a valid extended resource name",
        ),
        # Pod spec fields of the DaemonSet and the Deployment.
        (
            "kubeletPlugin:\n  runtimeClassName: Nvidia_Runtime\n",
            "'Nvidia_Runtime' is not a valid object name",
        ),
        ("kubeletPlugin:\n  priorityClassName: ' high'\n", "' high' is not a valid object name"),
        ("kubeletPlugin:\n  nodeSelector: {gpu: 'yes please'}\n", "'yes please' is not a valid label value"),
        ("kubeletPlugin:\n  nodeSelector: {'-gpu': 'true'}\n", "'-gpu' is not a valid label key"),
        ("kubeletPlugin:\n  gpuNodeLabels: ['nvidia.com/gpu.present=not valid']\n", "is not a node label"),
        (
            "kubeletPlugin:\n  tolerations: [{operator: Exists, value: x}]\n",
            "value must be empty when operator is Exists",
        ),
        ("kubeletPlugin:\n  tolerations: [{key: gpu, effect: NoRun}]\n", "effect 'NoRun'"),
        ("kubeletPlugin:\n  tolerations: [{value: x}]\n", "operator must be Exists when key is empty"),
        (
            "kubeletPlugin:\n  tolerations: [{key: gpu, operator: Exists, tolerationSeconds: 5}]\n",
            "effect must be NoExecute when tolerationSeconds is set",
        ),
        (
            "kubeletPlugin:\n  resources: {requests: {memory: 1Gi}, limits: {memory: 512Mi}}\n",
            "requests.memory '1Gi'",
        ),
        ("controller:\n  resources: {requests: {cpu: lots}}\n", "'lots' is not a Kubernetes quantity"),
        ("image:\n  tag: '1.0 '\n", "'1.0 ' is not a valid image reference part"),
        # Labels and annotations of the Grafana ConfigMap.
        ("grafanaDashboard:\n  labelValue: 'yes please'\n", "'yes please' is not a valid label value"),
    ],
)
def test_a_value_the_api_server_would_refuse_is_named_with_its_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], values: str, named: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(values)
    assert main(["manifests", "--values", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: {path}: invalid values: ") and named in line, line


def test_values_the_api_server_accepts_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        "deviceClasses:\n  extendedResourceNames: {gpu.dra-gpu.io: dra-gpu.io/gpu, mps.gpu.dra-gpu.io: example.com/mps}\n"
        "kubeletPlugin:\n  runtimeClassName: nvidia\n  nodeSelector: {nvidia.com/gpu.present: 'true'}\n"
        "  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule},"
        " {key: node.kubernetes.io/not-ready, effect: NoExecute, tolerationSeconds: 30, value: ''}]\n"
    )
    assert main(["manifests", "--values", str(path)]) == 0, capsys.readouterr().err
