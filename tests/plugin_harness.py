"""Helpers to run the kubelet plugin on temporary directories and to act as the kubelet.

- ``PluginDirs``: short temporary paths for every directory the plugin uses (unix socket paths are
  limited to 107 bytes, so they do not live under pytest's long ``tmp_path``).
- ``add_claim`` / ``Alloc`` / ``gpu_config`` / ``opaque``: allocated ResourceClaims in the API fake,
  shaped as a real API server returns them after scheduling.
- ``Kubelet``: the kubelet's side of the sockets, over real gRPC: registration, prepare, unprepare.
- ``running_plugin``: the node agent in-process (``NodeAgent``) as a context manager.
- ``PluginProcess``: the plugin in its own process, which a test can kill at a named step of
  prepare/unprepare (``--crash-at``) and start again. The process reads the cluster from a JSON
  snapshot (``SnapshotKube``) that the test rewrites between runs, since an in-memory fake cannot be
  shared between processes. Run as a script, this module is that process's entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from limiter_env import limiter_env
from ports import unused_port
from waiting import wait_for

from cdi.resolver import ContainerConfig, Registry
from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.config import NodeSharing
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import Inventory, SimulatedInventory
from dra_gpu.kube import KubeAPI, NotFound, builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.monitor import Monitor
from dra_gpu.node_agent import NodeAgent, NodeAgentConfig
from dra_gpu.plugin.checkpoint import Checkpoint, CheckpointStore
from dra_gpu.plugin.preparer_core import FaultHook
from dra_gpu.plugin.sharing.modes.limiter import host_environment_of
from dra_gpu.plugin.sharing.steps.device_access import device_uuids
from dra_gpu.proto import dra_v1, dra_v1_grpc, registration, registration_grpc

NODE = "node-1"
DRIVER = DRIVER_NAME
PROFILE = "2xH100-80GB"
CAPACITIES = ("memory", "cores")
"""The capacities every GPU device publishes."""
CRASH_EXIT_CODE = 86
HERE = Path(__file__).resolve().parent


# -- directories -------------------------------------------------------------------------------------
@dataclass
class PluginDirs:
    root: Path
    registration_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    state_dir: Path
    dev_root: Path
    ctk_dir: Path
    limiter_library: Path

    @classmethod
    def at(cls, root: Path) -> PluginDirs:
        """The layout under `root`, as `create` makes it (nothing is created here)."""
        return cls(
            root=root,
            registration_dir=root / "reg",
            plugins_dir=root / "plugins",
            cdi_dir=root / "cdi",
            state_dir=root / "state",
            dev_root=root / "host",
            ctk_dir=root / "etc-cdi",
            limiter_library=root / "lib" / "libdragpu-limiter.so.0.1.0",
        )

    @classmethod
    def create(cls, with_limiter: bool = True, parent: Path | None = None) -> PluginDirs:
        """Under `parent` (default /tmp), e.g. a sandbox a test watches for what must not be touched."""
        dirs = cls.at(Path(tempfile.mkdtemp(prefix="dg-", dir=parent or "/tmp")))
        for d in (dirs.cdi_dir, dirs.dev_root, dirs.ctk_dir, dirs.limiter_library.parent):
            d.mkdir(parents=True)
        if with_limiter:
            dirs.limiter_library.write_bytes(b"\x7fELF stand-in for the limiter library\n")
        return dirs

    def config(self, node_name: str = NODE, **overrides: Any) -> NodeAgentConfig:
        values: dict[str, Any] = {
            "node_name": node_name,
            "state_dir": self.state_dir,
            "cdi_dir": self.cdi_dir,
            "registration_dir": self.registration_dir,
            "plugins_dir": self.plugins_dir,
            "limiter_library": self.limiter_library,
            "nvidia_ctk_dirs": (self.ctk_dir, self.cdi_dir),
            "dev_root": self.dev_root,
            "boot_id": "boot-1",
        }
        values.update(overrides)
        return NodeAgentConfig(**values)

    @property
    def registration_socket(self) -> Path:
        return self.registration_dir / f"{DRIVER}-reg.sock"

    @property
    def service_socket(self) -> Path:
        return self.plugins_dir / DRIVER / "dra.sock"

    @property
    def simulated_state(self) -> Path:
        return self.state_dir / "simulated-gpus.json"

    def make_device_nodes(self, minors: Iterable[int] = (0, 1)) -> None:
        """Stand-ins for the host's /dev/nvidia* (regular files: only their existence matters here)."""
        dev = self.dev_root / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for name in [f"nvidia{m}" for m in minors] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
            (dev / name).write_text("")

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.iterdir() if not p.name.startswith("."))

    def claim_dirs(self) -> list[str]:
        root = self.state_dir / "claims"
        return sorted(p.name for p in root.iterdir()) if root.is_dir() else []

    def checkpoint(self) -> Checkpoint:
        return CheckpointStore(self.state_dir / "checkpoint.json").load()

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def simulated_gpu_state(dirs: PluginDirs) -> dict[str, dict[str, Any]]:
    return SimulatedCommands(state_file=dirs.simulated_state).snapshot()


# -- claims ------------------------------------------------------------------------------------------
def gpu_config(strategy: str = "Exclusive", **sections: Any) -> dict[str, Any]:
    """Opaque `parameters` of a GpuConfig, e.g. gpu_config("TimeSlicing", timeSlicing={"interval": "Long"})."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CONFIG_KIND,
        "sharing": {"strategy": strategy, **sections},
    }


def opaque(
    parameters: Any, source: str = "FromClass", requests: Sequence[str] = (), driver: str = DRIVER
) -> dict[str, Any]:
    """One `status.allocation.devices.config[]` entry."""
    return builders.opaque_config(driver, parameters, source=source, requests=requests)


def class_grant(compute: dict[str, Any]) -> dict[str, Any]:
    """The `FromClass` config of a limiter class that grants exactly this `compute` section (a claim may ask
    for no more priority or ceiling than its class grants, and takes from it what it leaves out)."""
    return opaque(gpu_config("Limiter", limiter={"compute": compute}))


@dataclass
class Alloc:
    """One `status.allocation.devices.results[]` entry."""

    device: str = "gpu-0"
    request: str = "gpu"
    share_id: str | None = None
    consumed: dict[str, str] | None = None
    driver: str = DRIVER
    pool: str = NODE
    admin_access: bool = False

    def __post_init__(self) -> None:
        missing = [c for c in CAPACITIES if self.consumed and c not in self.consumed]
        if missing:
            raise ValueError(
                f"Alloc consumed={self.consumed}: add {', '.join(missing)}; the scheduler lists every "
                f"capacity of the device in consumedCapacity"
            )

    def result(self) -> dict[str, Any]:
        return builders.device_result(
            self.request,
            self.driver,
            self.pool,
            self.device,
            share_id=self.share_id,
            consumed=self.consumed or None,
            admin_access=self.admin_access,
        )


def add_claim(
    api: KubeAPI,
    name: str,
    allocs: Sequence[Alloc] = (Alloc(),),
    configs: Sequence[dict[str, Any]] = (),
    *,
    namespace: str = "default",
    allocated: bool = True,
    class_name: str = "gpu.dra-gpu.io",
) -> dict[str, Any]:
    """Create a claim and, unless `allocated=False`, allocate and reserve it as the scheduler would."""
    requests = sorted({a.request.split("/", 1)[0] for a in allocs} or {"gpu"})
    created = api.create(
        "ResourceClaim", builders.claim(name, class_name, namespace=namespace, request=requests)
    )
    if not allocated:
        return created
    allocation = builders.allocation([a.result() for a in allocs], configs, node_name=NODE)
    pod = builders.pod_reference(f"{name}-pod", f"pod-{name}")
    return api.update_status("ResourceClaim", builders.allocated_claim(created, allocation, pod))


def share_claim(
    api: KubeAPI,
    name: str,
    strategy: str = "Limiter",
    *,
    device: str = "gpu-0",
    share: int = 1,
    memory: str = "1Gi",
    cores: str = "1",
    namespace: str = "default",
    **sections: Any,
) -> dict[str, Any]:
    """A claim in `namespace` the scheduler gave a share of `device` (numbered `share`: its share ID),
    consuming `memory` and `cores`, of class config `strategy` with its `sections` (`timeSlicing={...}`)."""
    alloc = Alloc(
        device=device,
        share_id=f"5e1d0b3a-0000-4000-8000-{share:012x}",
        consumed={"memory": memory, "cores": cores},
    )
    return add_claim(api, name, [alloc], [opaque(gpu_config(strategy, **sections))], namespace=namespace)


def two_shares() -> list[Alloc]:
    """Two shares of gpu-0 for one claim, of requests `a` (1 GiB, 10 cores) and `b` (2 GiB, 5 cores)."""
    return [
        Alloc(
            request="a",
            share_id="00000000-0000-4000-8000-00000000000a",
            consumed={"memory": "1Gi", "cores": "10"},
        ),
        Alloc(
            request="b",
            share_id="00000000-0000-4000-8000-00000000000b",
            consumed={"memory": "2Gi", "cores": "5"},
        ),
    ]


ClaimLike = dict[str, Any] | tuple[str, str, str]


def claim_ref(claim: ClaimLike) -> tuple[str, str, str]:
    """(namespace, name, uid) of a claim object or such a tuple."""
    if isinstance(claim, tuple):
        return claim
    return objects.namespace(claim), objects.name(claim), objects.uid(claim)


def uid_of(claim: ClaimLike) -> str:
    return claim_ref(claim)[2]


# -- the kubelet's side ------------------------------------------------------------------------------
class Kubelet:
    """What the kubelet does over the plugin's sockets (real gRPC, real unix sockets)."""

    def __init__(self, registration_dir: Path, driver: str = DRIVER, timeout_s: float = 45.0) -> None:
        self.registration_dir = registration_dir
        self.driver = driver
        self.timeout_s = timeout_s
        self.info: Any = None
        self._channel: grpc.Channel | None = None

    def register(
        self, accept: bool = True, error: str = "", wait_s: float = 20.0, socket: Path | None = None
    ) -> Any:
        """Find the registration socket (the fixed name unless `socket` is given), GetInfo, check it, and
        tell the plugin the verdict; its endpoint is where the calls go from then on (the newest
        registration, as a kubelet 1.33+ does with two agents of a rolling update)."""
        socket = socket or self.registration_dir / f"{self.driver}-reg.sock"
        self.close()
        deadline = time.monotonic() + wait_s
        while not socket.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no registration socket {socket} after {wait_s}s")
            time.sleep(0.02)
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = registration_grpc.RegistrationStub(channel)
            info = stub.GetInfo(registration.InfoRequest(), timeout=5)
            stub.NotifyRegistrationStatus(
                registration.RegistrationStatus(plugin_registered=accept, error=error), timeout=5
            )
        self.info = info
        self.close()
        return info

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            if self.info is None:
                raise RuntimeError("register() first: the endpoint comes from GetInfo")
            self._channel = grpc.insecure_channel(f"unix://{self.info.endpoint}")
        return self._channel

    @staticmethod
    def _claims(pb: Any, claims: Iterable[ClaimLike]) -> list[Any]:
        return [pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in map(claim_ref, claims)]

    def prepare(self, *claims: ClaimLike) -> dict[str, Any]:
        """NodePrepareResources; returns the response's map claim UID -> NodePrepareResourceResponse."""
        response = self._stub().NodePrepareResources(
            dra_v1.NodePrepareResourcesRequest(claims=self._claims(dra_v1, claims)), timeout=self.timeout_s
        )
        return dict(response.claims)

    def unprepare(self, *claims: ClaimLike) -> dict[str, str]:
        """NodeUnprepareResources; returns claim UID -> error ("" for success)."""
        response = self._stub().NodeUnprepareResources(
            dra_v1.NodeUnprepareResourcesRequest(claims=self._claims(dra_v1, claims)), timeout=self.timeout_s
        )
        return {uid: entry.error for uid, entry in response.claims.items()}

    def _stub(self) -> dra_v1_grpc.DRAPluginStub:
        return dra_v1_grpc.DRAPluginStub(self.channel())

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def cdi_ids(response: Any) -> list[str]:
    """Every CDI id of a NodePrepareResourceResponse, in device order."""
    return [cdi for device in response.devices for cdi in device.cdi_device_ids]


def resolve(dirs: PluginDirs, ids: Iterable[str]) -> ContainerConfig:
    """What a runtime configured with the toolkit's and our CDI directories injects for these ids."""
    return Registry.load([dirs.ctk_dir, dirs.cdi_dir]).resolve(list(ids))


def claim_process_env(built: Path, container: ContainerConfig) -> dict[str, str]:
    """The environment of a process of the claim, run on the host: this environment less any limiter or
    fake-driver settings, the fake driver, the limiter build preloaded (not the stand-in file), the claim's
    files at their host paths (what the library reads in a container) and the claim's GPUs visible."""
    files = host_environment_of((m.container_path, m.host_path) for m in container.mounts)
    files = {
        k: v for k, v in files.items() if not k.startswith("LD_")
    }  # the build's library, not the stand-in
    return limiter_env(built, **files, CUDA_VISIBLE_DEVICES=",".join(device_uuids(container.env)))


@contextlib.contextmanager
def prepared_container(dirs: PluginDirs, claim: ClaimLike) -> Iterator[ContainerConfig]:
    """A kubelet registers with the running plugin and prepares `claim`: what a container of it gets."""
    kubelet = Kubelet(dirs.registration_dir)
    kubelet.register()
    try:
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert not response.error, response.error
        yield resolve(dirs, cdi_ids(response))
    finally:
        kubelet.close()


# -- the plugin in-process ---------------------------------------------------------------------------
@contextlib.contextmanager
def running_plugin(
    dirs: PluginDirs,
    api: KubeAPI,
    *,
    inventory: Inventory | None = None,
    commands: GpuCommands | None = None,
    fault_hook: FaultHook | None = None,
    publish_slices: bool = False,
    sharing: str = "*=Shared",
    **config: Any,
) -> Iterator[NodeAgent]:
    """The node agent around the plugin; `config` overrides NodeAgentConfig fields (see `PluginDirs.config`)."""
    inventory = inventory or SimulatedInventory(PROFILE, seed=NODE)
    commands = commands or SimulatedCommands(state_file=dirs.simulated_state)
    plugin = NodeAgent(
        dirs.config(**config),
        api,
        inventory,
        commands,
        fault_hook=fault_hook,
        publish_slices=publish_slices,
        sharing=NodeSharing.parse(sharing),
    )
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop(grace_s=0.5)


@contextlib.contextmanager
def registered_kubelet(
    dirs: PluginDirs, api: KubeAPI, **plugin_kw: Any
) -> Iterator[tuple[NodeAgent, Kubelet]]:
    """`running_plugin` with a kubelet registered with it; the kubelet's channel is closed on the way out."""
    with running_plugin(dirs, api, **plugin_kw) as agent:
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        try:
            yield agent, kubelet
        finally:
            kubelet.close()


def monitor_of(agent: NodeAgent) -> Monitor:
    """The agent's usage monitor (the test's config turns it on)."""
    assert agent.monitor is not None, "the usage monitor is off"
    return agent.monitor


# -- the plugin as a process -------------------------------------------------------------------------
class SnapshotKube:
    """A read-only `KubeAPI` serving the objects of a JSON file, re-read on every call.

    This is a fake for a plugin running in a subprocess: the test owns the cluster state (a
    `FakeKube`) and writes it with `write_snapshot` before starting the plugin or between runs.
    Only the reads the kubelet plugin makes are implemented; writes raise NotImplementedError.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _objects(self, kind: str) -> list[dict[str, Any]]:
        data = json.loads(self.path.read_text())
        return [o for o in data.get(kind, [])]

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        for obj in self._objects(kind):
            meta = obj["metadata"]
            if meta["name"] == name and (namespace is None or meta.get("namespace") == namespace):
                return obj
        raise NotFound(f'{kind.lower()}s "{name}" not found')

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        items = [
            o for o in self._objects(kind) if not namespace or o["metadata"].get("namespace") == namespace
        ]
        return items, "1"

    def __getattr__(self, verb: str) -> Any:
        raise NotImplementedError(f"SnapshotKube is read-only: {verb} is not available")


def write_snapshot(api: FakeKube, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ResourceClaim": api.objects("ResourceClaim")}))
    os.replace(tmp, path)


@dataclass
class PluginProcess:
    """`python plugin_harness.py serve ...`: the plugin in its own process."""

    dirs: PluginDirs
    snapshot: Path
    crash_at: str | None = None
    boot_id: str = "boot-1"
    profile: str = PROFILE
    extra_args: tuple[str, ...] = ()
    """More `serve` options, e.g. `--mps-control PATH` to drive real (stand-in) GPU tools, or
    `--http-address 127.0.0.1:0` (the bound port is then in `<root>/http-port`)."""
    nofile: tuple[int, int] | None = None
    """The (soft, hard) RLIMIT_NOFILE to start with, e.g. (1024, 1024) as a container may get it."""
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.dirs.root / f"plugin-{time.monotonic_ns()}.log"

    def start(self, wait_s: float = 30.0) -> PluginProcess:
        argv = [
            sys.executable,
            str(HERE / "plugin_harness.py"),
            "serve",
            "--root",
            str(self.dirs.root),
            "--snapshot",
            str(self.snapshot),
            "--boot-id",
            self.boot_id,
            "--profile",
            self.profile,
        ]
        if self.crash_at:
            argv += ["--crash-at", self.crash_at]
        argv += self.extra_args
        with open(self.log_path, "wb") as log_file:
            # A process group of its own, as a container's processes are: `kill_group` kills it all.
            self.process = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if self.nofile is None else self._limit_files,
            )
        ready = self.dirs.root / "ready"
        deadline = time.monotonic() + wait_s
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"plugin process exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"plugin process not ready after {wait_s}s:\n{self.log()}")
            time.sleep(0.02)
        ready.unlink()
        return self

    def _limit_files(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def terminate(self, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def kill_group(self) -> None:
        """SIGKILL to every process of the plugin's process group, as when its container is killed."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _serve(args: argparse.Namespace) -> int:
    from dra_gpu.commands._process import wait_for_signal
    from dra_gpu.logs import setup_logging

    setup_logging("info", "text")
    dirs = PluginDirs.at(Path(args.root))
    crash_step, _, nth = (args.crash_at or "").partition("#")
    remaining = [int(nth or 1)]

    def hook(step: str) -> None:
        if step == crash_step:
            remaining[0] -= 1
            if remaining[0] == 0:
                print(f"crashing at {step}", flush=True)
                os._exit(CRASH_EXIT_CODE)

    commands: GpuCommands = SimulatedCommands(state_file=dirs.simulated_state)
    if args.mps_control:
        commands = NvidiaCommands(
            nvidia_smi=args.nvidia_smi,
            mps_control=args.mps_control,
            mps_cgroup=Path(args.mps_cgroup) if args.mps_cgroup else None,
            timeout_s=10,
        )
    plugin = NodeAgent(
        dirs.config(boot_id=args.boot_id, http_address=args.http_address),
        SnapshotKube(Path(args.snapshot)),
        SimulatedInventory(args.profile, seed=NODE),
        commands,
        fault_hook=hook,
    )
    plugin.start()
    if plugin.http_port is not None:
        (dirs.root / "http-port").write_text(str(plugin.http_port))
    (dirs.root / "ready").write_text(str(os.getpid()))
    stop = threading.Event()
    try:
        wait_for_signal(stop)
    finally:
        plugin.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run the kubelet plugin for tests")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--root", required=True)
    serve.add_argument("--snapshot", required=True)
    serve.add_argument("--boot-id", default="boot-1")
    serve.add_argument("--profile", default=PROFILE)
    serve.add_argument(
        "--crash-at", help="STEP[#N]: exit abruptly at the Nth time prepare/unprepare reaches STEP"
    )
    serve.add_argument("--mps-control", help="run this nvidia-cuda-mps-control (real processes)")
    serve.add_argument("--nvidia-smi", default="true", help="with --mps-control: the nvidia-smi to run")
    serve.add_argument("--mps-cgroup", help="with --mps-control: the MPS daemons' cgroup directory")
    serve.add_argument("--http-address", help="serve /metrics and the health checks here")
    args = parser.parse_args(argv)
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())


# ---- the agent as a process: `dra-gpu kubelet-plugin` ----

CLI = [sys.executable, "-m", "dra_gpu.cli", "--log-format", "json", "kubelet-plugin"]


def env_for(dirs: PluginDirs, kubeconfig: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_GPU_")}
    defaults = {
        "DRA_GPU_NODE_NAME": "node-1",
        "DRA_GPU_REGISTRATION_DIR": str(dirs.registration_dir),
        "DRA_GPU_PLUGINS_DIR": str(dirs.plugins_dir),
        "DRA_GPU_CDI_DIR": str(dirs.cdi_dir),
        "DRA_GPU_STATE_DIR": str(dirs.state_dir),
        "DRA_GPU_GPU_BACKEND": "simulated:2xH100-80GB",
        "DRA_GPU_LIMITER_LIBRARY": str(dirs.limiter_library),
        "DRA_GPU_KUBECONFIG": str(kubeconfig),
        "DRA_GPU_HTTP_ADDRESS": "127.0.0.1:0",
        "DRA_GPU_PUBLISH_SLICES": "false",
    }
    env.update({**defaults, **extra})
    return env


def unreachable_kubeconfig(path: Path) -> Path:
    return kubeconfig_for("http://127.0.0.1:9", path)


def kubeconfig_for(server: str, path: Path) -> Path:
    """A kubeconfig naming the API server at `server` (e.g. `http_api_server.ApiServer.url`)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path


@dataclass
class AgentProcess:
    """One pod of the DaemonSet: `dra-gpu kubelet-plugin` with the environment the DaemonSet gives it.

    `pod_uid` names its sockets (None: the fixed names); `source` runs another checkout's `src/` (an
    older release, over the same virtual environment) instead of this one."""

    dirs: PluginDirs
    kubeconfig: Path
    pod_uid: str | None = None
    source: Path | None = None
    settings: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.dirs.root / f"agent-{time.monotonic_ns()}.log"

    def start(self) -> AgentProcess:
        self.port = unused_port()
        # The harness reads the agent's /metrics without a token (tests/http_endpoint/test_metrics_auth.py
        # checks the authentication itself); a release without the flag ignores the variable.
        extra = {
            "DRA_GPU_HTTP_ADDRESS": f"127.0.0.1:{self.port}",
            "DRA_GPU_MONITOR_INTERVAL": "0",
            "DRA_GPU_METRICS_AUTH": "false",
        }
        if self.pod_uid is not None:
            extra["DRA_GPU_POD_UID"] = self.pod_uid
        env = env_for(self.dirs, self.kubeconfig, **{**extra, **self.settings})
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.source), *filter(None, [env.get("PYTHONPATH")])])
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                CLI, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def registration_socket(self) -> Path:
        if self.pod_uid is None:
            return self.dirs.registration_socket
        return self.dirs.registration_dir / f"{DRIVER}-{self.pod_uid}-reg.sock"

    def wait_serving(self, timeout_s: float = 60.0) -> AgentProcess:
        """Until its registration socket is there (it serves the kubelet from then on)."""
        assert self.process is not None

        def serving() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the agent exited with {self.process.returncode}:\n{self.log()}")
            return self.registration_socket().exists()

        wait_for(serving, timeout_s, f"the agent {self.pod_uid} to serve")
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
            text: str = answer.read().decode()
        return text

    def publishing(self) -> bool:
        return "dra_gpu_publishing_slices 1.0" in self.metrics()

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, as the kubelet sends when the DaemonSet replaces the pod; its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


EVERY_MODE_PROFILE = "3xH100-80GB"
"""Enough GPUs for a claim of every mode at once: MPS on gpu-0, limiter and time-slicing on gpu-1, a whole gpu-2."""


def every_mode_claims(api: KubeAPI, prefix: str = "mode") -> list[dict[str, Any]]:
    """One allocated claim of each sharing mode (Exclusive, MPS, Limiter, TimeSlicing) on this node's GPUs."""
    shares = {
        "MPS": ("gpu-0", "10Gi", "30"),
        "Limiter": ("gpu-1", "4Gi", "20"),
        "TimeSlicing": ("gpu-1", "8Gi", "10"),
    }
    claims = [
        add_claim(api, f"{prefix}-exclusive", [Alloc(device="gpu-2")], [opaque(gpu_config("Exclusive"))])
    ]
    for i, (strategy, (device, memory, cores)) in enumerate(shares.items()):
        section: dict[str, Any] = {"timeSlicing": {"interval": "Medium"}} if strategy == "TimeSlicing" else {}
        name = f"{prefix}-{strategy.lower()}"
        claims.append(
            share_claim(api, name, strategy, device=device, share=i, memory=memory, cores=cores, **section)
        )
    return claims
