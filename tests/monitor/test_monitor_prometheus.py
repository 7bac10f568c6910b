"""A real Prometheus scrapes a running node agent (simulated GPUs) while a limiter claim's process
really allocates through the fake CUDA driver; PromQL returns that claim's memory in use.

Needs the `prometheus` binary (Debian's package; CI installs it) and the native limiter build.
Everything listens on loopback; every wait is bounded.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fake_driver import CONTEXT_CHARGE
from plugin_harness import (
    PluginDirs,
    claim_process_env,
    prepared_container,
    running_plugin,
    share_claim,
)
from ports import unused_port
from repo_paths import ROOT
from waiting import wait_for

from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.sharing.steps.device_access import device_uuids

LIMITER = ROOT / "native" / "limiter"
BUILD = LIMITER / "build"
MiB = 2**20

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="the prometheus binary is not installed (Debian package prometheus)",
)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    try:
        answer = _get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    except OSError:
        return []
    return list(answer["data"]["result"]) if answer.get("status") == "success" else []


def test_promql_returns_the_claims_memory_in_use(built: Path, dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    # /metrics answers only a token RBAC lets `get /metrics`, as the install grants Prometheus.
    api.create(
        "ClusterRole",
        {"metadata": {"name": "reader"}, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
    )
    api.create(
        "ClusterRoleBinding",
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
        },
    )
    api.tokens["prometheus-token"] = {"username": "system:serviceaccount:monitoring:prometheus"}
    claim = share_claim(api, "llm", memory="2Gi", cores="50", share=10)  # 768 MiB fit beside the context
    with (
        running_plugin(
            dirs, api, http_address="127.0.0.1:0", monitor_interval_s=0.5, metrics_auth=True
        ) as plugin,
        prepared_container(dirs, claim) as container,
    ):
        env = claim_process_env(built, container)
        workload = subprocess.Popen(
            [str(built / "limiter-probe"), "alloc", str(256 * MiB), "3", "--hold"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        port = unused_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n- job_name: dra-gpu-kubelet-plugin\n"
            f"  static_configs:\n  - targets: ['127.0.0.1:{plugin.http_port}']\n"
            "  authorization:\n    credentials: prometheus-token\n"
        )
        prometheus = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115 - closed with the process
        )
        try:
            assert workload.stdout is not None
            lines = [workload.stdout.readline().strip() for _ in range(5)]
            assert lines[-1] == "holding", lines
            promql = 'dra_gpu_claim_memory_used_bytes{namespace="default", claim="llm"}'
            used = 768 * MiB + CONTEXT_CHARGE  # the allocations and the process's context
            try:
                result = wait_for(
                    lambda: [r for r in _query(port, promql) if float(r["value"][1]) == used],
                    timeout_s=120,
                    what=f"Prometheus to answer {promql} with {used} bytes",
                )
            except AssertionError as exc:
                log = (tmp_path / "prometheus.log").read_text()[-3000:]
                raise AssertionError(
                    f"{exc}; last answer {_query(port, promql)}; prometheus log:\n{log}"
                ) from None
            assert result[0]["metric"]["gpu_uuid"] == ",".join(device_uuids(container.env))
            limit = _query(port, 'dra_gpu_claim_memory_limit_bytes{claim="llm"}')
            assert limit and float(limit[0]["value"][1]) == 2048 * MiB
            assert limit[0]["metric"]["sharing"] == "Limiter", "the limit names the claim's sharing mode"
        finally:
            prometheus.terminate()
            try:
                prometheus.wait(timeout=30)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait()
            workload.kill()
            workload.wait()
