"""MPS claims as containers receive them, with real (stand-in) control daemons: each GPU's daemon runs
in a mount namespace of its own whose /dev/shm is a size-bounded tmpfs, and only the MPS claims on
that GPU (its clients) mount that tmpfs as their /dev/shm."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from container_node import Limiter, plugin_node
from container_support import Podman, Result, sections
from plugin_harness import Alloc, gpu_config

from dra_gpu.host.nvidia import NvidiaCommands

pytestmark = pytest.mark.container

FAKE_MPS = Path(__file__).resolve().parents[1] / "fakes" / "fake_mps_daemon.py"
SHM_BYTES = 64 << 20
SHARE = "7a1b2c3d-0000-4000-8000-0000000000"


def _shm_mount(result: Result) -> list[str]:
    return [line.split() for line in result.section("mounts") if line.split()[1:2] == ["/dev/shm"]][-1]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_two_mps_claims_on_one_gpu_share_only_their_daemons_bounded_shm(
    podman: Podman, limiter_build: Limiter
) -> None:
    commands = NvidiaCommands(
        nvidia_smi=shutil.which("true") or "/bin/true",
        mps_control=str(FAKE_MPS),
        timeout_s=20,
        start_wait_s=10,
        isolate_shm=True,
        mps_shm_bytes=SHM_BYTES,
    )
    assert os.access(FAKE_MPS, os.X_OK), (
        f"{FAKE_MPS} must be executable: the agent runs it as the control program"
    )
    mps = gpu_config("MPS")
    with plugin_node(limiter_build, podman.cdi_dir, commands=commands) as node:
        gpu0, gpu1 = node.gpus["gpu-0"].uuid, node.gpus["gpu-1"].uuid
        capacity = {"memory": "4Gi", "cores": "20"}
        _, a = node.prepare("mps-a", [Alloc(device="gpu-0", share_id=SHARE + "0a", consumed=capacity)], mps)
        _, b = node.prepare("mps-b", [Alloc(device="gpu-0", share_id=SHARE + "0b", consumed=capacity)], mps)
        _, c = node.prepare("mps-c", [Alloc(device="gpu-1", share_id=SHARE + "0c", consumed=capacity)], mps)
        look = sections(
            mounts="cat /proc/mounts", write="echo from-a > /dev/shm/from-a && echo ok", shm="ls /dev/shm"
        )
        in_a = podman.run(look, devices=a).check()
        in_b = podman.run(sections(mounts="cat /proc/mounts", shm="ls /dev/shm"), devices=b).check()
        in_c = podman.run(sections(mounts="cat /proc/mounts", shm="ls /dev/shm"), devices=c).check()
        node.unprepare_all()
        for uuid in (gpu0, gpu1):
            assert not (node.dirs.state_dir / "mps" / uuid).exists(), "the last claim takes the daemon"

    # Memory, not the node's disk, and bounded: the daemon's tmpfs of the configured size.
    for result in (in_a, in_b, in_c):
        fields = _shm_mount(result)
        assert fields[2] == "tmpfs" and f"size={SHM_BYTES // 1024}k" in fields[3].split(","), fields
    # The GPU's daemon wrote into its own /dev/shm; its clients (claims a and b) see that file and
    # each other's, the other GPU's client (claim c) sees only its own daemon's.
    assert in_a.section("write") == ["ok"]
    assert sorted(in_a.section("shm")) == [f"daemon-{gpu0}", "from-a"]
    assert sorted(in_b.section("shm")) == [f"daemon-{gpu0}", "from-a"]
    assert in_c.section("shm") == [f"daemon-{gpu1}"]
