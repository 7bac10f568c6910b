"""The watchdog never acts on an innocent process: GPUs of another allocator, a compliant process with a
real CUDA context, usage of another container's claim, a reused PID; and it stops an offender with SIGTERM,
then SIGKILL through a pidfd. Its truth is NVML's, and a region that NVML contradicts is reported."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

from monitor_harness import GiB, add_pod, fake_proc, gpu_share, prepared_agent, reaped, sleeper
from plugin_harness import PluginDirs, monitor_of, opaque, uid_of
from test_monitor import _events, limiter_config
from waiting import wait_for

from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.region import read_region
from dra_gpu.monitor.process_owner import ProcReader

MiB = 2**20


def _share(api: FakeKube, name: str, memory: str, policy: str = "Terminate", n: int = 1) -> dict[str, Any]:
    return gpu_share(api, name, memory, [opaque(limiter_config(policy))], n)


def test_innocent_processes_are_left_alone(dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    small, large = _share(api, "a-small", "2Gi", n=1), _share(api, "b-large", "8Gi", n=2)
    children = [sleeper() for _ in range(3)]
    compliant, other_gpu, second_container = children
    with reaped(*children), prepared_agent(dirs, api, proc_root, small, large) as (plugin, driver, _):
        # One pod, two containers: "main" uses the small claim, "big" the large one (same GPU).
        pod_uid, cid = add_pod(api, "two", ["a-small", "b-large"])
        pod = api.get("Pod", "two", "default")
        pod["spec"]["containers"] = [
            {"name": "main", "image": "app", "resources": {"claims": [{"name": "a-small"}]}},
            {"name": "big", "image": "app", "resources": {"claims": [{"name": "b-large"}]}},
        ]
        big_cid = "b" * 64
        pod["status"]["containerStatuses"].append({"name": "big", "containerID": f"containerd://{big_cid}"})
        api.update_status("Pod", api.update("Pod", pod) | {"status": pod["status"]})
        fake_proc(proc_root, compliant.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, other_gpu.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, second_container.pid, pod_uid, big_cid, limiter=True)
        # (b) at its limit (the limiter charged its context within it) plus module code the driver loaded
        #     without a call the limiter sees (PyTorch's: 88 MiB), twice: 2 GiB + 176 MiB;
        # (c) 7 GiB in the other container, within its own claim's 8 GiB;
        driver.gpus[0].processes = {compliant.pid: 2 * GiB + 176 * MiB, second_container.pid: 7 * GiB}
        # (a) a GPU this driver never allocated (the device plugin's, say).
        driver.gpus[1].processes = {other_gpu.pid: 10 * GiB}
        monitor_of(plugin).sample_once()
        monitor_of(plugin).sample_once()
        events = [e for e in api.objects("Event") if e["reason"] != "AccountingMismatch"]
        assert events == []
        assert all(c.poll() is None for c in children), "nobody is stopped"


def test_an_offender_gets_sigterm_then_sigkill_and_a_reused_pid_nothing(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = _share(api, "greedy", "2Gi")
    stubborn, reused = sleeper(ignore_term=True), sleeper()
    with reaped(stubborn, reused), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "greedy-pod", ["greedy"])
        fake_proc(proc_root, stubborn.pid, pod_uid, cid, limiter=False)
        fake_proc(proc_root, reused.pid, pod_uid, cid, limiter=False)
        driver.gpus[0].processes = {stubborn.pid: 1 * GiB}  # within its cap: LimiterMissing only
        watchdog = monitor_of(plugin).watchdog
        watchdog.grace_s = 0.0
        monitor_of(plugin).sample_once()  # SIGTERM, which it ignores
        assert stubborn.poll() is None
        monitor_of(plugin).sample_once()  # past the grace period: SIGKILL
        assert stubborn.wait(timeout=30) == -signal.SIGKILL
        # A violation seen for a process of another start time (the PID was reused since): reported,
        # never signalled.
        fake_proc(proc_root, reused.pid, pod_uid, cid, limiter=False)
        seen = dataclasses.replace(
            watchdog.active[0],
            pid=reused.pid,
            start=(ProcReader(proc_root).start_time(reused.pid) or 0) + 1,
        )
        watchdog.handle([seen], {reused.pid})
        said = [
            e["message"]
            for e in _events(api, "Pod", "greedy-pod")
            if f"process {reused.pid} " in e["message"]
        ]
        assert len(said) == 1 and said[0].endswith("it could not be terminated")
        assert reused.poll() is None


def test_a_region_that_nvml_contradicts_is_reported(dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = _share(api, "rewritten", "8Gi", policy="Report")
    child = sleeper()
    with reaped(child), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "p", ["rewritten"])
        fake_proc(proc_root, child.pid, pod_uid, cid, limiter=True)
        state = dirs.state_dir / "claims" / uid_of(claim) / "limiter"
        region = state / "dragpu-limiter.region"
        # The device entry as the library makes it, then every counter zeroed by a tenant: 0 bytes.
        with open(region, "r+b") as f:
            f.seek(64)
            f.write(driver.gpus[0].uuid.encode().ljust(48, b"\0") + (1).to_bytes(4, "little"))
        assert [d.used_bytes for d in read_region(state) or []] == [0]
        driver.gpus[0].processes = {child.pid: 6 * GiB}
        monitor_of(plugin).sample_once()
        assert [e["reason"] for e in _events(api, "ResourceClaim", "rewritten")] == ["AccountingMismatch"]
        assert child.poll() is None


def test_a_fifo_for_a_region_does_not_stall_the_monitor_and_a_stall_fails_healthz(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    api = FakeKube()
    claim = _share(api, "fifo", "2Gi", policy="Report")
    with prepared_agent(dirs, api, tmp_path / "proc", claim, interval_s=0.1) as (plugin, _, _):
        region = dirs.state_dir / "claims" / uid_of(claim) / "limiter" / "dragpu-limiter.region"
        region.unlink()
        os.mkfifo(region)
        start = monitor_of(plugin).samples
        wait_for(lambda: monitor_of(plugin).samples >= start + 3, what="samples past the FIFO")
        assert plugin.healthz()[0]
        monitor_of(plugin).sampled_at -= 3600  # as if the last sample never finished
        ok, why = plugin.healthz()
        assert not ok and "usage monitor" in why
