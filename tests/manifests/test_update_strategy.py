"""The DaemonSet's update strategy follows `kubeletPlugin.seamlessUpgrade` (docs/upgrades.md): with it, the new
agent starts beside the old one and both name their sockets after their pod; without it (kubelets before 1.33),
the old agent leaves first and the sockets keep their fixed names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.manifests import load_values, render


def daemonset(tmp_path: Path, seamless: bool | None) -> dict[str, Any]:
    path = None
    if seamless is not None:
        path = tmp_path / "values.yaml"
        path.write_text(f"kubeletPlugin:\n  seamlessUpgrade: {str(seamless).lower()}\n")
    text = render(load_values(path))["kubelet-plugin.yaml"]
    document: dict[str, Any] = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet")
    return document


@pytest.mark.parametrize(
    ("seamless", "rolling", "pod_uid"),
    [
        (None, {"maxSurge": 1, "maxUnavailable": 0}, True),
        (True, {"maxSurge": 1, "maxUnavailable": 0}, True),
        (False, {"maxUnavailable": 1}, False),
    ],
)
def test_the_update_strategy_and_the_socket_names_follow_the_value(
    tmp_path: Path, seamless: bool | None, rolling: dict[str, int], pod_uid: bool
) -> None:
    ds = daemonset(tmp_path, seamless)
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": rolling}
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    if pod_uid:
        assert env["DRA_GPU_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    else:
        assert "DRA_GPU_POD_UID" not in env
