"""An upgrade and a rollback of the node agent on one node, as the DaemonSet does them with surge, between the
previous release (built from the repository's history) and this checkout.

Real processes throughout: both agents are `dra-gpu kubelet-plugin` (the previous one from `git archive` of
`PREVIOUS_RELEASE`, run over the same virtual environment), against one HTTP API server, on simulated GPUs; the
tenants are `limiter-probe` processes under the limiter library of the release that prepared their claim,
against the fake CUDA driver; the kubelet is modelled as 1.33+ is: it registers every agent's socket and calls
the newest registration whose socket is still there. A probe of the kubelet's asks the current agent every few
milliseconds, so a moment without an answer is seen.

`Upgrade.run()` does the whole of it and returns the figures of the issue's table (`Figures`);
tests/node_agent/test_upgrade.py asserts on them, bench/upgrade.py prints them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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
    PluginDirs,
    cdi_ids,
    claim_process_env,
    every_mode_claims,
    kubeconfig_for,
    resolve,
    simulated_gpu_state,
    uid_of,
)
from repo_paths import ROOT
from waiting import wait_for

from dra_gpu.kube import builders
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


@dataclass
class Figures:
    steps: list[Step]
    seconds: float


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
        self._pods = 0

    def close(self) -> None:
        for tenant in self.tenants:
            tenant.stop()
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
        step.tenants_before = sum(t.alive() for t in self.tenants)
        step.cap_before = self.free_beside(answers[uid_of(limiter)], old)
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
        step.tenants_after = sum(t.alive() for t in self.tenants)
        step.cap_after = self.free_beside(answers[uid_of(limiter)], old)
        step.specs_unchanged = specs == {
            p.name: p.read_bytes() for p in self.dirs.cdi_dir.iterdir() if p.name in specs
        }
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
        step.left_behind = self.leftovers(claims + fresh) + [
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
        return Figures([upgrade, rollback], time.monotonic() - started)
