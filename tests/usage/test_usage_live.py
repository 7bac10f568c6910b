"""`dra-gpu usage` shows use beside allocation from a running agent's /metrics, and allocations alone
where no agent answers; a claim's compute floor, ceiling and priority from the claim itself."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from monitor_harness import GiB, add_pod, fake_proc, plugin_with_nvml
from plugin_harness import (
    NODE,
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    gpu_config,
    monitor_of,
    opaque,
    share_claim,
    uid_of,
)
from test_usage_collect import claim, device, limiter_config, result, slice_of
from waiting import wait_for

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.cli import main
from dra_gpu.commands import usage as usage_command
from dra_gpu.kube import KubeAPI
from dra_gpu.kube.fake import FakeKube
from dra_gpu.usage import collect, render_table, to_json
from dra_gpu.usage.live import parse_metrics


def test_use_beside_allocation_and_allocations_alone_without_agents(
    dirs: PluginDirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeKube()
    api.create("Node", {"metadata": {"name": NODE}})

    def build_api(args: argparse.Namespace) -> KubeAPI:
        return api

    monkeypatch.setattr(usage_command, "build_api", build_api)
    claim = share_claim(api, "inference", memory="4Gi", cores="50", share=10)
    proc_root = tmp_path / "proc"
    with plugin_with_nvml(dirs, api, proc_root, publish_slices=True) as (plugin, driver):
        wait_for(
            lambda: api.list("ResourceSlice", field_selector=f"spec.driver={DRIVER_NAME}")[0], what="slices"
        )
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert not kubelet.prepare(claim)[uid_of(claim)].error
        pod, cid = add_pod(api, "inference-pod", ["inference"])
        fake_proc(proc_root, 7001, pod, cid, limiter=True)
        driver.gpus[0].processes = {7001: 3 * GiB}
        monitor_of(plugin).sample_once()
        url = f"http://127.0.0.1:{plugin.http_port}/metrics"

        assert main(["usage", "--metrics-url", url]) == 0
        out, err = capsys.readouterr()
        assert "USE" in out and "3 GiB in use" in out, out
        assert "no use shown" not in err

        assert main(["usage", "--metrics-url", url, "-o", "json"]) == 0
        document = json.loads(capsys.readouterr().out)
        (entry,) = [c for n in document["nodes"] for g in n["gpus"] for c in g["claims"]]
        assert entry["use"]["memoryUsedBytes"] == 3 * GiB and entry["use"]["memoryLimitBytes"] == 4 * GiB
        assert document["agents"]["reached"] == [url]
        kubelet.close()

    # The agent is gone: the same command still shows the allocation, and says why there is no use.
    assert main(["usage", "--metrics-url", url]) == 0
    out, err = capsys.readouterr()
    assert "default/inference" in out and "USE" not in out
    assert f"no use shown for the GPUs of unreachable node agents: {url}" in err


class _ProxyApi(FakeKube):
    """The API fake plus the API server's pod proxy, answering for the agents it knows."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers = answers
        self.paths: list[str] = []

    def get_text(self, path: str, timeout: float = 10.0) -> str:
        from dra_gpu.kube import NotFound

        self.paths.append(path)
        if path not in self.answers:
            raise NotFound("the server could not find the requested resource")
        return self.answers[path]


def _agent_pod(api: FakeKube, name: str) -> None:
    pod = api.create(
        "Pod",
        {
            "metadata": {
                "name": name,
                "namespace": "dra-gpu",
                "labels": {
                    "app.kubernetes.io/name": "dra-gpu",
                    "app.kubernetes.io/component": "kubelet-plugin",
                },
            },
            "spec": {"containers": [{"name": "plugin", "ports": [{"name": "http", "containerPort": 8080}]}]},
        },
    )
    api.update_status("Pod", {**pod, "status": {"phase": "Running"}})


def test_agents_are_read_through_the_pod_proxy() -> None:
    metrics = (
        "# TYPE dra_gpu_claim_memory_used_bytes gauge\n"
        'dra_gpu_claim_memory_used_bytes{namespace="ns",claim="c",gpu_uuid="GPU-1",sharing="Limiter"} 42\n'
    )
    api = _ProxyApi({"/api/v1/namespaces/dra-gpu/pods/agent-a:8080/proxy/metrics": metrics})
    _agent_pod(api, "agent-a")
    _agent_pod(api, "agent-b")
    args = argparse.Namespace(metrics_url=[], agents="proxy", agent_namespace="dra-gpu")
    live = usage_command.read_live(args, api)
    assert live is not None
    use = live.get("ns", "c", "GPU-1")
    assert use is not None and use.memory_used == 42
    assert live.reached == ["dra-gpu/agent-a"]
    assert list(live.unreachable) == ["dra-gpu/agent-b"]
    assert usage_command.read_live(argparse.Namespace(metrics_url=[], agents="none"), api) is None


def test_usage_shows_a_claims_compute_floor_ceiling_and_what_it_used_borrowed_and_lent(
    dirs: PluginDirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeKube()
    api.create("Node", {"metadata": {"name": NODE}})
    monkeypatch.setattr(usage_command, "build_api", lambda args: api)
    claim = add_claim(
        api,
        "training",
        [Alloc(share_id="00000000-0000-4000-8000-00000000000b", consumed={"memory": "4Gi", "cores": "20"})],
        [opaque(gpu_config("Limiter", limiter={"compute": {"limit": 100, "priority": "besteffort"}}))],
    )
    with plugin_with_nvml(dirs, api, tmp_path / "proc", publish_slices=True) as (plugin, driver):
        wait_for(
            lambda: api.list("ResourceSlice", field_selector=f"spec.driver={DRIVER_NAME}")[0], what="slices"
        )
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert not kubelet.prepare(claim)[uid_of(claim)].error
        activity = dirs.state_dir / "gpus" / driver.gpus[0].uuid / f"{uid_of(claim)}.activity"
        with open(activity, "r+b") as f:  # what the claim's library reports: 12.5 s used, 9.5 s borrowed
            f.seek(24)
            f.write((12_500_000_000).to_bytes(8, "little") + (9_500_000_000).to_bytes(8, "little"))
        monitor_of(plugin).sample_once()
        url = f"http://127.0.0.1:{plugin.http_port}/metrics"

        assert main(["usage", "--metrics-url", url]) == 0
        out = capsys.readouterr().out
        # Alone on its GPU, it lent nothing: no other claim borrowed.
        assert "compute floor 20% ceiling 100% besteffort: 12.5 s used, 9.5 s borrowed, 0.0 s lent" in out, (
            out
        )

        assert main(["usage", "--metrics-url", url, "-o", "json"]) == 0
        (entry,) = [
            c for n in json.loads(capsys.readouterr().out)["nodes"] for g in n["gpus"] for c in g["claims"]
        ]
        use = entry["use"]
        assert (use["computeFloor"], use["computeCeiling"], use["computePriority"]) == (
            0.2,
            1.0,
            "besteffort",
        )
        assert (use["computeUsedSeconds"], use["computeBorrowedSeconds"]) == (12.5, 9.5)
        kubelet.close()


def test_a_claims_floor_ceiling_and_priority_come_from_the_claim_not_from_an_agents_series() -> None:
    """Floor, ceiling and priority are the claim's configuration: an agent that still served them as series
    (the previous release) with other values is not believed; used, borrowed and lent are its figures."""
    grants = {"compute": {"limit": 80, "priority": "latency"}}
    parameters = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CONFIG_KIND,
        "sharing": {"strategy": "Limiter", "limiter": grants},
    }
    serve = claim(
        "serve",
        [result("node-a", "gpu-0", {"memory": "10Gi", "cores": "30"})],
        config=[limiter_config(parameters=parameters)],
    )
    fixed = claim(
        "fixed", [result("node-a", "gpu-0", {"memory": "10Gi", "cores": "20"})], config=[limiter_config()]
    )
    usage = collect([slice_of("node-a", [device("gpu-0", 0)])], [serve, fixed])
    labels = 'namespace="team",claim="serve",gpu_uuid="GPU-gpu-0",sharing="Limiter"'
    live = parse_metrics(
        f"dra_gpu_claim_compute_floor_ratio{{{labels}}} 0.9\n"
        f"dra_gpu_claim_compute_ceiling_ratio{{{labels}}} 0.95\n"
        f'dra_gpu_claim_compute_priority{{{labels},priority="besteffort"}} 1\n'
        "# TYPE dra_gpu_claim_compute_used_seconds counter\n"
        f"dra_gpu_claim_compute_used_seconds_total{{{labels}}} 12.5\n"
        "# TYPE dra_gpu_claim_compute_borrowed_seconds counter\n"
        f"dra_gpu_claim_compute_borrowed_seconds_total{{{labels}}} 2.5\n"
        "# TYPE dra_gpu_claim_compute_lent_seconds counter\n"
        f"dra_gpu_claim_compute_lent_seconds_total{{{labels}}} 1.0\n"
        "# TYPE dra_gpu_claim_memory_limit_bytes gauge\n"
        'dra_gpu_claim_memory_limit_bytes{namespace="team",claim="fixed",gpu_uuid="GPU-gpu-0",sharing="Limiter"} 1\n'
    )
    live.reached = ["agent"]

    table = render_table(usage, live)
    assert "compute floor 30% ceiling 80% latency: 12.5 s used, 2.5 s borrowed, 1.0 s lent" in table, table
    # A fixed share is on the board too; it has counted nothing yet, so the agent has none of its counters.
    assert "compute floor 20% ceiling 20% standard: 0.0 s used, 0.0 s borrowed, 0.0 s lent" in table, table

    entries = {c["name"]: c for n in to_json(usage, live)["nodes"] for g in n["gpus"] for c in g["claims"]}
    assert entries["serve"]["compute"] == {"floor": 30, "ceiling": 80, "priority": "latency"}
    use = entries["serve"]["use"]
    assert (use["computeFloor"], use["computeCeiling"], use["computePriority"]) == (0.3, 0.8, "latency")
    # Without any agent the claim still says what it was promised.
    alone = {c["name"]: c for n in to_json(usage)["nodes"] for g in n["gpus"] for c in g["claims"]}
    assert alone["fixed"]["compute"] == {"floor": 20, "ceiling": 20, "priority": "standard"}
