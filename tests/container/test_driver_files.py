"""Device access that stands alone, as a container receives it.

Without the NVIDIA Container Toolkit's spec, the claim's own spec brings the driver's user-space files
from the node's driver root (here a fake one: the limiter's fake libcuda and NVML under versioned
names, stand-in tools) and a hook that adds them to the container's loader cache. With the toolkit's
spec, its device is used: a faithful copy of what `nvidia-ctk cdi generate` writes (its
`NVIDIA_VISIBLE_DEVICES=void`, the common device nodes, its hooks and library mounts), with the host
paths pointed at stand-ins that exist on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from container_node import CONTAINER_PROBE, Limiter, make_device_nodes, plugin_node
from container_support import RUNTIME_CDI_DIR, Podman, Volume, mount_options, sections
from fake_driver import CONTEXT_BYTES
from plugin_harness import Alloc, gpu_config

from dra_gpu.inventory.simulated import SIMULATED_DRIVER_VERSION
from dra_gpu.plugin.sharing.steps.device_access import DRIVER_LIB_DIR, LDCONFIG_ENTRY

pytestmark = pytest.mark.container

DRIVER_VERSION = SIMULATED_DRIVER_VERSION
"""What NVML reports on the tests' node; the fake driver root also holds other drivers' leftovers."""
STALE_VERSIONS = ("535.104.05", "999.1.1")
LIB_DIR = "usr/lib/x86_64-linux-gnu"
FAKE_MEMORY = 24 << 30


def empty_library(path: Path, soname: str) -> None:
    source = path.with_name(".empty.c")
    source.write_text("int dra_gpu_stand_in;\n")
    subprocess.run(["cc", "-shared", f"-Wl,-soname,{soname}", "-o", str(path), str(source)], check=True)
    source.unlink()


def fake_driver_root(root: Path, limiter: Limiter) -> Path:
    libs = root / LIB_DIR
    libs.mkdir(parents=True)
    shutil.copy(limiter.fake_libcuda, libs / f"libcuda.so.{DRIVER_VERSION}")
    shutil.copy(
        limiter.fake_libcuda.with_name("libnvidia-ml.so.1"), libs / f"libnvidia-ml.so.{DRIVER_VERSION}"
    )
    (libs / "libcuda.so.1").symlink_to(f"libcuda.so.{DRIVER_VERSION}")  # as the driver installs it
    # Empty libraries under the sonames the driver's have (gpucomp's is its full version).
    empty_library(libs / f"libnvidia-gpucomp.so.{DRIVER_VERSION}", f"libnvidia-gpucomp.so.{DRIVER_VERSION}")
    empty_library(libs / f"libnvidia-nvvm.so.{DRIVER_VERSION}", "libnvidia-nvvm.so.4")
    for stale in STALE_VERSIONS:  # an older driver's leftovers, and a newer one's after a downgrade
        shutil.copy(limiter.fake_libcuda, libs / f"libcuda.so.{stale}")
        empty_library(libs / f"libnvidia-gpucomp.so.{stale}", f"libnvidia-gpucomp.so.{stale}")
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} stand-in\n")
        (bin_dir / tool).chmod(0o755)
    return root


def test_without_the_toolkit_spec_the_container_finds_libcuda_through_the_loader(
    podman: Podman, limiter_build: Limiter, tmp_path: Path
) -> None:
    driver_root = fake_driver_root(tmp_path / "driver-root", limiter_build)
    probe = [Volume(limiter_build.probe, CONTAINER_PROBE)]
    env = {"FAKE_CUDA_MEMORY_BYTES": str(FAKE_MEMORY)}
    with plugin_node(limiter_build, podman.cdi_dir, driver_root=driver_root) as node:
        _, ids = node.prepare("standalone", [Alloc(device="gpu-0")], gpu_config("Exclusive"))
        look = sections(
            env="env",
            conf=f"cat {LDCONFIG_ENTRY}",
            libs=f"ls {DRIVER_LIB_DIR}",
            dev=f"readlink {DRIVER_LIB_DIR}/libcuda.so",
            smi="nvidia-smi",
            mps_control="ls /usr/bin/nvidia-cuda-mps-control 2>/dev/null || echo absent",
            probe="limiter-probe info",
        )
        result = podman.run(look, devices=ids, volumes=probe, env=env).check()
        bare = podman.run("limiter-probe info", volumes=probe, env=env)
        node.unprepare_all()

    # Without the claim, nothing brings the driver: the program cannot even load.
    assert bare.returncode != 0 and "libcuda.so.1" in bare.stderr + bare.stdout
    # With it, the loader finds libcuda through its cache: no LD_LIBRARY_PATH, no legacy runtime hook.
    assert "LD_LIBRARY_PATH" not in result.env()
    assert result.section("conf") == [DRIVER_LIB_DIR]
    # Exactly the reported driver's libraries (none of the leftovers), with the loader's soname links
    # and the link a program built with -lcuda needs.
    assert sorted(result.section("libs")) == [
        "libcuda.so",
        "libcuda.so.1",
        f"libcuda.so.{DRIVER_VERSION}",
        f"libnvidia-gpucomp.so.{DRIVER_VERSION}",
        "libnvidia-ml.so.1",
        f"libnvidia-ml.so.{DRIVER_VERSION}",
        "libnvidia-nvvm.so.4",
        f"libnvidia-nvvm.so.{DRIVER_VERSION}",
    ]
    assert result.section("dev") == ["libcuda.so.1"]
    assert result.section("smi") == ["nvidia-smi stand-in"]
    # The MPS control program is the agent's: with it, a tenant could `quit` a GPU's MPS daemon.
    assert result.section("mps_control") == ["absent"]
    assert result.section("probe")[0] == f"total={FAKE_MEMORY} free={FAKE_MEMORY - CONTEXT_BYTES}"


def test_a_read_only_root_filesystem_still_finds_libcuda_under_runc(
    podman: Podman, limiter_build: Limiter, tmp_path: Path
) -> None:
    """runc makes the root read-only after the createContainer hooks, so the loader cache is written."""
    if podman.runtime != "runc":
        pytest.skip(f"runc's order of hooks and read-only remount; the runtime here is {podman.runtime}")
    driver_root = fake_driver_root(tmp_path / "driver-root", limiter_build)
    probe = [Volume(limiter_build.probe, CONTAINER_PROBE)]
    env = {"FAKE_CUDA_MEMORY_BYTES": str(FAKE_MEMORY)}
    with plugin_node(limiter_build, podman.cdi_dir, driver_root=driver_root) as node:
        _, ids = node.prepare("read-only", [Alloc(device="gpu-0")], gpu_config("Exclusive"))
        look = sections(write="touch /written 2>&1 || echo refused", probe="limiter-probe info")
        result = podman.run(look, devices=ids, volumes=probe, env=env, read_only=True).check()
        node.unprepare_all()
    assert result.section("write")[-1] == "refused", "the root filesystem is not read-only"
    assert result.section("probe")[0] == f"total={FAKE_MEMORY} free={FAKE_MEMORY - CONTEXT_BYTES}"


@pytest.fixture
def toolkit_spec(tmp_path: Path, limiter_build: Limiter) -> Iterator[tuple[Path, Path, Path]]:
    """The toolkit's spec for two GPUs, where runtimes read it; (spec, hook log, dev root)."""
    dev_root = tmp_path / "host"
    make_device_nodes(dev_root, minors=(0, 1))
    os.mknod(dev_root / "dev" / "nvidia-modeset", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    fake_driver_root(tmp_path / "driver-root", limiter_build)
    hook_log = tmp_path / "nvidia-cdi-hook.log"
    hook = tmp_path / "nvidia-cdi-hook"
    hook.write_text(f'#!/bin/sh\necho "$@" >> {hook_log}\n')
    hook.chmod(0o755)
    spec_path = RUNTIME_CDI_DIR / f"test-nvidia-{uuid.uuid4().hex[:8]}.json"
    yield spec_path, hook_log, dev_root
    spec_path.unlink(missing_ok=True)


def write_toolkit_spec(
    path: Path, gpus: dict[int, str], dev_root: Path, hook: Path, driver_root: Path
) -> None:
    """What `nvidia-ctk cdi generate --dev-root` writes, in its structure and values."""

    def node(name: str) -> dict[str, str]:
        return {"path": f"/dev/{name}", "hostPath": str(dev_root / "dev" / name)}

    libcuda = f"/{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    nvml = f"/{LIB_DIR}/libnvidia-ml.so.{DRIVER_VERSION}"
    devices = []
    for minor, gpu_uuid in gpus.items():
        for name in (str(minor), gpu_uuid):
            devices.append({"name": name, "containerEdits": {"deviceNodes": [node(f"nvidia{minor}")]}})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(f"nvidia{m}") for m in gpus]}})
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR=/{LIB_DIR}"],
            "deviceNodes": [
                node(n) for n in ("nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl")
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": str(hook),
                    "args": [
                        "nvidia-cdi-hook",
                        "create-symlinks",
                        "--link",
                        f"libcuda.so.1::/{LIB_DIR}/libcuda.so",
                    ],
                },
                {
                    "hookName": "createContainer",
                    "path": str(hook),
                    "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", f"/{LIB_DIR}"],
                },
                {
                    "hookName": "createContainer",
                    "path": str(hook),
                    "args": ["nvidia-cdi-hook", "disable-device-node-modification"],
                },
            ],
            "mounts": [
                {
                    "hostPath": str(driver_root / p.lstrip("/")),
                    "containerPath": p,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
                for p in (libcuda, nvml)
            ],
        },
    }
    path.write_text(json.dumps(spec, indent=2))


def test_with_the_toolkit_spec_the_container_gets_exactly_the_allocated_gpus(
    podman: Podman, limiter_build: Limiter, toolkit_spec: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    spec_path, hook_log, dev_root = toolkit_spec
    with plugin_node(
        limiter_build, podman.cdi_dir, nvidia_ctk_dirs=(RUNTIME_CDI_DIR,), dev_root=dev_root
    ) as node:
        gpus = {g.minor: g.uuid for g in node.gpus.values()}
        write_toolkit_spec(spec_path, gpus, dev_root, tmp_path / "nvidia-cdi-hook", tmp_path / "driver-root")
        _, ids = node.prepare("with-toolkit", [Alloc(device="gpu-1")], gpu_config("Exclusive"))
        result = podman.run(
            sections(env="env", dev="ls /dev", mounts="cat /proc/self/mountinfo"), devices=ids
        ).check()
        node.unprepare_all()

    gpu1 = node.gpus["gpu-1"]
    assert ids[1:] == [f"nvidia.com/gpu={gpu1.uuid}"]
    dev = result.section("dev")
    assert sorted(n for n in dev if n.startswith("nvidia") and n[6:].isdigit()) == [f"nvidia{gpu1.minor}"]
    assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} <= set(dev)
    env = result.env()
    # Both specs say void: the legacy runtime hook would add nothing; the device nodes are the visibility.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env["DRAGPU_DEVICE_GPU_1"] == gpu1.uuid
    # The toolkit's hooks ran and its libraries are mounted; ours brought none of its own.
    assert hook_log.read_text().splitlines() == [
        f"create-symlinks --link libcuda.so.1::/{LIB_DIR}/libcuda.so",
        f"update-ldcache --folder /{LIB_DIR}",
        "disable-device-node-modification",
    ]
    assert "ro" in mount_options(result.section("mounts"), f"/{LIB_DIR}/libcuda.so.{DRIVER_VERSION}")
    assert LDCONFIG_ENTRY not in {
        line.split()[4] for line in result.section("mounts") if len(line.split()) > 4
    }
