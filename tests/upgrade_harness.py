"""An upgrade and a rollback of the node agent on one node, as the DaemonSet does them with surge, between the
previous release (built from the repository's history) and this checkout.

Real processes throughout: both agents are `dra-gpu kubelet-plugin` (the previous one from `git archive` of
`PREVIOUS_RELEASE`, run over the same virtual environment), against one HTTP API server, on simulated GPUs; the
tenants are processes under the limiter library of the release that prepared their claim, against the fake CUDA
driver: a `limiter-probe` holding memory, and (as root, `containers_here`) processes launching kernels that see
their claim's files where a container would (its CDI mounts in a mount namespace of their own), so that the
library reads the agent's limits file, board and activity files; their compute shares are the fake driver's
busy time over a window (`shares`). The kubelet is modelled as 1.33+ is: it registers every agent's socket and
calls the newest registration whose socket is still there. A probe of the kubelet's asks the current agent every
few milliseconds, so a moment without an answer is seen.

`Upgrade.run()` does the whole of it and returns the figures of the issue's table (`Figures`);
tests/node_agent/test_upgrade.py asserts on them, bench/upgrade.py prints them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from http_api_server import ApiServer
from plugin_harness import (
    DRIVER,
    EVERY_MODE_PROFILE,
    NODE,
    AgentProcess,
    Alloc,
    PluginDirs,
    add_claim,
    cdi_ids,
    claim_process_env,
    every_mode_claims,
    gpu_config,
    kubeconfig_for,
    opaque,
    resolve,
    simulated_gpu_state,
    uid_of,
)
from repo_paths import ROOT
from waiting import wait_for

from cdi.resolver import ContainerConfig
from dra_gpu.kube import KubeAPI, builders
from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT
from dra_gpu.plugin.sharing.steps.device_access import device_uuids
from dra_gpu.proto import dra_v1, dra_v1_grpc, registration, registration_grpc

PREVIOUS_RELEASE = "966e884c55e1d8c2764442906b8443b812bf734f"
"""The release this one upgrades from (0.1.0 before agents could run side by side); the last tag once there is one."""
RELEASES = ROOT / "native" / "limiter" / "build" / "releases"
"""Where a previous release's sources and library are kept between runs (an ignored build directory)."""
GiB = 1 << 30


class Unavailable(Exception):
    """The previous release cannot be built here; the message says why."""


@dataclass
class Release:
    name: str
    source: Path | None
    """Its `src/` for PYTHONPATH; None: this checkout (the installed package)."""
    library: Path
    """Its limiter library (libdragpu-limiter.so.1)."""


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def previous_release(commit: str = PREVIOUS_RELEASE) -> Release:
    """The release at `commit`: its sources from the repository's history and its library built from them."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        raise Unavailable("not a git checkout: the previous release is built from the repository's history")
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        raise Unavailable(
            f"commit {commit[:12]} of the previous release is not in this clone"
            + (" (a shallow clone: fetch with --unshallow)" if shallow else "")
        )
    home = RELEASES / commit[:12]
    if not (home / "src" / "dra_gpu").is_dir():
        RELEASES.mkdir(parents=True, exist_ok=True)
        unpacked = Path(tempfile.mkdtemp(prefix=".unpack-", dir=RELEASES))
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "src", "native/limiter"],
            capture_output=True,
            timeout=120,
        )
        if archive.returncode != 0:
            raise Unavailable(f"git archive {commit[:12]} failed: {archive.stderr.decode(errors='replace')}")
        subprocess.run(["tar", "-x", "-C", str(unpacked)], input=archive.stdout, check=True, timeout=120)
        with contextlib.suppress(OSError):
            os.rename(unpacked, home)  # another run may have made it meanwhile: either copy is the same
        shutil.rmtree(unpacked, ignore_errors=True)
    limiter = home / "native" / "limiter"
    built = subprocess.run(
        ["make", "-s", "-C", str(limiter), "-j2", "build/libdragpu-limiter.so.1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if built.returncode != 0:
        raise AssertionError(f"building the previous release's library failed:\n{built.stdout}{built.stderr}")
    return Release("previous", home / "src", limiter / "build" / "libdragpu-limiter.so.1")


def this_release(built: Path) -> Release:
    return Release("this", None, built / "libdragpu-limiter.so.1")


class NodeKubelet:
    """The kubelet (1.33+) of the node: registers each agent's socket as it appears, calls the newest."""

    def __init__(self, registration_dir: Path) -> None:
        self.registration_dir = registration_dir
        self.registered: list[tuple[Path, int, str]] = []
        """(registration socket, its inode, endpoint), oldest first: a socket made again is a new plugin."""
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def register_new(self) -> None:
        known = {(socket, inode) for socket, inode, _ in self.registered}
        for socket in sorted(self.registration_dir.glob("*-reg.sock"), key=lambda p: p.stat().st_mtime_ns):
            inode = socket.stat().st_ino
            if (socket, inode) in known:
                continue
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                stub = registration_grpc.RegistrationStub(channel)
                info = stub.GetInfo(registration.InfoRequest(), timeout=5)
                stub.NotifyRegistrationStatus(
                    registration.RegistrationStatus(plugin_registered=True), timeout=5
                )
            assert info.name == DRIVER
            with self._lock:
                self.registered.append((socket, inode, info.endpoint))

    def endpoint(self) -> str | None:
        """The newest registration whose socket is still there (a removed socket is a plugin that left)."""
        with self._lock:
            for socket, inode, endpoint in reversed(self.registered):
                with contextlib.suppress(FileNotFoundError):
                    if socket.stat().st_ino == inode:
                        return endpoint
        return None

    def stub(self) -> dra_v1_grpc.DRAPluginStub:
        endpoint = self.endpoint()
        if endpoint is None:
            raise ConnectionError("no agent is registered")
        with self._lock:
            channel = self._channels.get(endpoint)
            if channel is None:
                channel = self._channels[endpoint] = grpc.insecure_channel(f"unix://{endpoint}")
        return dra_v1_grpc.DRAPluginStub(channel)

    def prepare(self, *claims: dict[str, Any]) -> dict[str, Any]:
        request = dra_v1.NodePrepareResourcesRequest(
            claims=[
                dra_v1.Claim(namespace="default", name=c["metadata"]["name"], uid=uid_of(c)) for c in claims
            ]
        )
        return dict(self.stub().NodePrepareResources(request, timeout=45).claims)

    def unprepare(self, *claims: dict[str, Any]) -> dict[str, str]:
        request = dra_v1.NodeUnprepareResourcesRequest(
            claims=[
                dra_v1.Claim(namespace="default", name=c["metadata"]["name"], uid=uid_of(c)) for c in claims
            ]
        )
        answer = self.stub().NodeUnprepareResources(request, timeout=45)
        return {uid: entry.error for uid, entry in answer.claims.items()}

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


class Availability:
    """Asks the kubelet's current agent every `period_s` (an empty unprepare, answered by the DRA service
    itself): the longest time between two answers, and the calls that got none."""

    def __init__(self, kubelet: NodeKubelet, period_s: float = 0.005) -> None:
        self.kubelet = kubelet
        self.period_s = period_s
        self.answered = 0
        self.failures: list[str] = []
        self.longest_gap_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-probe", daemon=True)

    def __enter__(self) -> Availability:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Ends at the first answer from then on: a gap that is still open is measured to its end."""
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        last: float | None = None
        pause = threading.Event()  # never set: waits out the probe's period
        while True:
            stopping = self._stop.is_set()
            try:
                self.kubelet.stub().NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(), timeout=5)
            except (grpc.RpcError, ConnectionError) as exc:
                self.failures.append(str(exc)[:200])
                pause.wait(self.period_s)
                continue
            now = time.monotonic()
            if last is not None:
                self.longest_gap_s = max(self.longest_gap_s, now - last)
            last = now
            self.answered += 1
            if stopping:
                return
            pause.wait(self.period_s)


@dataclass
class Tenant:
    """A process of a limiter claim holding GPU memory under the library of the release that prepared it."""

    process: subprocess.Popen[bytes]
    out: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(30)


LAUNCHER = r"""
#include "cuda_min.h"
#include <stdio.h>
/* upgrade-launcher: launches kernels of 5 waves (50 us on the fake driver) on device 0 for as long as it runs,
 * waiting for every 20 of them; says "launching" once the first 20 ran. */
int main(void) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUstream s;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&mod, "image") || cuModuleGetFunction(&fn, mod, "small") || cuStreamCreate(&s, 0))
        return 3;
    for (unsigned long i = 1;; i++) {
        if (cuLaunchKernel(fn, 132 * 5, 1, 1, 128, 1, 1, 0, s, NULL, NULL)) return 4;
        if (i % 20 == 0 && cuStreamSynchronize(s)) return 5;
        if (i == 20) printf("launching\n"), fflush(stdout);
    }
}
"""
COMPUTE = {"fixed": (20, 20), "elastic": (30, 100), "new": (40, 40)}
"""The claims whose tenants launch, on one GPU (gpu-1, beside the time-sliced claim): name -> (floor, ceiling)
in percent. `fixed` is the every-mode Limiter claim; `elastic` borrows what the others leave idle; both are
prepared by the old agent, their tenants run under its library. `new` is prepared by the new agent after the
change, its tenant under the new library."""
WINDOW_S = 0.6
"""How long each compute share is measured over (the fake driver's busy time of each tenant)."""


def launcher(built: Path) -> Path:
    """The launching tenant's program, built once against the fake driver."""
    program = RELEASES / "upgrade-launcher"
    source = RELEASES / "upgrade-launcher.c"
    if not program.is_file() or not source.is_file() or source.read_text() != LAUNCHER:
        RELEASES.mkdir(parents=True, exist_ok=True)
        source.write_text(LAUNCHER)
        include, fake = ROOT / "native" / "limiter" / "src", built / "fake"
        made = subprocess.run(
            ["cc", "-O2", f"-I{include}", "-o", str(program), str(source), f"-L{fake}", "-lcuda"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if made.returncode != 0:
            raise AssertionError(f"building the launching tenant failed:\n{made.stderr}")
    return program


def containers_here() -> str | None:
    """Why a tenant cannot run as in a container here (None: it can): its claim's files must be mounted at
    the paths the library reads, read-only where the CDI spec says, by root (the board must be root's)."""
    if os.geteuid() != 0:
        return "the tenants see their claim's files as a container does: that needs root"
    if shutil.which("unshare") is None or shutil.which("cc") is None:
        return "needs unshare and cc"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /run"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"no mount namespace of its own here: {probe.stderr.strip()[:200]}"
    return None


def compute_claim(api: KubeAPI, name: str, floor: int, ceiling: int, n: int) -> dict[str, Any]:
    """A limiter claim on gpu-1 with this floor and ceiling (its class grants the ceiling)."""
    alloc = Alloc(
        device="gpu-1",
        share_id=f"5e1d0b3a-0000-4000-8000-00000000010{n}",
        consumed={"memory": "1Gi", "cores": str(floor)},
    )
    limiter = {"compute": {"limit": ceiling}} if ceiling != floor else {}
    config = gpu_config("Limiter", **({"limiter": limiter} if limiter else {}))
    return add_claim(api, name, [alloc], [opaque(config)])


def busy_ns(process_dir: Path, pid: int) -> tuple[int, int]:
    """(kernel time the process has run on its first device, when the fake driver said so), from the fake
    driver's file of the process (native/limiter/tests/fake/fake_processes.h)."""
    header = struct.Struct("<QIIQQ")  # magic, pid, count, seq, reserved
    device = struct.Struct("<48sQQQQ")  # uuid, used, busy_ns, at_ns, reserved
    path = process_dir / str(pid)
    for _ in range(1000):
        data = path.read_bytes()
        if len(data) < header.size + device.size:
            continue
        _, _, _, seq, _ = header.unpack_from(data)
        _, _, busy, at, _ = device.unpack_from(data, header.size)
        (again,) = struct.unpack_from("<Q", path.read_bytes(), 16)
        if seq % 2 == 0 and seq == again:
            return busy, at
    raise AssertionError(f"the fake driver's file of process {pid} kept changing")


@dataclass
class Launcher:
    """A process of a limiter claim launching kernels as fast as its share lets it, seeing its claim's files
    where a container of it would (its CDI mounts, in a mount namespace of its own), under the library of the
    release that prepared the claim."""

    process: subprocess.Popen[bytes]
    out: Path
    process_dir: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def busy(self) -> tuple[int, int]:
        return busy_ns(self.process_dir, self.process.pid)

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(30)


def start_launcher(
    program: Path, built: Path, container: ContainerConfig, library: Path, process_dir: Path, out: Path
) -> Launcher:
    script = ["set -e", "mount -t tmpfs tmpfs /run"]
    for mount in container.mounts:
        target, source = mount.container_path, mount.host_path
        if not target.startswith(str(Path(CONTAINER_CLAIMS_ROOT).parent) + "/"):
            continue
        if Path(source).is_dir():
            script.append(f"mkdir -p {shlex.quote(target)}")
        else:  # a file already there (inside a directory mounted before it) is its own mount point
            parent = shlex.quote(str(Path(target).parent))
            script.append(
                f"test -e {shlex.quote(target)} || {{ mkdir -p {parent} && touch {shlex.quote(target)}; }}"
            )
        script.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
        if "ro" in (mount.options or []):
            script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
    script.append(f"exec {shlex.quote(str(program))}")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(built / "fake"),
        "LD_PRELOAD": str(library),
        "CUDA_VISIBLE_DEVICES": ",".join(device_uuids(container.env)),
        "FAKE_CUDA_PROCESS_DIR": str(process_dir),
        "FAKE_CUDA_CTX_BYTES": "0",
    }
    with open(out, "wb") as sink:
        process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    tenant = Launcher(process, out, process_dir)
    wait_for(
        lambda: "launching" in out.read_text() or not tenant.alive(), 30, "the tenant to launch its kernels"
    )
    assert tenant.alive(), out.read_text()
    return tenant


def shares(tenants: dict[str, Launcher], window_s: float = WINDOW_S) -> dict[str, float]:
    """Each tenant's busy share of its GPU, in percent, over one window of `window_s` (all measured at once)."""
    first = {name: t.busy() for name, t in tenants.items()}
    threading.Event().wait(window_s)  # the measuring window itself, not a wait for anything to happen
    last = {name: t.busy() for name, t in tenants.items()}
    return {
        name: round(100 * (last[name][0] - first[name][0]) / max(1, last[name][1] - first[name][1]), 1)
        for name in tenants
    }


@dataclass
class Step:
    """One direction (an upgrade, or a rollback) between two releases."""

    name: str
    tenants_before: int = 0
    tenants_after: int = 0
    claims_prepared_before: int = 0
    claims_unprepared_after: int = 0
    left_behind: list[str] = field(default_factory=list)
    cap_before: int = 0
    """Bytes a new process of the limiter claim could allocate beside the tenant, before the change."""
    cap_after: int = 0
    specs_unchanged: bool = False
    """The CDI specs of the claims prepared before are the same bytes after (MPS and time-slice settings)."""
    gpu_settings_unchanged: bool = False
    """The GPUs' settings (MPS daemons, compute modes, time slices) are as the old agent left them: adopted."""
    new_claims_prepared: int = 0
    longest_gap_s: float = 0.0
    unanswered: list[str] = field(default_factory=list)
    compute: dict[str, dict[str, float]] = field(default_factory=dict)
    """Busy share of each launching tenant (COMPUTE), in percent, per moment: "before" the change, "after" it
    (the other release's agent alone), "beside new" (the new agent's claim launching too). Empty where the
    tenants cannot run as in a container (`containers_here`)."""


@dataclass
class Figures:
    steps: list[Step]
    seconds: float
    no_compute: str | None = None
    """Why the compute shares were not measured (None: they were)."""


class Upgrade:
    """The whole scenario: previous release -> this one (upgrade), then this one -> previous (rollback)."""

    def __init__(self, previous: Release, current: Release, built: Path, surge: bool = True) -> None:
        self.releases = {"previous": previous, "this": current}
        self.surge = surge
        """False: the old agent leaves before the new one starts (maxUnavailable 1, kubelets before 1.33)."""
        self.built = built
        self.dirs = PluginDirs.create()
        self.server = ApiServer()
        self.server.fake.create("Node", builders.node(NODE))
        self.kubeconfig = kubeconfig_for(self.server.url, self.dirs.root / "kubeconfig")
        self.kubelet = NodeKubelet(self.dirs.registration_dir)
        self.agents: list[AgentProcess] = []
        self.tenants: list[Tenant] = []
        self.launchers: list[Launcher] = []
        self.no_compute = containers_here()
        """Why the compute shares are not measured here (None: they are)."""
        self.program = launcher(built) if self.no_compute is None else None
        self.process_dir = self.dirs.root / "driver-processes"
        self.process_dir.mkdir()
        self._pods = 0

    def close(self) -> None:
        for tenant in self.tenants:
            tenant.stop()
        for launching in self.launchers:
            launching.stop()
        for agent in self.agents:
            agent.kill()
        self.kubelet.close()
        self.server.close()
        self.dirs.cleanup()

    def start_agent(self, release: Release) -> AgentProcess:
        """A pod of `release` beside whatever runs (surge); the previous release knows only the fixed names."""
        self._pods += 1
        pod = None if release.source is not None else f"0b0d0000-0000-4000-8000-{self._pods:012d}"
        agent = AgentProcess(
            self.dirs,
            self.kubeconfig,
            pod,
            source=release.source,
            settings={"DRA_GPU_GPU_BACKEND": f"simulated:{EVERY_MODE_PROFILE}"},
        )
        self.agents.append(agent.start().wait_serving())
        self.kubelet.register_new()
        return agent

    def start_tenant(self, claim: dict[str, Any], answer: Any, release: Release) -> Tenant:
        env = claim_process_env(self.built, resolve(self.dirs, cdi_ids(answer)))
        env["LD_PRELOAD"] = str(release.library)
        out = self.dirs.root / f"tenant-{len(self.tenants)}.out"
        with open(out, "wb") as sink:
            process = subprocess.Popen(
                [str(self.built / "limiter-probe"), "alloc", str(GiB), "2", "--hold"],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        tenant = Tenant(process, out)
        self.tenants.append(tenant)
        wait_for(lambda: "holding" in out.read_text(), 30, "the tenant to hold its memory")
        assert "allocated=2147483648" in out.read_text(), out.read_text()
        return tenant

    def launch(self, name: str, answer: Any, release: Release) -> Launcher:
        assert self.program is not None
        container = resolve(self.dirs, cdi_ids(answer))
        out = self.dirs.root / f"launcher-{len(self.launchers)}-{name}.out"
        launching = start_launcher(
            self.program, self.built, container, release.library, self.process_dir, out
        )
        self.launchers.append(launching)
        return launching

    def free_beside(self, answer: Any, release: Release) -> int:
        """What one more process of the claim may allocate now (1 GiB at a time): the claim's cap less its
        tenants' memory, as the claim's region holds it."""
        env = claim_process_env(self.built, resolve(self.dirs, cdi_ids(answer)))
        env["LD_PRELOAD"] = str(release.library)
        probe = subprocess.run(
            [str(self.built / "limiter-probe"), "alloc", str(GiB // 4)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode == 0, probe.stderr
        line = next(line for line in probe.stdout.splitlines() if line.startswith("allocated="))
        return int(line.split()[0].removeprefix("allocated="))

    def leftovers(self, claims: list[dict[str, Any]]) -> list[str]:
        """What of these claims is still on the node: CDI specs, state directories, checkpoint records."""
        uids = {uid_of(c) for c in claims}
        found = [f"CDI spec {name}" for name in self.dirs.spec_files() if any(uid in name for uid in uids)]
        found += [f"state directory {name}" for name in self.dirs.claim_dirs() if name in uids]
        found += [f"checkpoint record {uid}" for uid in uids & set(self.dirs.checkpoint().claims)]
        return found

    def step(self, name: str, old: Release, new: Release, running: AgentProcess) -> tuple[Step, AgentProcess]:
        """Claims of every mode prepared by `running` (of `old`), a tenant under `old`'s library; a `new`
        agent started beside it, `running` stopped; then what the issue asks of the new one."""
        step = Step(name)
        claims = every_mode_claims(self.server.fake, prefix=f"{name}")
        answers = self.kubelet.prepare(*claims)
        assert {u: a.error for u, a in answers.items()} == {uid_of(c): "" for c in claims}
        step.claims_prepared_before = len(claims)
        limiter = next(c for c in claims if c["metadata"]["name"].endswith("-limiter"))
        tenant = self.start_tenant(limiter, answers[uid_of(limiter)], old)
        step.cap_before = self.free_beside(answers[uid_of(limiter)], old)
        launching: dict[str, Launcher] = {}
        compute_claims: list[dict[str, Any]] = []
        if self.no_compute is None:
            floor, ceiling = COMPUTE["elastic"]
            elastic = compute_claim(self.server.fake, f"{name}-elastic", floor, ceiling, 1)
            compute_claims.append(elastic)
            answer = self.kubelet.prepare(elastic)[uid_of(elastic)]
            assert not answer.error, answer.error
            launching["fixed"] = self.launch("fixed", answers[uid_of(limiter)], old)
            launching["elastic"] = self.launch("elastic", answer, old)
            step.compute["before"] = shares(launching)
        step.tenants_before = sum(t.alive() for t in self.tenants) + sum(
            t.alive() for t in launching.values()
        )
        specs = {p.name: p.read_bytes() for p in self.dirs.cdi_dir.iterdir() if p.suffix == ".json"}
        settings = simulated_gpu_state(self.dirs)

        with Availability(self.kubelet) as availability:
            if self.surge:
                successor = self.start_agent(new)
                code = running.terminate()
            else:
                code = running.terminate()
                successor = self.start_agent(new)
            assert code == 0, running.log()
        step.longest_gap_s = availability.longest_gap_s
        step.unanswered = availability.failures

        step.gpu_settings_unchanged = simulated_gpu_state(self.dirs) == settings
        step.tenants_after = sum(t.alive() for t in self.tenants) + sum(t.alive() for t in launching.values())
        step.cap_after = self.free_beside(answers[uid_of(limiter)], old)
        step.specs_unchanged = specs == {
            p.name: p.read_bytes() for p in self.dirs.cdi_dir.iterdir() if p.name in specs
        }
        if launching:
            step.compute["after"] = shares(launching)
            floor, ceiling = COMPUTE["new"]
            beside = compute_claim(self.server.fake, f"{name}-beside", floor, ceiling, 2)
            compute_claims.append(beside)
            answer = self.kubelet.prepare(beside)[uid_of(beside)]
            assert not answer.error, answer.error
            launching["new"] = self.launch("new", answer, new)
            step.compute["beside new"] = shares(launching)
            old_tenants = [t for n, t in launching.items() if n != "new"]
            step.tenants_after = min(
                step.tenants_after, sum(t.alive() for t in self.tenants) + sum(t.alive() for t in old_tenants)
            )
            for launched in launching.values():
                launched.stop()
                self.launchers.remove(launched)
            undone_compute = self.kubelet.unprepare(*compute_claims)
            assert all(not e for e in undone_compute.values()), undone_compute
        # The tenant's pod ends; the kubelet asks the new agent to undo what the old one prepared...
        tenant.stop()
        self.tenants.remove(tenant)
        unprepared = self.kubelet.unprepare(*claims)
        step.claims_unprepared_after = sum(not unprepared[uid_of(c)] for c in claims)
        # ...and new pods' claims of every mode, on the same GPUs, are prepared (and undone) by it.
        fresh = every_mode_claims(self.server.fake, prefix=f"{name}-new")
        fresh_answers = self.kubelet.prepare(*fresh)
        step.new_claims_prepared = sum(not a.error for a in fresh_answers.values())
        undone = self.kubelet.unprepare(*fresh)
        step.left_behind = self.leftovers(claims + fresh + compute_claims) + [
            f"claim {uid}: {error}" for uid, error in undone.items() if error
        ]
        gpus = simulated_gpu_state(self.dirs)
        step.left_behind += [f"{kind} on {gpu}" for kind in ("mps", "timeslice") for gpu in gpus[kind]]
        return step, successor

    def run(self) -> Figures:
        started = time.monotonic()
        previous, current = self.releases["previous"], self.releases["this"]
        first = self.start_agent(previous)
        upgrade, second = self.step("upgrade", previous, current, first)
        rollback, _ = self.step("rollback", current, previous, second)
        return Figures([upgrade, rollback], time.monotonic() - started, self.no_compute)
