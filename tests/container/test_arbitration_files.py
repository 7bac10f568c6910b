"""A claim's processes can write their own activity file and no other claim's, nor their GPU's board.

Two limiter claims share gpu-0, each set up by the agent as for a pod (its CDI spec: the GPU's arbitration
directory read-only at /run/dra-gpu/gpus/<uuid>, its own activity file a read-write mount of its own in its
state directory). A container of the first claim tries, as a pod's non-root UID and as the container's root,
to write the other claim's activity file, the board, and its own; the host's files say what happened.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest
from container_node import Node
from container_support import Podman, Result, Volume, mount_options, preflight, sections
from plugin_harness import Alloc, gpu_config

from dra_gpu.limiter_abi import board
from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT, CONTAINER_GPUS_ROOT

pytestmark = pytest.mark.container

TENANT = "1000:1000"
FORGED = "FORGED!!"


def _write(path: str, offset: int) -> str:
    """Write FORGED at `offset` of `path` in place; print `wrote` or `refused`."""
    return f"printf '{FORGED}' | dd of={path} bs=1 seek={offset} conv=notrunc 2>/dev/null && echo wrote || echo refused"


def _run_as(podman: Podman, user: str, script: str, ids: Sequence[str], volumes: Sequence[Volume]) -> Result:
    """`podman.run` with `--user`: the container's processes run as that UID:GID."""
    preflight(podman.cdi_dir, ids)
    argv = podman.argv(script, ids, volumes)
    at = argv.index(podman.image)
    argv[at:at] = ["--user", user]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    return Result(argv, proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("user", [TENANT, "0:0"])
def test_a_claim_writes_only_its_own_activity_file(
    node: Node, podman: Podman, driver_stand_in: list[Volume], user: str
) -> None:
    gpu = node.gpus["gpu-0"].uuid
    latency = gpu_config("Limiter", limiter={"compute": {"limit": 100, "priority": "latency"}})
    mine, ids = node.prepare(
        "inference",
        [Alloc(share_id="3c4d5e6f-0000-4000-8000-000000000001", consumed={"memory": "1Gi", "cores": "30"})],
        latency,
    )
    theirs, _ = node.prepare(
        "training",
        [Alloc(share_id="3c4d5e6f-0000-4000-8000-000000000002", consumed={"memory": "1Gi", "cores": "20"})],
        gpu_config("Limiter", limiter={"compute": {"limit": 100, "priority": "besteffort"}}),
    )
    own_uid, other_uid = mine["metadata"]["uid"], theirs["metadata"]["uid"]
    gpu_dir = f"{CONTAINER_GPUS_ROOT}/{gpu}"
    own = f"{CONTAINER_CLAIMS_ROOT}/{own_uid}/limiter/{gpu}.activity"
    host_dir = node.dirs.state_dir / "gpus" / gpu
    board_before = (host_dir / "board").read_bytes()
    other_before = (host_dir / f"{other_uid}.activity").read_bytes()

    script = sections(
        listing=f"ls {gpu_dir}",
        mounts="cat /proc/self/mountinfo",
        other=_write(f"{gpu_dir}/{other_uid}.activity", 16),
        other_by_dir=f"rm -f {gpu_dir}/{other_uid}.activity 2>/dev/null; test -e {gpu_dir}/{other_uid}.activity && echo still-there",
        board=_write(f"{gpu_dir}/board", 64),
        own=_write(own, 16),
        own_via_dir=_write(f"{gpu_dir}/{own_uid}.activity", 24),
    )
    result = _run_as(podman, user, script, ids, driver_stand_in).check()

    assert sorted(result.section("listing")) == sorted(
        ["board", f"{own_uid}.activity", f"{other_uid}.activity"]
    )
    mountinfo = result.section("mounts")
    assert "ro" in mount_options(mountinfo, gpu_dir)
    assert "rw" in mount_options(mountinfo, own)
    assert result.section("other") == ["refused"]
    assert result.section("other_by_dir") == ["still-there"]
    assert result.section("board") == ["refused"]
    assert result.section("own") == ["wrote"]
    assert result.section("own_via_dir") == ["refused"], "only through its own file's mount"
    # On the host: the board and the other claim's file are as the agent made them; the claim's own file
    # holds what its processes wrote (its own word, read back by the monitor).
    assert (host_dir / "board").read_bytes() == board_before
    assert (host_dir / f"{other_uid}.activity").read_bytes() == other_before
    assert (host_dir / f"{own_uid}.activity").read_bytes()[16:24] == FORGED.encode()
    assert board.read_board(host_dir / "board") == sorted(
        [board.Entry(own_uid, 30, 100, "latency"), board.Entry(other_uid, 20, 100, "besteffort")]
    )
