"""The driver's figures are the truth of a claim's memory: every watch of the monitor publishes to each limiter
claim the floor of what NVML says its processes hold (the library never lets the claim's account fall below
it), and stops a claim's offenders over its cap, or running without the limiter, within that one watch."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path
from typing import Any

import pytest
from monitor_harness import GiB, add_pod, fake_proc, gpu_share, prepared_agent, reaped, sleeper
from plugin_harness import PluginDirs, monitor_of, opaque, running_plugin, uid_of
from test_monitor import _events, limiter_config

from dra_gpu.cli import main
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.region import FLOOR_FILE, floor_uuids, make_floor, write_floor

MiB = 2**20


def _share(api: FakeKube, name: str, memory: str, policy: str = "Terminate", n: int = 1) -> dict[str, Any]:
    return gpu_share(api, name, memory, [opaque(limiter_config(policy))], n)


def _floor(path: Path) -> dict[str, tuple[int, int, int]]:
    """uuid -> (floor bytes, region count, sequence) as the library reads the file (region.c)."""
    data = path.read_bytes()
    magic, version, count = struct.unpack_from("=QII", data)
    assert (magic, version, count) == (0x314C464741524444, 1, 16) and len(data) == 4096
    (seq,) = struct.unpack_from("=Q", data, 16)
    out = {}
    for i in range(16):
        uuid, used, region = struct.unpack_from("=48sqq", data, 64 + 64 * i)
        if uuid.strip(b"\0"):
            out[uuid.split(b"\0", 1)[0].decode()] = (used, region, seq)
    return out


def test_each_watch_publishes_the_claims_floor_from_nvml(dirs: PluginDirs, tmp_path: Path) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = _share(api, "served", "8Gi", policy="Report")
    a, b, outsider = sleeper(), sleeper(), sleeper()
    with reaped(a, b, outsider), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, kubelet):
        state = dirs.state_dir / "claims" / uid_of(claim) / "limiter"
        floor = state / FLOOR_FILE
        gpu = driver.gpus[0].uuid
        # Made at prepare, beside the region, in the directory the container sees read-only.
        assert floor_uuids(floor) == [gpu] and _floor(floor)[gpu][:2] == (0, 0)
        pod_uid, cid = add_pod(api, "p", ["served"])
        fake_proc(proc_root, a.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, b.pid, pod_uid, cid, limiter=True)
        monitor_of(plugin).floor_interval_s = 0.0  # every watch publishes (the agent's pace is 1 s)
        # Two processes of the claim, and one of no pod (an MPS server, the host): only the claim's count.
        driver.gpus[0].processes = {a.pid: 3 * GiB, b.pid: 1 * GiB, outsider.pid: 20 * GiB}
        monitor_of(plugin).watch_once()
        first = _floor(floor)[gpu]
        assert first[:2] == (4 * GiB, 0)  # the region holds nothing the library charged
        # The claim frees (NVML says so): the floor falls with the next watch, under a new sequence.
        driver.gpus[0].processes = {a.pid: 3 * GiB}
        monitor_of(plugin).watch_once()
        second = _floor(floor)[gpu]
        assert second[:2] == (3 * GiB, 0) and second[2] > first[2] and second[2] % 2 == 0
        # Unprepared: the floor goes with the region.
        assert not kubelet.unprepare(claim)[uid_of(claim)]
        assert not floor.exists()


def test_a_claim_over_its_cap_by_nvml_loses_its_offender_within_one_watch(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    """1 GiB cap, two processes with the limiter: one within its share, one holding 2 GiB (a forged region
    let it; NVML shows it). The one watch that sees it kills the offender - not its neighbour - though the
    claim is within the 512 MiB per process that a limiter claim was allowed before: the allowance is the
    claim's (256 MiB), not each process's."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = _share(api, "capped", "1Gi")
    modest, greedy = sleeper(), sleeper()
    with reaped(modest, greedy), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "p", ["capped"])
        fake_proc(proc_root, modest.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, greedy.pid, pod_uid, cid, limiter=True)
        monitor = monitor_of(plugin)
        # Within the cap and the module code two processes load unseen at the cap: left alone.
        driver.gpus[0].processes = {modest.pid: 300 * MiB, greedy.pid: 724 * MiB + 2 * 88 * MiB}
        monitor.watch_once()
        assert _events(api, "ResourceClaim", "capped") == []
        driver.gpus[0].processes = {modest.pid: 300 * MiB, greedy.pid: 2 * GiB}
        monitor.watch_once()  # SIGKILL: the memory is another claim's
        assert greedy.wait(timeout=30) == -signal.SIGKILL
        assert modest.poll() is None
        said = [e["reason"] for e in _events(api, "ResourceClaim", "capped")]
        assert said == ["MemoryOverLimit"]


def test_a_process_without_the_limiter_is_stopped_within_one_watch(dirs: PluginDirs, tmp_path: Path) -> None:
    """A process in the claim's container with GPU memory and no limiter mapped (an LD_AUDIT library kept
    /etc/ld.so.preload from loading it, a static binary): reported and, under Terminate, stopped by the
    watch, before any full sample."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = _share(api, "audited", "4Gi")
    bare, kept = sleeper(), sleeper()
    with reaped(bare, kept), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "p", ["audited"])
        fake_proc(proc_root, bare.pid, pod_uid, cid, limiter=False)
        fake_proc(proc_root, kept.pid, pod_uid, cid, limiter=True)
        driver.gpus[0].processes = {bare.pid: 100 * MiB, kept.pid: 1 * GiB}
        samples = monitor_of(plugin).samples
        monitor_of(plugin).watch_once()
        assert bare.wait(timeout=30) == -signal.SIGTERM
        assert kept.poll() is None
        assert monitor_of(plugin).samples == samples, "a watch is not a full sample"
        said = [e["reason"] for e in _events(api, "Pod", "p")]
        assert said == ["LimiterMissing"]


def test_the_floor_is_written_in_place_and_only_for_its_gpus(tmp_path: Path) -> None:
    """The library maps the file: it must be rewritten in place (a new file would leave every running process
    on the old one), under an even sequence when done; GPUs it has no entry for are not added."""
    path = tmp_path / FLOOR_FILE
    make_floor(path, ["GPU-a", "GPU-b"])
    inode = os.stat(path).st_ino
    assert write_floor(path, {"GPU-b": (5 * GiB, 4 * GiB), "GPU-c": (1, 1)})
    assert os.stat(path).st_ino == inode
    got = _floor(path)
    assert {u: v[:2] for u, v in got.items()} == {"GPU-a": (0, 0), "GPU-b": (5 * GiB, 4 * GiB)}
    assert got["GPU-b"][2] == 2
    assert not write_floor(tmp_path / "missing", {"GPU-a": (1, 1)})


def test_the_watch_interval_is_the_agents_setting(
    dirs: PluginDirs, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_plugin(dirs, FakeKube(), monitor_watch_interval_s=0.25) as plugin:
        assert monitor_of(plugin).watch_interval_s == 0.25
    with running_plugin(dirs, FakeKube()) as plugin:
        assert monitor_of(plugin).watch_interval_s == 1.0
    assert main(["kubelet-plugin", "--node-name", "n", "--monitor-watch-interval=0"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: --monitor-watch-interval must be a positive number of seconds"
    )
