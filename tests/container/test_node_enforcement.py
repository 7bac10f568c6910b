"""The node holds claims to their shares in real container cgroups, whatever their processes do.

Three containers run under podman, each in a cgroup named as the kubelet names a pod's (`--cgroup-parent
/kubepods/pod<uid>`), each its own claim's: one spins on the GPU without the limiter under a 10 % ceiling
(low, so that even a spinner a loaded machine slows is over it), one holds 2 GiB under a 1 GiB cap, one
runs under the limiter within both. The agent's monitor watches them
from the host's view (host PIDs, `/proc/<pid>/cgroup`, the freezer of each container's cgroup) with the
fake NVML saying what each process holds and runs. The spinner is frozen back towards its share, the
process over its cap is killed, the honest neighbour is never touched.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from container_node import CONTAINER_LIBCUDA, CONTAINER_LIBNVML, CONTAINER_PROBE, Limiter
from container_support import Podman, Volume
from fakes import fake_pynvml
from waiting import wait_for

from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.monitor import Monitor, NvmlSampler, PodDirectory
from dra_gpu.monitor.monitor import ClaimHoldings, Held
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.watchdog import ClaimRef, Watchdog

pytestmark = pytest.mark.container

GIB = 2**30
UUID = "GPU-4a5c1e2d-7b3f-4e11-9a60-0000000000e1"
CGROUP = Path("/sys/fs/cgroup")
CONTAINER_LIBRARY = "/usr/local/lib/dra-gpu/libdragpu-limiter.so.1"
SCRIPTS = {
    "bypass": "echo ready; while :; do :; done",
    "hog": "echo ready; exec sleep 300",
    "honest": f"echo ready; exec {CONTAINER_PROBE} alloc 1048576 1 --hold",
}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


@contextlib.contextmanager
def _container(
    podman: Podman, script: str, name: str, pod_uid: str, volumes: list[Volume], env: dict[str, str]
) -> Iterator[str]:
    """A container in the cgroup the kubelet would give pod `pod_uid`; yields its ID once it runs."""
    argv = podman.argv(script, volumes=volumes, env=env, name=name)
    at = argv.index("run") + 1
    argv[at:at] = ["-d", "--cgroup-parent", f"/kubepods/pod{pod_uid}"]
    try:
        cid = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        yield cid
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, check=False, timeout=60)
        # The pod's cgroup podman made as the parent, with conmon's in it: gone once conmon has exited.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: _remove_pod_cgroups(pod_uid), timeout_s=10, what="the pod's cgroups removed")


def _remove_pod_cgroups(pod_uid: str) -> bool:
    left = False
    for controller in CGROUP.iterdir():
        pod = controller / "kubepods" / f"pod{pod_uid}"
        for leftover in (pod / "conmon", pod):
            try:
                leftover.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left = True
    return not left


def _host_pid(name: str) -> int:
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_the_node_freezes_a_bypassing_container_kills_one_over_its_cap_and_never_touches_an_honest_one(
    podman: Podman, limiter_build: Limiter, tmp_path: Path
) -> None:
    api = FakeKube()
    driver = fake_pynvml.FakeDriver(gpus=[fake_pynvml.FakeGpu(uuid=UUID)])
    fake_pynvml.install(driver)
    caps = {"bypass": (4 * GIB, 10), "hog": (GIB, 100), "honest": (GIB, 30)}
    holdings = []
    for n, (name, (memory, cores)) in enumerate(caps.items()):
        ref = ClaimRef(f"00000000-0000-4000-8000-0000000000e{n}", "tenants", name)
        holdings.append(ClaimHoldings(ref, (Held(ref, UUID, "Limiter", memory, cores, None),)))
    volumes = [
        *limiter_build.driver_stand_in(),
        Volume(limiter_build.library, CONTAINER_LIBRARY),
    ]
    assert {v.container for v in volumes} >= {CONTAINER_LIBCUDA, CONTAINER_LIBNVML, CONTAINER_PROBE}
    monitor = Monitor(
        prepared=lambda: holdings,
        claims_dir=tmp_path / "claims",
        gpus=lambda: [UUID],
        pods=PodDirectory(api, "node"),
        watchdog=Watchdog(api, "node", ProcReader()),
        sampler=NvmlSampler(fake_pynvml),
        interval_s=5.0,
        watch_interval_s=0.25,
        cgroup_root=CGROUP,
        limiter_library=limiter_build.library,
    )
    pids: dict[str, int] = {}
    try:
        with contextlib.ExitStack() as containers:
            for name in caps:
                pod = api.create(
                    "Pod", builders.pod(f"{name}-pod", [name], namespace="tenants", node_name="node")
                )
                env = {"LD_PRELOAD": CONTAINER_LIBRARY} if name == "honest" else {}
                uid = objects.uid(pod)
                cid = containers.enter_context(
                    _container(podman, SCRIPTS[name], f"dgt-{name}-{uid[:8]}", uid, volumes, env)
                )
                api.update_status("Pod", builders.with_container_ids(pod, {"main": f"containerd://{cid}"}))
                pids[name] = _host_pid(cid)
            wait_for(
                lambda: CONTAINER_LIBRARY in Path(f"/proc/{pids['honest']}/maps").read_text(),
                what="the honest process running under the limiter",
            )
            gpu = driver.gpus[0]
            gpu.processes.update({pids["bypass"]: GIB, pids["hog"]: 2 * GIB, pids["honest"]: GIB // 2})
            for name in ("bypass", "honest"):
                gpu.runs_on_cpu[pids[name]] = (round(_cpu_s(pids[name]) * 100), time.monotonic_ns() // 1000)
            monitor.start()
            wait_for(
                lambda: not Path(f"/proc/{pids['hog']}").exists(), what="the process over its cap killed"
            )
            hold = monitor.hold
            wait_for(
                lambda: any(
                    a.freezes for (uid, _), a in hold.accounts.items() if uid == holdings[0].claim.uid
                ),
                what="the bypassing container frozen",
            )
            start, cpu = time.monotonic(), _cpu_s(pids["bypass"])
            wait_for(lambda: time.monotonic() - start >= 4.0, what="four seconds held", timeout_s=10)
            share = (_cpu_s(pids["bypass"]) - cpu) / (time.monotonic() - start)
            assert share < 0.6, f"held back towards its 10 % ceiling (it ran {share:.0%} of a core)"
            assert Path(f"/proc/{pids['bypass']}").exists(), "held, never killed"
            honest_uid = holdings[2].claim.uid
            assert all(a.freezes == 0 for (uid, _), a in hold.accounts.items() if uid == honest_uid)
            assert Path(f"/proc/{pids['honest']}").exists(), "the honest neighbour runs on"
            events = [e for e in api.objects("Event") if e["involvedObject"]["name"] == "honest-pod"]
            assert not events, events
            killed = [e for e in api.objects("Event") if e["involvedObject"]["name"] == "hog-pod"]
            assert any(e["reason"] == "MemoryOverLimit" for e in killed)
    finally:
        monitor.stop()
        fake_pynvml.install(None)
