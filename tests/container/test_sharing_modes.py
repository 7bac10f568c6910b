"""Each sharing mode as a container receives it: podman applies the spec the plugin wrote for a claim.

Every test prepares a claim over gRPC as the kubelet does, hands podman a ``--device`` for every CDI id
prepare returned, and looks from inside the container (its environment, /proc/self/mountinfo, files).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from pathlib import Path

import pytest
from container_node import Limiter, Node, make_device_nodes, plugin_node
from container_support import Podman, Result, Volume, mount_options, sections
from fake_driver import CONTEXT_CHARGE, usable
from plugin_harness import Alloc, gpu_config

from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT, CONTAINER_LIBRARY, CONTAINER_PRELOAD
from dra_gpu.limiter_abi.region import REGION_FILE
from dra_gpu.plugin.sharing.modes.limiter import container_claim_dir
from dra_gpu.plugin.sharing.modes.mps.common import CONTAINER_PIPE_DIR
from dra_gpu.plugin.sharing.modes.mps.daemon import mps_dir
from dra_gpu.quantity import parse_quantity, to_int

pytestmark = pytest.mark.container

MIB = 1024 * 1024
ENFORCEMENT_ENV = ("LD_PRELOAD", "DRAGPU_MEMORY_LIMIT", "DRAGPU_CORES_LIMIT", "DRAGPU_LIMITER_", "CUDA_MPS_")
ENFORCEMENT_MOUNTS = (CONTAINER_LIBRARY, CONTAINER_PRELOAD, CONTAINER_PIPE_DIR)
SHARE_ID = "3c2b1a00-0000-4000-8000-0000000000"
LOOK = sections(env="env", mounts="cat /proc/self/mountinfo", dev="ls /dev")
COMMON = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def gpu_nodes(result: Result) -> list[str]:
    return sorted(n for n in result.section("dev") if re.fullmatch(r"nvidia\d+", n))


def common_nodes(result: Result) -> list[str]:
    return sorted(n for n in result.section("dev") if n in COMMON)


def _mount_points(result: Result) -> set[str]:
    return {line.split()[4] for line in result.section("mounts") if len(line.split()) > 4}


def _assert_no_limiter_or_mps(result: Result) -> None:
    env = result.env()
    assert sorted(k for k in env if k.startswith(ENFORCEMENT_ENV)) == []
    assert _mount_points(result) & set(ENFORCEMENT_MOUNTS) == set()
    assert not any(m.startswith(CONTAINER_CLAIMS_ROOT) for m in _mount_points(result))


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    """A host /dev with the GPUs' device nodes: character devices (1:3, what /dev/null is), so the
    runtime can create them in the container and cgroup rules can name them."""
    root = tmp_path / "host"
    make_device_nodes(root, minors=(0, 1))
    return root


@pytest.mark.parametrize("devices", [["gpu-1"], ["gpu-1", "gpu-0"]], ids=["one-gpu", "two-gpus"])
def test_exclusive_container_sees_exactly_the_allocated_gpus(
    podman: Podman, limiter_build: Limiter, dev_root: Path, devices: list[str]
) -> None:
    with plugin_node(limiter_build, podman.cdi_dir, dev_root=dev_root) as node:
        allocs = [Alloc(device=d, request=f"gpu{i}") for i, d in enumerate(devices)]
        _, ids = node.prepare(f"exclusive-{len(devices)}", allocs, gpu_config("Exclusive"))
        assert len(ids) == len(devices)

        result = podman.run(LOOK, devices=ids).check()
        node.unprepare_all()

    assert gpu_nodes(result) == sorted(f"nvidia{node.gpus[d].minor}" for d in devices)
    assert common_nodes(result) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
    env = result.env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert sorted(v for k, v in env.items() if k.startswith("DRAGPU_DEVICE_")) == sorted(
        node.gpus[d].uuid for d in devices
    )
    _assert_no_limiter_or_mps(result)


def test_a_container_using_one_request_of_a_claim_sees_only_that_requests_gpu(
    podman: Podman, limiter_build: Limiter, dev_root: Path
) -> None:
    with plugin_node(limiter_build, podman.cdi_dir, dev_root=dev_root) as node:
        allocs = [Alloc(device="gpu-0", request="train"), Alloc(device="gpu-1", request="serve")]
        _, ids = node.prepare("two-requests", allocs, gpu_config("Exclusive"))
        # The kubelet passes a container only the CDI ids of the requests it names.
        (serve,) = [i for i in ids if i.endswith("-gpu-1")]
        result = podman.run(LOOK, devices=[serve]).check()
        node.unprepare_all()
    assert gpu_nodes(result) == [f"nvidia{node.gpus['gpu-1'].minor}"]
    assert [v for k, v in result.env().items() if k.startswith("DRAGPU_DEVICE_")] == [node.gpus["gpu-1"].uuid]


def test_a_container_using_two_claims_sees_the_gpus_of_both(
    podman: Podman, limiter_build: Limiter, dev_root: Path
) -> None:
    with plugin_node(limiter_build, podman.cdi_dir, dev_root=dev_root) as node:
        _, a = node.prepare("claim-a", [Alloc(device="gpu-0")], gpu_config("Exclusive"))
        _, b = node.prepare("claim-b", [Alloc(device="gpu-1")], gpu_config("Exclusive"))
        result = podman.run(LOOK, devices=[*a, *b]).check()
        node.unprepare_all()
    assert gpu_nodes(result) == ["nvidia0", "nvidia1"]
    assert result.env()["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_time_sliced_container_is_capped_to_the_memory_it_was_charged_and_gets_nothing_of_mps(
    podman: Podman, limiter_build: Limiter, dev_root: Path, driver_stand_in: list[Volume]
) -> None:
    """Time-sliced and limiter claims share GPUs: uncapped, a time-sliced tenant could take them all."""
    memory = "8Gi"
    with plugin_node(limiter_build, podman.cdi_dir, dev_root=dev_root) as node:
        allocs = [Alloc(device="gpu-0", share_id=SHARE_ID + "01", consumed={"memory": memory, "cores": "10"})]
        claim, ids = node.prepare(
            "time-sliced", allocs, gpu_config("TimeSlicing", timeSlicing={"interval": "Long"})
        )
        gpu = node.gpus["gpu-0"]
        cap = to_int(parse_quantity(memory))
        inside = container_claim_dir(claim["metadata"]["uid"])
        result = podman.run(
            LOOK + "; " + sections(limits=f"cat {inside}/limits", probe="limiter-probe info"),
            devices=ids,
            volumes=driver_stand_in,
            env={"FAKE_CUDA_MEMORY_BYTES": str(4 * cap), "CUDA_VISIBLE_DEVICES": gpu.uuid},
        ).check()
        node.unprepare_all()

    assert gpu_nodes(result) == [f"nvidia{gpu.minor}"]
    env = result.env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not any(k.startswith(ENFORCEMENT_ENV) for k in env)
    assert CONTAINER_PIPE_DIR not in _mount_points(result)
    # A memory budget of what the scheduler charged, no compute cap; every process loads the library.
    assert result.section("limits")[-1] == f"device={gpu.uuid} memory={cap} cores=100"
    assert result.section("probe") == [f"total={cap} free={cap - CONTEXT_CHARGE}", f"device_total={cap}"]


def test_mps_client_gets_the_pipe_directory_and_limits_from_the_claims_capacity(
    node: Node, podman: Podman
) -> None:
    memory, cores = "10Gi", "30"
    allocs = [Alloc(device="gpu-0", share_id=SHARE_ID + "02", consumed={"memory": memory, "cores": cores})]
    claim, ids = node.prepare("mps", allocs, gpu_config("MPS"))
    uid = claim["metadata"]["uid"]
    gpu = node.gpus["gpu-0"]
    host_pipe = mps_dir(node.dirs.state_dir, gpu.uuid) / "pipe"
    token = f"client-{uuid.uuid4().hex}"
    (host_pipe / "from-host").write_text(token + "\n")

    result = podman.run(
        LOOK
        + "; "
        + sections(
            seen=f"cat {CONTAINER_PIPE_DIR}/from-host",
            wrote=f"echo {token} > {CONTAINER_PIPE_DIR}/{token} 2>&1 || echo refused",
            shm=f"echo {token} > /dev/shm/{token} && echo ok",
            limits=f"cat {container_claim_dir(uid)}/limits",
        ),
        devices=ids,
    ).check()

    env = result.env()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(to_int(parse_quantity(cores)))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={to_int(parse_quantity(memory)) // MIB}M"
    # The control daemon's pipe directory: readable (that is how a client reaches the daemon), but
    # no client may add or remove anything in it.
    assert "ro" in mount_options(result.section("mounts"), CONTAINER_PIPE_DIR)
    assert result.section("seen") == [token]
    assert result.section("wrote")[-1] == "refused" and not (host_pipe / token).exists()
    # Client and server exchange data through POSIX shared memory: the client's /dev/shm is the
    # GPU's shm directory, which the control daemon gets as its own /dev/shm.
    assert result.section("shm") == ["ok"]
    assert (host_pipe.parent / "shm" / token).read_text().strip() == token
    # The claim's memory is one budget for all of its processes: the limiter pools it.
    assert f"device={gpu.uuid} memory={to_int(parse_quantity(memory))} cores=100" in result.section("limits")


def test_limiter_is_mounted_read_only_preloaded_and_limited_to_the_claims_capacity(
    node: Node, podman: Podman, limiter_build: Limiter, driver_stand_in: list[Volume]
) -> None:
    memory, cores = "6Gi", "25"
    allocs = [Alloc(device="gpu-1", share_id=SHARE_ID + "03", consumed={"memory": memory, "cores": cores})]
    claim, ids = node.prepare("limiter", allocs, gpu_config("Limiter"))
    gpu = node.gpus["gpu-1"]
    cap = to_int(parse_quantity(memory))
    token = f"pod-{uuid.uuid4().hex}"
    inside = container_claim_dir(claim["metadata"]["uid"])
    state_dir = f"{inside}/limiter"

    result = podman.run(
        LOOK
        + "; "
        + sections(
            library=f"sha256sum {CONTAINER_LIBRARY}",
            write_library=f"touch {CONTAINER_LIBRARY} 2>&1 && echo writable",
            write_state=f"echo {token} > {state_dir}/{token} 2>/dev/null && echo ok || echo refused",
            limits=f"cat {inside}/limits",
            preload=f"cat {CONTAINER_PRELOAD}",
            probe="limiter-probe info",
        ),
        devices=ids,
        volumes=driver_stand_in,
        # The fake driver cannot see device nodes: it shows the GPUs this names, as the nodes would.
        env={"FAKE_CUDA_MEMORY_BYTES": str(4 * cap), "CUDA_VISIBLE_DEVICES": gpu.uuid},
    ).check()

    env = result.env()
    # Loaded by /etc/ld.so.preload, limited by the claim's limits file: no environment of its own.
    assert not any(k.startswith(ENFORCEMENT_ENV) for k in env)
    assert result.section("limits") == [
        "version=1",
        f"claim=default/{claim['metadata']['name']}",
        f"state={state_dir}",
        f"device={gpu.uuid} memory={cap} cores={to_int(parse_quantity(cores))}",
    ]
    assert result.section("preload") == [CONTAINER_LIBRARY]
    assert "ro" in mount_options(result.section("mounts"), f"{inside}/limits")
    assert not any(k.startswith("CUDA_MPS_") for k in env)

    # The node's library, read-only.
    digest = hashlib.sha256(limiter_build.library.read_bytes()).hexdigest()
    assert result.section("library") == [f"{digest}  {CONTAINER_LIBRARY}"]
    assert "ro" in mount_options(result.section("mounts"), CONTAINER_LIBRARY)
    assert "Read-only file system" in "\n".join(result.section("write_library"))
    # The claim's state directory is read-only (no tenant can delete or replace the accounting region);
    # the region the agent made in it is the one writable file, the same for every pod of the claim.
    assert "ro" in mount_options(result.section("mounts"), state_dir)
    assert "rw" in mount_options(result.section("mounts"), f"{state_dir}/{REGION_FILE}")
    assert result.section("write_state") == ["refused"]
    assert not (node.claim_dir(claim) / "limiter" / token).exists()
    # Preloaded for real: a CUDA program sees the claim's memory, not the GPU's.
    # (less its own CUDA context, which the claim is charged)
    assert result.section("probe") == [f"total={cap} free={usable(cap)}", f"device_total={cap}"]
