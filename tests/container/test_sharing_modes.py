"""Each sharing mode as a container receives it: podman applies the spec the plugin wrote for a claim.

Every test prepares a claim over gRPC as the kubelet does, hands podman a ``--device`` for every CDI id
prepare returned, and looks from inside the container (its environment, /proc/self/mountinfo, files).
"""

from __future__ import annotations

import hashlib
import uuid

import pytest
from container_node import Limiter, Node
from container_support import Podman, Result, Volume, mount_options, sections
from plugin_harness import Alloc, gpu_config

from dra_gpu.plugin.sharing.limiter import CONTAINER_LIBRARY, CONTAINER_STATE_DIR
from dra_gpu.plugin.sharing.mps import CONTAINER_PIPE_DIR, mps_dir
from dra_gpu.quantity import parse_quantity, to_int

pytestmark = pytest.mark.container

MIB = 1024 * 1024
ENFORCEMENT_ENV = ("LD_PRELOAD", "DRAGPU_MEMORY_LIMIT", "DRAGPU_CORES_LIMIT", "DRAGPU_LIMITER_", "CUDA_MPS_")
ENFORCEMENT_MOUNTS = (CONTAINER_LIBRARY, CONTAINER_STATE_DIR, CONTAINER_PIPE_DIR)
SHARE_ID = "3c2b1a00-0000-4000-8000-0000000000"
LOOK = sections(env="env", mounts="cat /proc/self/mountinfo")


def _mount_points(result: Result) -> set[str]:
    return {line.split()[4] for line in result.section("mounts") if len(line.split()) > 4}


def _assert_no_limiter_or_mps(result: Result) -> None:
    env = result.env()
    assert sorted(k for k in env if k.startswith(ENFORCEMENT_ENV)) == []
    assert _mount_points(result) & set(ENFORCEMENT_MOUNTS) == set()


@pytest.mark.parametrize("devices", [["gpu-1"], ["gpu-1", "gpu-0"]], ids=["one-gpu", "two-gpus"])
def test_exclusive_container_sees_exactly_the_allocated_gpus(
    node: Node, podman: Podman, devices: list[str]
) -> None:
    allocs = [Alloc(device=d, request=f"gpu{i}") for i, d in enumerate(devices)]
    _, ids = node.prepare(f"exclusive-{len(devices)}", allocs, gpu_config("Exclusive"))
    assert len(ids) == len(devices)

    result = podman.run(LOOK, devices=ids).check()

    env = result.env()
    expected = ",".join(node.gpus[d].uuid for d in devices)  # in allocation order: CUDA ordinals follow it
    assert env["NVIDIA_VISIBLE_DEVICES"] == expected
    assert env["CUDA_VISIBLE_DEVICES"] == expected
    _assert_no_limiter_or_mps(result)


def test_time_sliced_container_gets_its_gpu_and_nothing_of_the_limiter_or_mps(
    node: Node, podman: Podman
) -> None:
    allocs = [Alloc(device="gpu-0", share_id=SHARE_ID + "01", consumed={"memory": "8Gi", "cores": "10"})]
    _, ids = node.prepare("time-sliced", allocs, gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}))

    result = podman.run(LOOK, devices=ids).check()

    env = result.env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == node.gpus["gpu-0"].uuid
    assert env["CUDA_VISIBLE_DEVICES"] == node.gpus["gpu-0"].uuid
    _assert_no_limiter_or_mps(result)


def test_mps_client_gets_the_pipe_directory_and_limits_from_the_claims_capacity(
    node: Node, podman: Podman
) -> None:
    memory, cores = "10Gi", "30"
    allocs = [Alloc(device="gpu-0", share_id=SHARE_ID + "02", consumed={"memory": memory, "cores": cores})]
    _, ids = node.prepare("mps", allocs, gpu_config("MPS"))
    gpu = node.gpus["gpu-0"]
    host_pipe = mps_dir(node.dirs.state_dir, gpu.uuid) / "pipe"
    token = f"client-{uuid.uuid4().hex}"
    (host_pipe / "from-host").write_text(token + "\n")

    result = podman.run(
        LOOK
        + "; "
        + sections(
            seen=f"cat {CONTAINER_PIPE_DIR}/from-host",
            wrote=f"echo {token} > {CONTAINER_PIPE_DIR}/{token} && echo ok",
            shm=f"echo {token} > /dev/shm/{token} && echo ok",
        ),
        devices=ids,
    ).check()

    env = result.env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(to_int(parse_quantity(cores)))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={to_int(parse_quantity(memory)) // MIB}M"
    # The control daemon's pipe directory itself, both ways: that is how an MPS client reaches it.
    assert "rw" in mount_options(result.section("mounts"), CONTAINER_PIPE_DIR)
    assert result.section("seen") == [token]
    assert result.section("wrote") == ["ok"]
    assert (host_pipe / token).read_text().strip() == token
    # Client and server exchange data through POSIX shared memory: the client's /dev/shm is the
    # GPU's shm directory, which the control daemon gets as its own /dev/shm.
    assert result.section("shm") == ["ok"]
    assert (host_pipe.parent / "shm" / token).read_text().strip() == token
    assert "LD_PRELOAD" not in env


def test_limiter_is_mounted_read_only_preloaded_and_limited_to_the_claims_capacity(
    node: Node, podman: Podman, limiter_build: Limiter, driver_stand_in: list[Volume]
) -> None:
    memory, cores = "6Gi", "25"
    allocs = [Alloc(device="gpu-1", share_id=SHARE_ID + "03", consumed={"memory": memory, "cores": cores})]
    claim, ids = node.prepare("limiter", allocs, gpu_config("Limiter"))
    gpu = node.gpus["gpu-1"]
    cap = to_int(parse_quantity(memory))
    token = f"pod-{uuid.uuid4().hex}"

    result = podman.run(
        LOOK
        + "; "
        + sections(
            library=f"sha256sum {CONTAINER_LIBRARY}",
            write_library=f"touch {CONTAINER_LIBRARY} 2>&1 && echo writable",
            write_state=f"echo {token} > {CONTAINER_STATE_DIR}/{token} && echo ok",
            probe="limiter-probe info",
        ),
        devices=ids,
        volumes=driver_stand_in,
        env={"FAKE_CUDA_MEMORY_BYTES": str(4 * cap)},
    ).check()

    env = result.env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
    assert env["LD_PRELOAD"] == CONTAINER_LIBRARY
    assert env["DRAGPU_LIMITER_STATE_DIR"] == CONTAINER_STATE_DIR
    assert env["DRAGPU_MEMORY_LIMIT_BY_UUID"] == f"{gpu.uuid}={cap}"
    assert env["DRAGPU_MEMORY_LIMIT_0"] == str(cap)
    assert env["DRAGPU_CORES_LIMIT"] == str(to_int(parse_quantity(cores)))
    assert not any(k.startswith("CUDA_MPS_") for k in env)

    # The node's library, read-only.
    digest = hashlib.sha256(limiter_build.library.read_bytes()).hexdigest()
    assert result.section("library") == [f"{digest}  {CONTAINER_LIBRARY}"]
    assert "ro" in mount_options(result.section("mounts"), CONTAINER_LIBRARY)
    assert "Read-only file system" in "\n".join(result.section("write_library"))
    # The claim's state directory, writable, the same directory for every pod of the claim.
    assert "rw" in mount_options(result.section("mounts"), CONTAINER_STATE_DIR)
    assert result.section("write_state") == ["ok"]
    assert (node.claim_dir(claim) / "limiter" / token).read_text().strip() == token
    # Preloaded for real: a CUDA program sees the claim's memory, not the GPU's.
    assert result.section("probe") == [f"total={cap} free={cap}", f"device_total={cap}"]
