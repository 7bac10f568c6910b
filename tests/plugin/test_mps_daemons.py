"""MPS control daemons outlive the node agent: real processes (a stand-in control program whose
daemon lives until told to quit), an agent killed as its container would be, and a new agent that
adopts what it finds."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from fakes.fake_mps_daemon import daemon_pid
from plugin_harness import (
    NODE,
    PROFILE,
    Alloc,
    Kubelet,
    PluginDirs,
    PluginProcess,
    add_claim,
    gpu_config,
    opaque,
    uid_of,
    write_snapshot,
)
from repo_paths import TESTS

from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.sharing.modes.mps.daemon import mps_dir

FAKE_MPS = TESTS / "fakes" / "fake_mps_daemon.py"
GPU0 = SimulatedInventory(PROFILE, seed=NODE).gpus()[0].uuid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def dirs() -> Iterator[PluginDirs]:
    dirs = PluginDirs.create()
    yield dirs
    pid = daemon_pid(mps_dir(dirs.state_dir, GPU0) / "pipe")
    if pid is not None:
        os.kill(pid, 9)
    dirs.cleanup()


def test_mps_daemon_and_its_client_survive_the_agent_and_go_with_the_last_claim(
    dirs: PluginDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeKube()
    mps = [opaque(gpu_config("MPS"))]
    share = "5e1d0b3a-0000-4000-8000-0000000000"
    a = add_claim(
        api,
        "mps-a",
        [Alloc(device="gpu-0", share_id=share + "0a", consumed={"memory": "4Gi", "cores": "20"})],
        mps,
    )
    b = add_claim(
        api,
        "mps-b",
        [Alloc(device="gpu-0", share_id=share + "0b", consumed={"memory": "4Gi", "cores": "20"})],
        mps,
    )
    snapshot = dirs.root / "api.json"
    write_snapshot(api, snapshot)
    starts = dirs.root / "mps-starts.log"
    monkeypatch.setenv("FAKE_MPS_LOG", str(starts))
    cgroup = dirs.root / "mps-cgroup"
    args = ("--mps-control", str(FAKE_MPS), "--mps-cgroup", str(cgroup))
    pipe = mps_dir(dirs.state_dir, GPU0) / "pipe"

    first = PluginProcess(dirs, snapshot, extra_args=args).start()
    kubelet = Kubelet(dirs.registration_dir)
    try:
        kubelet.register()
        assert kubelet.prepare(a)[uid_of(a)].error == ""
        daemon = daemon_pid(pipe)
        assert daemon is not None
        # The daemon's launcher joined the configured cgroup before it forked the daemon.
        launcher = int(starts.read_text().split()[0])
        assert (cgroup / "cgroup.procs").read_text().strip() == str(launcher)
        # A workload process of the claim: runs as long as its daemon does.
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os, time\nwhile os.path.exists({str(pipe / 'control')!r}): time.sleep(0.05)",
            ],
            start_new_session=True,
        )
        first.kill_group()  # the agent's container is killed: every process in it
        assert alive(daemon) and client.poll() is None, "the daemon and its client outlive the agent"
    finally:
        kubelet.close()
        first.kill()

    second = PluginProcess(dirs, snapshot, extra_args=args).start()
    kubelet = Kubelet(dirs.registration_dir)
    try:
        kubelet.register()
        assert kubelet.prepare(a)[uid_of(a)].error == ""  # repeated by the kubelet: adopted, not restarted
        assert kubelet.prepare(b)[uid_of(b)].error == ""  # a new claim joins the adopted daemon
        assert daemon_pid(pipe) == daemon and len(starts.read_text().splitlines()) == 1
        assert kubelet.unprepare(a) == {uid_of(a): ""}
        assert daemon_pid(pipe) == daemon and client.poll() is None, "claim b still uses it"
        assert kubelet.unprepare(b) == {uid_of(b): ""}
        assert not alive(daemon), "the last MPS claim stops the daemon"
        assert client.wait(timeout=10) == 0
        assert not mps_dir(dirs.state_dir, GPU0).exists()
    finally:
        kubelet.close()
        second.terminate()
        if client.poll() is None:
            client.kill()
