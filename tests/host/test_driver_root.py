"""The driver's files under the node's driver root: which ones, NVML loaded from there, and what a
claim gets when the toolkit's spec is broken."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_harness import (
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    cdi_ids,
    gpu_config,
    opaque,
    resolve,
    running_plugin,
    uid_of,
)

from dra_gpu.host.driver_root import LIBRARIES, find_driver_files, install_ldcache_hook, tool_env, tool_path
from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.inventory.simulated import SIMULATED_DRIVER_VERSION
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.prepare import NOTICE_REASON
from dra_gpu.plugin.sharing.steps.device_access import DRIVER_LIB_DIR, LDCONFIG_ENTRY

LIBS = "usr/lib/x86_64-linux-gnu"


V = SIMULATED_DRIVER_VERSION
"""The driver version NVML reports on the tests' (simulated) node: the driver root holds this one."""


def driver_root(root: Path, version: str = V) -> Path:
    libs = root / LIBS
    libs.mkdir(parents=True)
    for stem in LIBRARIES:
        (libs / f"{stem}.{version}").write_bytes(b"\x7fELF stand-in\n")
        (libs / f"{stem}.1").symlink_to(f"{stem}.{version}")
    # Leftovers of other drivers beside it, an older and a newer one (a downgrade's): never chosen.
    (libs / "libcuda.so.535.1").write_bytes(b"\x7fELF an older driver's leftover\n")
    (libs / "libnvidia-ml.so.999.1.1").write_bytes(b"\x7fELF a newer driver's leftover\n")
    (root / "usr" / "bin").mkdir(parents=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (root / "usr" / "bin" / tool).write_text("#!/bin/sh\n")
        (root / "usr" / "bin" / tool).chmod(0o755)
    return root


def test_each_library_of_exactly_the_reported_driver_and_the_tools_are_found(tmp_path: Path) -> None:
    files = find_driver_files(driver_root(tmp_path), V)
    assert [str(p) for p in files.libraries] == [f"{LIBS}/{stem}.{V}" for stem in LIBRARIES]
    assert {"libnvidia-gpucomp.so", "libnvidia-nvvm.so", "libcudadebugger.so"} <= set(LIBRARIES)
    assert files.missing_libraries() == []
    other = find_driver_files(tmp_path, "535.1")
    assert [str(p) for p in other.libraries] == [f"{LIBS}/libcuda.so.535.1"]
    assert other.missing_libraries() == ["libnvidia-ml.so"]
    assert [str(p) for p in files.executables] == ["usr/bin/nvidia-smi", "usr/bin/nvidia-cuda-mps-control"]
    assert find_driver_files(tmp_path / "empty").libraries == ()


def test_the_agents_tools_find_only_the_driver_libraries(tmp_path: Path) -> None:
    root = driver_root(tmp_path / "root")
    env = tool_env(root, tmp_path / "links", V)
    assert env["LD_LIBRARY_PATH"] == str(tmp_path / "links")
    assert sorted(p.name for p in (tmp_path / "links").iterdir()) == sorted(f"{stem}.1" for stem in LIBRARIES)
    assert os.readlink(tmp_path / "links" / "libnvidia-ml.so.1") == str(root / LIBS / f"libnvidia-ml.so.{V}")
    assert tool_env(Path("/"), tmp_path / "unused") == {}


FAKE_CONTROL = """#!/bin/sh
# As nvidia-cuda-mps-control does: `-d` leaves a daemon, which starts nvidia-cuda-mps-server by name.
dir="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
  nvidia-cuda-mps-server || { echo "cannot start nvidia-cuda-mps-server" >&2; exit 1; }
  touch "$dir/control"; exit 0
fi
[ -e "$dir/control" ] || exit 1
case "$(cat)" in *quit*) rm "$dir/control" ;; *) cat "$dir/server" ;; esac
"""
FAKE_SERVER = """#!/bin/sh
echo "$(command -v nvidia-cuda-mps-server) $LD_LIBRARY_PATH" > "$CUDA_MPS_PIPE_DIRECTORY/server"
"""


def test_the_mps_daemon_from_a_driver_root_starts_its_server(tmp_path: Path) -> None:
    """Under a driver root that is not /, as deployed: the daemon finds the root's server and libraries."""
    root = driver_root(tmp_path / "root")
    for name, text in (("nvidia-cuda-mps-control", FAKE_CONTROL), ("nvidia-cuda-mps-server", FAKE_SERVER)):
        (root / "usr" / "bin" / name).write_text(text)
        (root / "usr" / "bin" / name).chmod(0o755)
    assert shutil.which("nvidia-cuda-mps-server") is None, "this machine has no MPS server of its own"
    links = tmp_path / "links"
    commands = NvidiaCommands(
        nvidia_smi=tool_path(root, "nvidia-smi"),
        mps_control=tool_path(root, "nvidia-cuda-mps-control"),
        tool_env=tool_env(root, links, V),
        timeout_s=10,
    )
    pipe, log = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    log.mkdir()
    commands.start_mps_daemon("GPU-0", pipe, log)
    server, library_path = (pipe / "server").read_text().split()
    assert server == str(root / "usr" / "bin" / "nvidia-cuda-mps-server")
    assert library_path == str(links)
    # MPS v3's commands go through the same interface, with the same program and environment.
    assert commands.run_mps_control(pipe, log, ["server", "list"], protocol="3").split()[0] == server
    commands.stop_mps_daemon("GPU-0", pipe)
    assert not commands.mps_daemon_running("GPU-0", pipe)


def test_nvml_is_loaded_from_the_driver_root(tmp_path: Path, built: Path) -> None:
    root = tmp_path / "root"
    (root / LIBS).mkdir(parents=True)
    shutil.copy(built / "fake" / "libnvidia-ml.so.1", root / LIBS / "libnvidia-ml.so.550.54.15")
    script = (
        "import sys, pynvml\n"
        "from pathlib import Path\n"
        "from dra_gpu.host.driver_root import load_nvml\n"
        "print(load_nvml(Path(sys.argv[1])))\n"
        "pynvml.nvmlInit()\n"
        "print(pynvml.nvmlDeviceGetCount())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded, count = done.stdout.split()
    assert loaded == str(root / LIBS / "libnvidia-ml.so.550.54.15")
    assert int(count) >= 1


def test_a_claim_without_the_toolkit_gets_the_driver_files_and_the_loader_hook(tmp_path: Path) -> None:
    dirs = PluginDirs.create()
    api = FakeKube()
    root = driver_root(tmp_path / "root")
    claim = add_claim(api, "whole", [Alloc(device="gpu-0")], [opaque(gpu_config("Exclusive"))])
    try:
        with running_plugin(dirs, api, driver_root=root, driver_root_host_path=Path("/host")) as plugin:
            kubelet = Kubelet(dirs.registration_dir)
            kubelet.register()
            container = resolve(dirs, cdi_ids(kubelet.prepare(claim)[uid_of(claim)]))
            mounts = {m.container_path: m.host_path for m in container.mounts}
            for stem in LIBRARIES:
                assert mounts[f"{DRIVER_LIB_DIR}/{stem}.{V}"] == f"/host/{LIBS}/{stem}.{V}"
            assert not any("535.1" in path or "999.1.1" in path for path in mounts), "no leftover"
            assert mounts["/usr/bin/nvidia-smi"] == "/host/usr/bin/nvidia-smi"
            assert Path(mounts[LDCONFIG_ENTRY]).read_text() == DRIVER_LIB_DIR + "\n"
            (hook,) = container.hooks
            assert (hook.hook_name, hook.path, hook.args) == (
                "createContainer",
                str(plugin.plugin.node.ldcache_hook),
                ["update-ldcache", DRIVER_LIB_DIR],
            )
            assert "LD_LIBRARY_PATH" not in container.env
            kubelet.close()
    finally:
        dirs.cleanup()


def test_the_hook_script_is_installed_once_and_executable(tmp_path: Path) -> None:
    hook = install_ldcache_hook(tmp_path / "bin")
    assert os.access(hook, os.X_OK) and hook.read_text().startswith("#!/bin/sh\n")
    mtime = hook.stat().st_mtime_ns
    assert install_ldcache_hook(tmp_path / "bin") == hook and hook.stat().st_mtime_ns == mtime


def test_a_broken_toolkit_spec_is_reported_and_the_claim_served_from_the_driver_root(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet, caplog: pytest.LogCaptureFixture
) -> None:
    dirs.make_device_nodes()
    (dirs.ctk_dir / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: 0}]\nbogus: 1\n"
    )
    claim = add_claim(api, "whole", [Alloc(device="gpu-0")])
    with running_plugin(dirs, api):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        assert cdi_ids(response) == [f"gpu.dra-gpu.io/claim={uid_of(claim)}-gpu-0"], "no toolkit device"
        container = resolve(dirs, [cdi_ids(response)[0]])
        assert "/dev/nvidia0" in [n.path for n in container.device_nodes]
    assert any(r.levelname == "ERROR" and "does not parse" in r.getMessage() for r in caplog.records), (
        "the broken file is logged"
    )
    events = [e for e in api.objects("Event") if e["involvedObject"]["uid"] == uid_of(claim)]
    assert [e["reason"] for e in events] == [NOTICE_REASON]
    assert "nvidia.yaml does not parse" in events[0]["message"]
    assert events[0]["type"] == "Warning"
    assert json.dumps(events[0]).count("driver root") == 1
