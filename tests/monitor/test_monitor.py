"""The node agent's usage monitor: /metrics equal what fake NVML and fake /proc hold; the watchdog."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fakes import fake_pynvml
from monitor_harness import GiB, add_pod, fake_proc, gpu_share, plugin_with_nvml
from plugin_harness import Alloc, Kubelet, PluginDirs, add_claim, gpu_config, monitor_of, opaque, uid_of
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from dra_gpu.config import ConfigError, WatchdogPolicy, parse_gpu_config
from dra_gpu.kube.fake import FakeKube
from dra_gpu.monitor.nvml_usage import NvmlSampler
from dra_gpu.monitor.process_owner import parse_cgroup

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def limiter_config(policy: str | None = None, **limits: Any) -> dict[str, Any]:
    config = gpu_config("Limiter", **({"limiter": limits} if limits else {}))
    if policy:
        config["watchdog"] = {"policy": policy}
    return config


def scrape(port: int | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    assert port is not None, "the agent serves no HTTP endpoint"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


# -- cgroup paths ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{'a' * 64}.scope\n",
        f"0::/kubepods/burstable/pod{UID}/{'a' * 64}\n",
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{'a' * 64}.scope\n",
        f"12:pids:/kubepods/besteffort/pod{UID}/{'a' * 64}\n11:memory:/kubepods/besteffort/pod{UID}/{'a' * 64}\n",
        f"5:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}"
        f".slice/docker-{'a' * 64}.scope\n1:name=systemd:/\n",
    ],
    ids=["v2-systemd", "v2-cgroupfs", "v2-crio", "v1-cgroupfs", "v1-systemd-docker"],
)
def test_cgroup_paths_name_the_pod_and_container(text: str) -> None:
    ref = parse_cgroup(text)
    assert ref is not None and ref.pod_uid == UID and ref.container_id == "a" * 64


def test_processes_outside_pods_are_not_attributed() -> None:
    assert parse_cgroup("0::/system.slice/nvidia-persistenced.service\n") is None
    assert parse_cgroup("0::/user.slice/user-0.slice/session-1.scope\n") is None


# -- NVML's documented return codes ---------------------------------------------------------------------
def test_sampler_follows_nvml_return_codes() -> None:
    gpu = fake_pynvml.FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000001")
    fake_pynvml.install(fake_pynvml.FakeDriver(gpus=[gpu]))
    try:
        sampler = NvmlSampler(fake_pynvml)
        first = sampler.sample([gpu.uuid])[gpu.uuid]
        assert first.memory == {} and first.utilization_known, "no samples yet is NOT_FOUND, not a failure"
        gpu.processes = {10: GiB, 11: None}
        gpu.utilization = [(10, 1_000_000, 40, 0), (10, 2_000_000, 40, 0), (11, 2_000_000, 10, 0)]
        second = sampler.sample([gpu.uuid])[gpu.uuid]
        assert second.memory == {10: GiB, 11: None}
        assert second.busy_seconds == pytest.approx({10: 0.4, 11: 0.1}), "the first sample is the baseline"
        third = sampler.sample([gpu.uuid])[gpu.uuid]
        assert third.busy_seconds == {}, "samples already read are not counted twice"
        gpu.errors = {
            "nvmlDeviceGetProcessesUtilizationInfo": fake_pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetProcessUtilization": fake_pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetComputeRunningProcesses_v3": fake_pynvml.NVML_ERROR_NOT_SUPPORTED,
        }
        fresh = NvmlSampler(fake_pynvml).sample([gpu.uuid])[gpu.uuid]
        assert fresh.memory == {} and not fresh.utilization_known, "unsupported figures are left out"
    finally:
        fake_pynvml.install(None)


# -- the config ---------------------------------------------------------------------------------------------
def test_watchdog_policy_in_gpuconfig() -> None:
    assert parse_gpu_config(limiter_config("Terminate")).watchdog.policy == WatchdogPolicy.TERMINATE  # type: ignore[union-attr]
    with pytest.raises(
        ConfigError, match=r"watchdog\.policy: unknown watchdog policy 'Kill'; allowed: Report, Terminate"
    ):
        parse_gpu_config(limiter_config("Kill"))


# -- /metrics equal what the fakes hold -----------------------------------------------------------------
def test_metrics_equal_the_fakes_and_go_away_with_the_claim(dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    shared = add_claim(
        api,
        "shared",
        [
            Alloc(
                device="gpu-0",
                share_id="00000000-0000-4000-8000-00000000000a",
                consumed={"memory": "4Gi", "cores": "30"},
            )
        ],
        [opaque(limiter_config())],
        namespace="default",
    )
    whole = add_claim(api, "whole", [Alloc(device="gpu-1")], namespace="default")
    with plugin_with_nvml(dirs, api, proc_root) as (plugin, driver):
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert not kubelet.prepare(shared, whole)[uid_of(shared)].error
        pod_a, cid_a = add_pod(api, "infer", ["shared"])
        pod_b, cid_b = add_pod(api, "train", ["whole"])
        pod_c, cid_c = add_pod(api, "eval", ["whole"])
        fake_proc(proc_root, 4001, pod_a, cid_a, limiter=True)
        fake_proc(proc_root, 4002, pod_b, cid_b, limiter=False, systemd=False)
        fake_proc(proc_root, 4003, pod_c, cid_c, limiter=False, systemd=False)
        gpu0, gpu1 = driver.gpus
        gpu0.processes = {4001: GiB}
        gpu1.processes = {4002: 3 * GiB, 4003: GiB}
        gpu1.utilization = [(4002, 1_000_000, 50, 10), (4002, 3_000_000, 50, 10)]
        monitor_of(plugin).sample_once()
        monitor_of(plugin).sample_once()

        metrics = scrape(plugin.http_port)
        a = {"namespace": "default", "claim": "shared", "gpu_uuid": gpu0.uuid}
        b = {"namespace": "default", "claim": "whole", "gpu_uuid": gpu1.uuid}
        assert sorted(metrics["dra_gpu_claim_memory_used_bytes"], key=str) == sorted(
            [(a, GiB), (b, 4 * GiB)], key=str
        )
        assert ({**a, "sharing": "Limiter"}, 4 * GiB) in metrics["dra_gpu_claim_memory_limit_bytes"]
        whole_gpu = plugin.inventory.gpus()[1].memory_bytes
        assert ({**b, "sharing": "Exclusive"}, whole_gpu) in metrics["dra_gpu_claim_memory_limit_bytes"], (
            "a whole GPU's limit is the GPU"
        )

        assert "dra_gpu_claim_compute_share_ratio" not in metrics, (
            "a share is the claim's config, not a series"
        )
        busy = dict(
            (labels["claim"], value) for labels, value in metrics["dra_gpu_claim_compute_busy_seconds_total"]
        )
        assert busy["whole"] == pytest.approx(1.0)
        containers = sorted(metrics["dra_gpu_container_memory_used_bytes"], key=str)
        assert containers == sorted(
            [
                ({**b, "pod": "train", "container": "main"}, 3 * GiB),
                ({**b, "pod": "eval", "container": "main"}, GiB),
            ],
            key=str,
        ), "a claim used by one container has its claim's series alone; one used by two, a series each"
        assert "dra_gpu_watchdog_violations_total" not in metrics, "nothing escaped its share"
        throttled = [
            labels["claim"] for labels, _ in metrics.get("dra_gpu_claim_throttled_seconds_total", [])
        ]
        assert "whole" not in throttled, "only claims with a limiter region can be throttled"

        assert kubelet.unprepare(whole)[uid_of(whole)] == ""
        monitor_of(plugin).sample_once()
        metrics = scrape(plugin.http_port)
        claims = {labels["claim"] for labels, _ in metrics["dra_gpu_claim_memory_used_bytes"]}
        assert claims == {"shared"}, "an unprepared claim's series are gone"
        assert "dra_gpu_container_memory_used_bytes" not in metrics, "its containers' too"
        kubelet.close()


# -- the watchdog -------------------------------------------------------------------------------------------
def _child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])


def _events(api: FakeKube, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in api.objects("Event")
        if e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name
    ]


@pytest.mark.parametrize("policy", ["Report", "Terminate"])
def test_process_beyond_its_share_without_the_limiter_is_caught(
    dirs: PluginDirs, tmp_path: Path, policy: str
) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    greedy = gpu_share(api, "greedy", "2Gi", [opaque(limiter_config(policy))], n=1)
    polite = gpu_share(api, "polite", "8Gi", [opaque(limiter_config(policy))], n=2)
    offender, bystander = _child(), _child()
    try:
        with plugin_with_nvml(dirs, api, proc_root, interval_s=0.2) as (plugin, driver):
            kubelet = Kubelet(dirs.registration_dir)
            kubelet.register()
            prepared = kubelet.prepare(greedy, polite)
            assert not prepared[uid_of(greedy)].error and not prepared[uid_of(polite)].error
            pod_g, cid_g = add_pod(api, "greedy-pod", ["greedy"])
            pod_p, cid_p = add_pod(api, "polite-pod", ["polite"])
            fake_proc(proc_root, offender.pid, pod_g, cid_g, limiter=False)
            fake_proc(proc_root, bystander.pid, pod_p, cid_p, limiter=True)
            start = monitor_of(plugin).samples
            driver.gpus[0].processes = {offender.pid: 6 * GiB, bystander.pid: 7 * GiB}
            wait_for(lambda: monitor_of(plugin).samples >= start + 2, what="two samplings")

            reasons = {e["reason"] for e in _events(api, "ResourceClaim", "greedy")}
            assert reasons == {"LimiterMissing", "MemoryOverLimit"}, "reported within two intervals"
            assert {e["reason"] for e in _events(api, "Pod", "greedy-pod")} == reasons
            message = next(
                e["message"] for e in _events(api, "Pod", "greedy-pod") if e["reason"] == "MemoryOverLimit"
            )
            assert f"process {offender.pid} in container main of pod default/greedy-pod" in message
            assert not _events(api, "ResourceClaim", "polite") and not _events(api, "Pod", "polite-pod")
            metrics = scrape(plugin.http_port)
            violations = {
                (labels["claim"], labels["reason"]): value
                for labels, value in metrics["dra_gpu_watchdog_violations_total"]
            }
            assert violations == {("greedy", "LimiterMissing"): 1.0, ("greedy", "MemoryOverLimit"): 1.0}
            if policy == "Terminate":
                offender.wait(timeout=30)
                assert offender.returncode == -signal.SIGKILL, "over its memory cap: killed at once"
                assert sum(v for _, v in metrics["dra_gpu_watchdog_terminations_total"]) == 1, "killed once"
                killed = [e for e in _events(api, "Pod", "greedy-pod") if "the process was" in e["message"]]
                assert len(killed) == 2, "both violations say what happened"
            else:
                assert offender.poll() is None, "Report never kills"
            assert bystander.poll() is None, "a process of another claim is never touched"
            kubelet.close()
    finally:
        for child in (offender, bystander):
            child.kill()
            child.wait()


def test_process_on_a_gpu_its_claims_do_not_hold_is_reported(dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = add_claim(api, "one-gpu", [Alloc(device="gpu-0")])
    other = add_claim(api, "another", [Alloc(device="gpu-1")])  # this driver allocated gpu-1 to another claim
    with plugin_with_nvml(dirs, api, proc_root) as (plugin, driver):
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert not any(r.error for r in kubelet.prepare(claim, other).values())
        pod, cid = add_pod(api, "wanderer", ["one-gpu"])
        fake_proc(proc_root, 5001, pod, cid, limiter=False)
        driver.gpus[1].processes = {5001: GiB}
        monitor_of(plugin).sample_once()
        events = _events(api, "ResourceClaim", "one-gpu")
        assert [e["reason"] for e in events] == ["GpuNotAllocated"]
        assert driver.gpus[1].uuid in events[0]["message"]
        kubelet.close()


def test_a_claim_config_cannot_loosen_the_class_watchdog_policy(dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    claim = add_claim(
        api,
        "tenant",
        [
            Alloc(
                device="gpu-0",
                share_id="00000000-0000-4000-8000-00000000000a",
                consumed={"memory": "1Gi", "cores": "50"},
            )
        ],
        [
            opaque(limiter_config("Terminate"), source="FromClass"),
            opaque(limiter_config("Report"), source="FromClaim"),
        ],
    )
    with plugin_with_nvml(dirs, api, tmp_path / "proc") as _:
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert not kubelet.prepare(claim)[uid_of(claim)].error
        (share,) = dirs.checkpoint().claims[uid_of(claim)].shares
        assert share.detail["watchdog"] == "Terminate"
        assert share.detail["memoryLimit"] == str(2**30)
        kubelet.close()


def test_a_negative_monitor_interval_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from dra_gpu.cli import main

    assert main(["kubelet-plugin", "--node-name", "n", "--monitor-interval=-1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --monitor-interval must be 0 (off) or a positive number of seconds"
    )


def test_fake_per_process_calls_have_the_bindings_names_and_fields() -> None:
    import pynvml  # a project dependency: missing, the test fails

    for name in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetProcessesUtilizationInfo",
    ):
        assert callable(getattr(pynvml, name)) and callable(getattr(fake_pynvml, name))
    for struct in ("c_nvmlProcessUtilizationSample_t", "c_nvmlProcessUtilizationInfo_v1_t"):
        real = [f[0] for f in getattr(pynvml, struct)._fields_]
        assert [f[0] for f in getattr(fake_pynvml, struct)._fields_] == real
    real_process = [f[0] for f in pynvml.c_nvmlProcessInfo_v3_t._fields_]
    gpu = fake_pynvml.FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000002", processes={1: 5})
    fake_pynvml.install(fake_pynvml.FakeDriver(gpus=[gpu]))
    try:
        fake_pynvml.nvmlInit()
        (proc,) = fake_pynvml.nvmlDeviceGetComputeRunningProcesses(fake_pynvml.nvmlDeviceGetHandleByIndex(0))
        assert sorted(vars(proc)) == sorted(real_process)
    finally:
        fake_pynvml.install(None)


def test_the_context_allowance_and_grace_period_are_the_agents_settings(dirs: PluginDirs) -> None:
    """`--watchdog-context-allowance` and `--watchdog-grace-period` reach the monitor and the watchdog."""
    from plugin_harness import running_plugin

    with running_plugin(dirs, FakeKube(), watchdog_context_allowance=3 * GiB, watchdog_grace_s=2.5) as plugin:
        assert monitor_of(plugin).context_allowance == 3 * GiB
        assert monitor_of(plugin).watchdog.grace_s == 2.5
    with running_plugin(dirs, FakeKube()) as plugin:
        assert monitor_of(plugin).context_allowance == 2 * GiB, (
            "the default: above a PyTorch process's context"
        )
        assert monitor_of(plugin).watchdog.grace_s == 10.0
