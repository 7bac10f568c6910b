"""The kubelet plugin: sockets, gRPC servers and background duties, wired around one Preparer.

`KubeletPlugin` is usable in-process with any `KubeAPI`; `dra_gpu.node_agent` runs it on every GPU
node, with the HTTP endpoint, the usage monitor and the slice publisher.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dra_gpu import DRIVER_NAME, __version__
from dra_gpu.host.driver_root import host_python, install_ldcache_hook, tool_env, tool_path
from dra_gpu.host.gpu_commands import DEFAULT_MPS_SHM_BYTES, GpuCommands
from dra_gpu.host.mig_commands import MIG_MINORS
from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import Inventory
from dra_gpu.inventory.capabilities import LimitHook
from dra_gpu.inventory.capabilities import log_choice as log_isolation_choice
from dra_gpu.kube import KubeAPI
from dra_gpu.plugin.cdi_specs import ClaimSpecs
from dra_gpu.plugin.checkpoint import CheckpointStore, current_boot_id
from dra_gpu.plugin.health import (
    DeviceHealthServicer,
    DeviceHealthStream,
    DeviceHealthV1alpha1Servicer,
)
from dra_gpu.plugin.locking import LOCK_FILE_NAME, NodeLock
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.preparer import Preparer
from dra_gpu.plugin.preparer_core import FaultHook, PreparerCore, device_name
from dra_gpu.plugin.registration import RegistrationServicer
from dra_gpu.plugin.service import DraV1Servicer
from dra_gpu.plugin.sharing.plan import NodeContext
from dra_gpu.proto import (
    DRA_V1_SERVICE,
    HEALTH_V1_SERVICE,
    HEALTH_V1ALPHA1_SERVICE,
    dra_v1_grpc,
    full_service_name,
    health_v1_grpc,
    health_v1alpha1_grpc,
    registration_grpc,
)

log = logging.getLogger(__name__)

# Versioned like the package: the init container installs the library of this release under this name.
DEFAULT_LIMITER_LIBRARY = Path(f"/var/lib/dra-gpu/lib/libdragpu-limiter.so.{__version__}")
MAX_SOCKET_PATH = 107
SUPPORTED_VERSIONS = (DRA_V1_SERVICE, HEALTH_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE)
"""What the registration advertises: DRA v1 only (slices are `resource.k8s.io/v1`, so 1.34+, whose
kubelets all speak it) and both health versions (a 1.37+ kubelet picks v1, an older one v1alpha1)."""


@dataclass
class PluginConfig:
    """Where the plugin keeps its sockets and state, and what it hands to the containers."""

    node_name: str
    state_dir: Path = Path("/var/lib/dra-gpu")
    cdi_dir: Path = Path("/var/run/cdi")
    registration_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    driver_name: str = DRIVER_NAME
    limiter_library: Path = DEFAULT_LIMITER_LIBRARY
    nvidia_ctk_dirs: tuple[Path, ...] | None = None
    """Where to look for the NVIDIA Container Toolkit's spec; default `/etc/cdi` and `cdi_dir`."""
    dev_root: Path = Path("/")
    """The host's root as this process sees it, for `/dev/nvidia*` (tests point it elsewhere)."""
    boot_id: str | None = None
    pool_name: str | None = None
    """The ResourceSlice pool of this node's GPUs; the node name unless the publisher says otherwise."""
    lock_timeout_s: float = 30.0
    supervise_interval_s: float = 5.0
    stale_claim_interval_s: float = 600.0
    health_heartbeat_s: float = 10.0
    driver_root: Path = Path("/")
    """Where the node's NVIDIA driver files (libraries, nvidia-smi, MPS programs) are, as this process sees them."""
    driver_root_host_path: Path | None = None
    """The driver root as the container runtime on the host sees it (for CDI mounts); None: `driver_root`."""
    mps_shm_bytes: int = DEFAULT_MPS_SHM_BYTES
    """The size of each MPS daemon's /dev/shm (a tmpfs its clients share)."""
    mps_cgroup: Path | None = None
    """A cgroup-v2 directory for the MPS daemons, so that they are not charged to the agent."""
    limit_hook: LimitHook | None = None
    """The memory-limit hook found at start, the one the inventory's capabilities were decided with."""
    pod_uid: str | None = None
    """This agent's pod UID (the downward API's metadata.uid): its sockets carry it, so that during a
    rolling update with surge two agents serve side by side and the kubelet (1.33+) uses the newest.
    None: the fixed names of one agent per node."""

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def service_socket(self) -> Path:
        return self.plugin_dir / ("dra.sock" if self.pod_uid is None else f"dra-{self.pod_uid}.sock")

    @property
    def registration_socket(self) -> Path:
        if self.pod_uid is None:
            return self.registration_dir / f"{self.driver_name}-reg.sock"
        named = self.registration_dir / f"{self.driver_name}-{self.pod_uid}-reg.sock"
        if len(str(named)) <= MAX_SOCKET_PATH:
            return named
        # The kubelet only needs a unique socket in its directory: a digest keeps it within the limit.
        digest = hashlib.sha256(f"{self.driver_name}/{self.pod_uid}".encode()).hexdigest()[:32]
        return self.registration_dir / f"{digest}-reg.sock"

    @property
    def checkpoint_file(self) -> Path:
        return self.state_dir / "checkpoint.json"


def default_commands(inventory: Inventory, config: PluginConfig) -> GpuCommands:
    state_dir = config.state_dir
    if inventory.backend == "nvml":
        root = config.driver_root
        return NvidiaCommands(
            nvidia_smi=tool_path(root, "nvidia-smi"),
            mps_control=tool_path(root, "nvidia-cuda-mps-control"),
            tool_env=tool_env(root, state_dir / "driver-libraries"),
            isolate_shm=True,
            mps_shm_bytes=config.mps_shm_bytes,
            mps_cgroup=config.mps_cgroup,
            mig_minors=root / MIG_MINORS,
        )
    state = state_dir / "simulated-gpus.json"
    log.warning(
        "simulated GPUs: nvidia-smi and nvidia-cuda-mps-control are not run; what they would change is "
        "recorded in the simulated GPU state",
        extra={"state_file": str(state)},
    )
    return SimulatedCommands(state_file=state)


def _make_private_dir(path: Path) -> None:
    """Our own directory (named for the driver, or the state directory): not world-accessible."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o750)


def _check_socket_path(path: Path) -> None:
    if len(str(path)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"socket path {path} is {len(str(path))} bytes; unix sockets allow at most {MAX_SOCKET_PATH}"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"{path} exists and is not a socket; refusing to remove it")


class KubeletPlugin:
    """The kubelet plugin. `start()` serves; `stop()` removes the sockets (the kubelet's cue that we left)."""

    def __init__(
        self,
        config: PluginConfig,
        api: KubeAPI,
        inventory: Inventory,
        commands: GpuCommands | None = None,
        *,
        metrics: PluginMetrics | None = None,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.config = config
        self.api = api
        self.inventory = inventory
        self.metrics = metrics or PluginMetrics()
        self.commands = commands or default_commands(inventory, config)
        self.pool = config.pool_name or config.node_name
        self.node = NodeContext(
            driver=config.driver_name,
            state_dir=config.state_dir,
            limiter_library=config.limiter_library,
            dev_root=config.dev_root,
            commands=self.commands,
            nvidia_ctk_dirs=config.nvidia_ctk_dirs
            if config.nvidia_ctk_dirs is not None
            else (Path("/etc/cdi"), config.cdi_dir),
            driver_root=config.driver_root,
            driver_root_host_path=config.driver_root_host_path,
            limit_hook=config.limit_hook,
        )
        self._hooks_dir = config.state_dir / "bin"
        self.lock = NodeLock(config.plugin_dir / LOCK_FILE_NAME, timeout_s=config.lock_timeout_s)
        self.preparer = Preparer(
            PreparerCore(
                api=api,
                inventory=inventory,
                node=self.node,
                store=CheckpointStore(config.checkpoint_file),
                lock=self.lock,
                specs=ClaimSpecs(config.cdi_dir, config.driver_name),
                pool=self.pool,
                boot_id=config.boot_id if config.boot_id is not None else current_boot_id(),
                metrics=self.metrics,
                fault_hook=fault_hook,
            )
        )
        self.registered = threading.Event()
        self.registration_error = ""
        self._stop = threading.Event()
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self._grpc_health: health.HealthServicer | None = None
        self._background: threading.Thread | None = None
        self._sockets: dict[Path, tuple[int, int]] = {}
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        for directory in (cfg.plugin_dir, cfg.state_dir):
            _make_private_dir(directory)
        cfg.registration_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.node.ldcache_hook = install_ldcache_hook(
                self._hooks_dir, host_python(cfg.driver_root, cfg.driver_root_host_path)
            )
            self.preparer.start()
            self._started = True
            self._dra_server = self._serve_dra()
            self._reg_server = self._serve_registration()
            self._background = threading.Thread(
                target=self._background_loop, name="plugin-duties", daemon=True
            )
            self._background.start()
        except BaseException:
            self.stop(grace_s=0)
            raise
        log.info(
            "kubelet plugin serving",
            extra={
                "version": __version__,
                "driver": cfg.driver_name,
                "node": cfg.node_name,
                "pod_uid": cfg.pod_uid,
                "registration_socket": str(cfg.registration_socket),
                "service_socket": str(cfg.service_socket),
                "gpus": len(self.inventory.gpus()),
            },
        )
        log_isolation_choice(self.inventory.gpus())

    def stop(self, grace_s: float = 2.0) -> None:
        """Leave the kubelet first (registration socket), then finish in-flight calls and clean up.

        The kubelet takes a vanished registration socket for the plugin's leaving and turns to the
        newest other registration of the driver (the new agent of a rolling update); the calls this
        agent is answering meanwhile finish, for at most `grace_s`, before its service socket goes.
        Only this agent's own sockets are removed. Idempotent, and safe after a failed start.
        """
        self._stop.set()  # ends the health streams, which would otherwise hold the server open
        self._unlink_own(self.config.registration_socket)
        if self._reg_server is not None:
            self._reg_server.stop(0).wait()
            self._reg_server = None
        if self._grpc_health is not None:
            self._grpc_health.enter_graceful_shutdown()
        if self._dra_server is not None:
            self._dra_server.stop(grace_s).wait()
            self._dra_server = None
        for path in list(self._sockets):
            self._unlink_own(path)
        if self._background is not None:
            self._background.join(timeout=grace_s + 5)
            self._background = None
        if self._started:
            self.preparer.close()
        self.lock.close()
        log.info("kubelet plugin stopped", extra={"driver": self.config.driver_name})

    def _unlink_own(self, path: Path) -> None:
        """Remove `path` if it is still the socket this agent bound (with fixed names, a newer agent
        may have taken the name over: its socket stays)."""
        identity = self._sockets.pop(path, None)
        if identity is None:
            return
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == identity:
                path.unlink()

    def __enter__(self) -> KubeletPlugin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- servers ---------------------------------------------------------------------------------------
    def _serve_dra(self) -> grpc.Server:
        path = self.config.service_socket
        _check_socket_path(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="dra"))
        dra_v1_grpc.add_DRAPluginServicer_to_server(DraV1Servicer(self.preparer), server)
        stream = DeviceHealthStream(
            self.inventory, self.pool, device_name, self._stop, heartbeat_s=self.config.health_heartbeat_s
        )
        health_v1_grpc.add_DRAResourceHealthServicer_to_server(DeviceHealthServicer(stream), server)
        health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            DeviceHealthV1alpha1Servicer(stream), server
        )
        self._grpc_health = health.HealthServicer()
        for service in ("", *(full_service_name(v) for v in SUPPORTED_VERSIONS)):
            self._grpc_health.set(service, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._grpc_health, server)
        self._listen(server, path)
        return server

    def _serve_registration(self) -> grpc.Server:
        path = self.config.registration_socket
        _check_socket_path(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="registration"))
        registration_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer(
                self.config.driver_name,
                str(self.config.service_socket),
                SUPPORTED_VERSIONS,
                on_status=self._on_registration,
            ),
            server,
        )
        self._listen(server, path)
        return server

    def _listen(self, server: grpc.Server, path: Path) -> None:
        """Serve on `path`, taking the name over atomically from a dead (or older) plugin.

        gRPC removes the path it bound when it stops, whatever is there by then. So it binds a
        private name (a dot-file, which the kubelet's plugin watcher ignores) that is then renamed to
        `path`: stopping this server later can never delete the socket of a newer plugin, and
        `stop()` unlinks `path` only while it is still this socket (inode pinned by the listener).
        """
        private = path.with_name(f".{path.name}.{os.getpid()}")
        _check_socket_path(private)
        with contextlib.suppress(FileNotFoundError):
            private.unlink()
        server.add_insecure_port(f"unix://{private}")
        server.start()
        os.chmod(private, 0o600)
        st = os.lstat(private)
        if path.exists():
            log.info("taking over the socket of a previous plugin instance", extra={"path": str(path)})
        os.replace(private, path)
        self._sockets[path] = (st.st_dev, st.st_ino)

    def _on_registration(self, registered: bool, error: str) -> None:
        self.registration_error = "" if registered else error
        self.metrics.registered.set(1 if registered else 0)
        if registered:
            self.registered.set()
        else:
            self.registered.clear()

    # -- background ------------------------------------------------------------------------------------
    def _background_loop(self) -> None:
        interval = self.config.supervise_interval_s
        since_gc = self.config.stale_claim_interval_s  # collect once right after start
        while True:
            try:
                if since_gc >= self.config.stale_claim_interval_s:
                    since_gc = 0.0
                    self.preparer.collect_stale()
                self.preparer.supervise()
            except Exception:
                log.exception("background duty failed; retrying later")
            if self._stop.wait(interval):
                return
            since_gc += interval

    def prepared_claims(self) -> dict[str, dict[str, bool]]:
        """Device -> claim -> whether it holds a share, from the checkpoint (claims prepared here).

        The publisher keeps a GPU's shareability while any of them (or any allocation) holds it.
        """
        held: dict[str, dict[str, bool]] = {}
        for entry in self.preparer.snapshot().claims.values():
            for device in entry.devices:
                if device.pool == self.pool:
                    claims = held.setdefault(device.device, {})
                    claims[entry.ref] = claims.get(entry.ref, False) or device.shareId is not None
            for share in entry.shares:
                claims = held.setdefault(share.device, {})
                claims[entry.ref] = claims.get(entry.ref, False) or share.shareId is not None
        return held
