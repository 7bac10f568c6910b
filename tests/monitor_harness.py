"""Helpers for the usage monitor's tests: pods in the API fake, fake /proc entries, a plugin with NVML.

A GPU process is known to the monitor by its host pid: through fake NVML (which lists it with its
memory) and through `<proc_root>/<pid>/cgroup` and `maps` (which name its pod and container and say
whether the limiter is loaded). The pids may be real child processes, so the watchdog's kill is real.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fakes import fake_pynvml
from plugin_harness import NODE, PROFILE, Alloc, Kubelet, PluginDirs, add_claim

from dra_gpu.config import NodeSharing
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.limits import CONTAINER_LIBRARY
from dra_gpu.monitor import Monitor, PodDirectory, ProcReader, Watchdog
from dra_gpu.node_agent import NodeAgent
from dra_gpu.plugin.checkpoint import CheckpointStore
from dra_gpu.plugin.holdings import prepared_holdings

GiB = 2**30


def gpu_share(
    api: FakeKube, name: str, memory: str, configs: list[dict[str, Any]], n: int = 1
) -> dict[str, Any]:
    """A claim for share `n` of gpu-0 with `memory` and half its cores, configured by `configs`."""
    return add_claim(
        api,
        name,
        [
            Alloc(
                device="gpu-0",
                share_id=f"00000000-0000-4000-8000-00000000000{n}",
                consumed={"memory": memory, "cores": "50"},
            )
        ],
        configs,
    )


def sleeper(ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A real child process that sleeps, started and ready (a pid the watchdog can signal); with
    `ignore_term` it ignores SIGTERM, so that only SIGKILL ends it."""
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(300)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


@contextlib.contextmanager
def reaped(*children: subprocess.Popen[bytes]) -> Iterator[None]:
    """Kills and waits for `children` when the block ends, however it ends."""
    try:
        yield
    finally:
        for child in children:
            child.kill()
            child.wait()


def add_pod(api: FakeKube, name: str, claims: list[str], namespace: str = "default") -> tuple[str, str]:
    """A running pod on this node using `claims`; returns (pod uid, container id)."""
    container_id = secrets.token_hex(32)
    pod = api.create(
        "Pod",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {"name": "main", "image": "app", "resources": {"claims": [{"name": c} for c in claims]}}
                ],
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            },
        },
    )
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "main", "containerID": f"containerd://{container_id}"}],
    }
    api.update_status("Pod", pod)
    return pod["metadata"]["uid"], container_id


_library: list[Path] = []
"""The limiter library of the agent `plugin_with_nvml` runs (the one whose device and inode `maps` names)."""


def library_line(library: Path, path: str = CONTAINER_LIBRARY) -> str:
    """A `maps` line for an executable mapping of `library` (its device and inode), named `path`."""
    st = library.stat()
    return f"7f0000002000-7f0000003000 r-xp 00000000 {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino} {path}"


def fake_proc(
    proc_root: Path, pid: int, pod_uid: str, container_id: str, *, limiter: bool, systemd: bool = True
) -> None:
    """`/proc/<pid>/cgroup` as the kubelet's cgroup driver names it, and `maps` with or without the limiter
    (the agent's library file, by device and inode, as the container's bind mount shows it)."""
    d = proc_root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    if systemd:
        path = (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
            f"cri-containerd-{container_id}.scope"
        )
    else:
        path = f"/kubepods/burstable/pod{pod_uid}/{container_id}"
    (d / "cgroup").write_text(f"0::{path}\n")
    lines = ["7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6"]
    if limiter:
        lines.append(library_line(_library[-1]))
    (d / "maps").write_text("\n".join(lines) + "\n")
    # `stat` as the kernel writes it: a real child's own (its start time is what the watchdog checks).
    real = Path(f"/proc/{pid}/stat")
    try:
        (d / "stat").write_bytes(real.read_bytes())
    except OSError:
        (d / "stat").write_text(f"{pid} (app) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 13 + "1000 0\n")


def bare_monitor(state: Path) -> Monitor:
    """A monitor with nothing prepared, no NVML, no GPUs and no pods, its checkpoint and /proc under `state`:
    for the tests that hand it figures of their own."""
    proc = ProcReader(state)
    return Monitor(
        prepared_holdings(CheckpointStore(state / "checkpoint.json").load),
        state,
        lambda: [],
        PodDirectory(FakeKube(), "node"),
        Watchdog(FakeKube(), "node", proc),
        proc=proc,
    )


def fake_driver(inventory: SimulatedInventory) -> fake_pynvml.FakeDriver:
    """NVML's view of the simulated GPUs: the same UUIDs."""
    return fake_pynvml.FakeDriver(gpus=[fake_pynvml.FakeGpu(uuid=g.uuid) for g in inventory.gpus()])


@contextlib.contextmanager
def plugin_with_nvml(
    dirs: PluginDirs,
    api: FakeKube,
    proc_root: Path,
    interval_s: float = 3600.0,
    publish_slices: bool = False,
    watch_interval_s: float | None = None,
) -> Iterator[tuple[NodeAgent, fake_pynvml.FakeDriver]]:
    """The agent with fake NVML; memory is watched every `watch_interval_s` (default: only with each sample,
    so that a test drives the watches itself)."""
    inventory = SimulatedInventory(PROFILE, seed=NODE)
    driver = fake_driver(inventory)
    fake_pynvml.install(driver)
    plugin = NodeAgent(
        dirs.config(
            http_address="127.0.0.1:0",
            monitor_interval_s=interval_s,
            monitor_watch_interval_s=interval_s if watch_interval_s is None else watch_interval_s,
            proc_root=proc_root,
        ),
        api,
        inventory,
        sharing=NodeSharing.parse("*=Shared"),
        nvml=fake_pynvml,
        publish_slices=publish_slices,
    )
    plugin.start()
    _library.append(dirs.limiter_library)
    try:
        yield plugin, driver
    finally:
        _library.pop()
        plugin.stop(grace_s=0.5)
        fake_pynvml.install(None)


@contextlib.contextmanager
def prepared_agent(
    dirs: PluginDirs, api: FakeKube, proc_root: Path, *claims: dict[str, Any], **options: Any
) -> Iterator[tuple[NodeAgent, fake_pynvml.FakeDriver, Kubelet]]:
    """`plugin_with_nvml` (with `options`) registered with a kubelet that has prepared `claims`, each
    without an error; the kubelet closes when the block ends."""
    with plugin_with_nvml(dirs, api, proc_root, **options) as (plugin, driver):
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        prepared = kubelet.prepare(*claims)
        assert len(prepared) == len(claims) and not any(r.error for r in prepared.values()), prepared
        yield plugin, driver, kubelet
        kubelet.close()
