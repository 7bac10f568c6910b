"""The memory-limit hook runs on the host, so a node agent in its own container only offers driver
memory limits when the host has the hook's executable (seen under the driver root): otherwise a 615
node publishes `limiter`, says what to set, and never writes a spec naming a missing hook."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from fakes import fake_pynvml
from plugin_harness import CLI, Kubelet, PluginDirs, env_for, gpu_config, unreachable_kubeconfig

from dra_gpu.cli import main
from dra_gpu.config import NodeSharing, parse_gpu_config
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import GpuInfo, NvmlInventory
from dra_gpu.inventory.capabilities import CgroupLayout, LimitHook, find_limit_hook
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin import sharing
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.plan import ClaimInfo, NodeContext, Plan, Share
from dra_gpu.slices import SlicePublisher

GIB = 2**30
HOST_HOOK = "/usr/local/bin/dra-gpu"
V2_DMEM = CgroupLayout(v2=True, dmem=True)
HOST = Path("/")
"""What the DaemonSet passes as the driver root's host path: the host's own root."""


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """The host's root as a containerized agent sees it (its driver root)."""
    root = tmp_path / "driver-root"
    (root / "usr/local/bin").mkdir(parents=True)
    return root


def install(root: Path, path: str, mode: int = 0o755) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("#!/bin/sh\n")
    target.chmod(mode)


@pytest.fixture
def nvml_615() -> Iterator[None]:
    fake_pynvml.install(
        fake_pynvml.FakeDriver(
            gpus=[fake_pynvml.FakeGpu(uuid="GPU-0a000000-0000-4000-8000-000000000615")],
            driver_version="615.71.09",
        )
    )
    yield
    fake_pynvml.install(None)


def published(hook: LimitHook) -> tuple[GpuInfo, dict[str, Any]]:
    inventory = NvmlInventory(fake_pynvml, cgroup_layout=V2_DMEM, hook_problem=hook.problem)
    try:
        (gpu,) = inventory.gpus()
        api = FakeKube()
        api.create("Node", {"metadata": {"name": "n"}})
        (slice_,) = SlicePublisher(api, "n", inventory, NodeSharing.parse("*=Shared")).sync()
    finally:
        inventory.close()
    (device,) = slice_["spec"]["devices"]
    return gpu, device["attributes"]


def prepare(gpu: GpuInfo, node: NodeContext) -> Plan:
    share = Share(
        position=0,
        request="gpu",
        pool="n",
        device="gpu-0",
        gpu=gpu,
        share_id="00000000-0000-4000-8000-000000000001",
        consumed={"memory": Fraction(2 * GIB), "cores": Fraction(10)},
        admin_access=False,
        config=parse_gpu_config(gpu_config("Limiter", limiter={"memoryLimit": "4Gi"})),
    )
    plan = Plan(claim=ClaimInfo("uid-1", "default", "c"), shares=[share], driver="gpu.dra-gpu.io")
    for backend in sharing.backends():
        backend.contribute(plan, node)
    return plan


def node_on(tmp_path: Path, root: Path, hook: LimitHook | None) -> NodeContext:
    library = tmp_path / "lib.so"
    library.write_text("")
    return NodeContext(
        "gpu.dra-gpu.io",
        tmp_path / "state",
        library,
        tmp_path,
        SimulatedCommands(),
        driver_root=root,
        driver_root_host_path=HOST,
        limit_hook=hook,
    )


def test_without_the_hook_on_the_host_a_615_node_publishes_limiter_and_names_the_fix(
    host: Path, nvml_615: None
) -> None:
    hook = find_limit_hook(host, HOST, env={})
    gpu, attributes = published(hook)
    assert attributes["memoryIsolation"] == {"string": "limiter"}
    assert attributes["mpsNamespaces"] == {"bool": True}  # MPS v3 does not need the hook
    assert gpu.isolation_reason.startswith(
        "driver memory limits need the dra-gpu executable on the host: set DRA_GPU_CDI_HOOK_PATH to its path"
    )


@pytest.mark.parametrize("mode", [None, 0o644])
def test_a_configured_hook_missing_or_not_executable_on_the_host_keeps_the_limiter(
    host: Path, nvml_615: None, mode: int | None
) -> None:
    if mode is not None:
        install(host, HOST_HOOK, mode)
    hook = find_limit_hook(host, HOST, env={"DRA_GPU_CDI_HOOK_PATH": HOST_HOOK})
    gpu, attributes = published(hook)
    assert attributes["memoryIsolation"] == {"string": "limiter"}
    assert gpu.isolation_reason == (
        f"driver memory limits need the dra-gpu executable on the host: DRA_GPU_CDI_HOOK_PATH={HOST_HOOK} "
        f"is not an executable file on the host (looked at {host / HOST_HOOK.lstrip('/')})"
    )


def test_with_the_hook_on_the_host_driver_limits_are_chosen_and_the_spec_names_its_host_path(
    host: Path, tmp_path: Path, nvml_615: None
) -> None:
    install(host, HOST_HOOK)
    hook = find_limit_hook(host, HOST, env={"DRA_GPU_CDI_HOOK_PATH": HOST_HOOK})
    assert hook == LimitHook("dra-gpu", HOST_HOOK)
    gpu, attributes = published(hook)
    assert attributes["memoryIsolation"] == {"string": "driver"}
    hooks = prepare(gpu, node_on(tmp_path, host, hook)).cdi_spec().devices[0].container_edits.hooks or []
    assert [(h.hook_name, h.path) for h in hooks] == [("createRuntime", HOST_HOOK), ("poststop", HOST_HOOK)]


def test_a_relative_hook_path_is_refused_with_what_to_set(host: Path) -> None:
    hook = find_limit_hook(host, HOST, env={"DRA_GPU_CDI_HOOK_PATH": "bin/dra-gpu"})
    assert hook.problem.endswith("set DRA_GPU_CDI_HOOK_PATH to an absolute path (it is 'bin/dra-gpu')")


def test_the_toolkit_hook_is_looked_for_on_the_host_too(host: Path, tmp_path: Path, nvml_615: None) -> None:
    toolkit = {"DRA_GPU_MEMORY_LIMIT_HOOK": "toolkit"}
    missing = find_limit_hook(host, HOST, env=toolkit)
    assert missing.problem.startswith(
        "driver memory limits need the nvidia-cdi-hook executable on the host: set DRA_GPU_NVIDIA_CDI_HOOK"
    )
    install(host, "/usr/bin/nvidia-cdi-hook")
    hook = find_limit_hook(host, HOST, env={**toolkit, "DRA_GPU_NVIDIA_CDI_HOOK": "/usr/bin/nvidia-cdi-hook"})
    assert hook == LimitHook("toolkit", "/usr/bin/nvidia-cdi-hook")
    gpu, _ = published(hook)
    hooks = prepare(gpu, node_on(tmp_path, host, hook)).cdi_spec().devices[0].container_edits.hooks or []
    assert [(h.path, h.args) for h in hooks] == [
        ("/usr/bin/nvidia-cdi-hook", ["nvidia-cdi-hook", "apply-cuda-memory-limits"])
    ]


def test_a_hook_outside_a_containerized_drivers_root_cannot_be_checked(tmp_path: Path) -> None:
    root = tmp_path / "driver-root"
    root.mkdir()
    hook = find_limit_hook(root, Path("/run/nvidia/driver"), env={"DRA_GPU_CDI_HOOK_PATH": HOST_HOOK})
    assert "lies outside the driver root /run/nvidia/driver" in hook.problem
    install(root, "/usr/local/bin/dra-gpu")
    inside = find_limit_hook(
        root,
        Path("/run/nvidia/driver"),
        env={"DRA_GPU_CDI_HOOK_PATH": "/run/nvidia/driver/usr/local/bin/dra-gpu"},
    )
    assert inside == LimitHook("dra-gpu", "/run/nvidia/driver/usr/local/bin/dra-gpu")


def test_prepare_never_writes_a_spec_naming_a_missing_hook(
    host: Path, tmp_path: Path, nvml_615: None
) -> None:
    """Even for a GPU that claims driver isolation (an inventory from before the hook went away)."""
    gpu, _ = published(LimitHook("dra-gpu", HOST_HOOK))
    node = node_on(tmp_path, host, find_limit_hook(host, HOST, env={}))
    with pytest.raises(PrepareError, match="set DRA_GPU_CDI_HOOK_PATH"):
        prepare(gpu, node)


def test_gpus_shows_the_reason(
    host: Path,
    tmp_path: Path,
    nvml_615: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpu memory dmem\n")
    monkeypatch.setenv("DRA_GPU_CGROUP_ROOT", str(cgroup))
    monkeypatch.delenv("DRA_GPU_CDI_HOOK_PATH", raising=False)
    monkeypatch.delenv("DRA_GPU_MEMORY_LIMIT_HOOK", raising=False)
    args = ["gpus", "-o", "json", "--driver-root", str(host), "--driver-root-host-path", "/"]
    assert main(args) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["memoryIsolation"] == "limiter"
    assert "set DRA_GPU_CDI_HOOK_PATH" in shown["isolationReason"]
    install(host, HOST_HOOK)
    monkeypatch.setenv("DRA_GPU_CDI_HOOK_PATH", HOST_HOOK)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)[0]["memoryIsolation"] == "driver"


def test_the_kubelet_plugin_decides_at_start_and_logs_why(
    dirs: PluginDirs, host: Path, tmp_path: Path
) -> None:
    env = env_for(
        dirs,
        unreachable_kubeconfig(tmp_path / "kubeconfig"),
        DRA_GPU_DRIVER_ROOT=str(host),
        DRA_GPU_DRIVER_ROOT_HOST_PATH="/",
    )
    env["DRA_GPU_GPU_BACKEND"] = "simulated:1xH100-80GB,driver=615.71.09"
    process = subprocess.Popen(CLI, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kubelet = Kubelet(dirs.registration_dir, timeout_s=30)
        kubelet.register(wait_s=30)
        kubelet.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    (line,) = [json.loads(x) for x in stderr.splitlines() if '"GPU memory isolation"' in x]
    assert line["memory_isolation"] == "limiter"
    assert line["reason"].startswith("driver memory limits need the dra-gpu executable on the host: set ")
