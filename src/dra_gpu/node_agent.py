"""The node agent, wired in one place: the kubelet plugin, the HTTP endpoint, the usage monitor and
the slice publisher, built from the node agent's configuration.

`dra-gpu kubelet-plugin` runs it on every GPU node; the local demo and the tests run it in-process
with any `KubeAPI`.

During a rolling update two agents run on a node (docs/upgrades.md): both answer the kubelet (the
claims' locks keep them off each other's claims), but only the holder of the node's publisher lock
publishes the ResourceSlices; the other takes the lock over, and the publishing, when it leaves.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dra_gpu.config import NodeSharing
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.http_endpoint import HttpServer
from dra_gpu.inventory import Inventory
from dra_gpu.kube import KubeAPI
from dra_gpu.kube.reviews import PathAccess
from dra_gpu.monitor import Monitor, MonitorConfig, start_monitor
from dra_gpu.plugin import KubeletPlugin, PluginConfig
from dra_gpu.plugin.health import HealthProbe, StateDirCheck
from dra_gpu.plugin.holdings import prepared_holdings
from dra_gpu.plugin.locking import LeaderLock
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.preparer_core import FaultHook
from dra_gpu.slices.publisher import SlicePublisher

log = logging.getLogger(__name__)

PUBLISHER_LOCK_NAME = "slice-publisher.lock"
"""In the state directory: held by the one agent of the node that publishes its ResourceSlices."""
LEADER_POLL_S = 0.5
"""How often an agent not publishing tries the publisher lock (the other's leaving frees it)."""


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one, as Go programs do at start; (before, after).

    A container gets a soft limit of 1,024 from containerd and a much higher hard one: each claim's
    call, connection and GPU lock takes files, and the soft limit is what they run out of first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or soft == resource.RLIM_INFINITY:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning(
            "could not raise the open-file limit", extra={"soft": soft, "hard": hard, "error": str(exc)}
        )
        return soft, soft
    log.info("raised the open-file limit", extra={"from": soft, "to": hard})
    return soft, hard


@dataclass
class NodeAgentConfig(PluginConfig):
    """The plugin's configuration, and what the agent runs beside it."""

    http_address: str | None = None
    """HOST:PORT serving /healthz, /livez, /readyz and /metrics; None: no HTTP endpoint."""
    metrics_auth: bool = False
    """Serve /metrics only to bearer tokens the API server allows to get it (`dra_gpu.kube.reviews`)."""
    monitor_interval_s: float = 5.0
    """Usage sampling and watchdog interval (`dra_gpu.monitor`); 0 turns the monitor off."""
    monitor_watch_interval_s: float = 1.0
    """How often memory is watched (floors, caps, the limiter's presence); at most `monitor_interval_s`."""
    watchdog_context_allowance: int | None = None
    """Bytes NVML may count per process beyond the limiter's charges; None: the watchdog's default."""
    watchdog_grace_s: float | None = None
    """Seconds between the watchdog's SIGTERM and SIGKILL; None: the watchdog's default."""
    proc_root: Path = Path("/proc")
    """The host's /proc (the agent runs with hostPID), for mapping GPU processes to pods."""
    cgroup_root: Path = Path("/sys/fs/cgroup")
    """The host's cgroup mount, where a claim over its compute ceiling has its containers frozen."""

    def monitor_config(self) -> MonitorConfig:
        return MonitorConfig(
            node_name=self.node_name,
            claims_dir=self.state_dir / "claims",
            interval_s=self.monitor_interval_s,
            watch_interval_s=min(self.monitor_watch_interval_s, self.monitor_interval_s),
            proc_root=self.proc_root,
            cgroup_root=self.cgroup_root,
            context_allowance=self.watchdog_context_allowance,
            grace_s=self.watchdog_grace_s,
            limiter_library=self.limiter_library,
        )


class NodeAgent:
    """Everything the node agent runs. `start()` starts it all; `stop()` stops it all, plugin first."""

    def __init__(
        self,
        config: NodeAgentConfig,
        api: KubeAPI,
        inventory: Inventory,
        commands: GpuCommands | None = None,
        *,
        sharing: NodeSharing | None = None,
        publish_slices: bool = False,
        metrics: PluginMetrics | None = None,
        fault_hook: FaultHook | None = None,
        nvml: ModuleType | None = None,
    ) -> None:
        self.config = config
        self.api = api
        self.inventory = inventory
        self.sharing = sharing or NodeSharing.parse("*=Shared")
        self.publish_slices = publish_slices
        self.nvml = nvml
        """The pynvml module for the usage monitor (tests pass a fake); None: pynvml on NVML nodes."""
        self.plugin = KubeletPlugin(config, api, inventory, commands, metrics=metrics, fault_hook=fault_hook)
        self.monitor: Monitor | None = None
        self._http: HttpServer | None = None
        self._health = HealthProbe(
            config.registration_socket,
            config.service_socket,
            busy=self.plugin.preparer.busy,
            problems=(StateDirCheck(config.state_dir).check, self.plugin.preparer.stalled),
        )
        """The sockets' and the state directory's health, probed in the background so that /healthz
        never waits on them, nor on the kubelet's calls."""
        self._publisher: SlicePublisher | None = None
        self._publisher_lock = LeaderLock(config.state_dir / PUBLISHER_LOCK_NAME)
        self._leader_stop = threading.Event()
        self._leader_wait: threading.Thread | None = None

    def start(self) -> None:
        raise_open_file_limit()
        self.plugin.start()
        try:
            self._health.start()
            if self.config.http_address:
                self._http = HttpServer(
                    self.config.http_address,
                    self.plugin.metrics.registry,
                    {"/healthz": self.healthz, "/livez": self.healthz, "/readyz": self.healthz},
                    authorize=PathAccess(self.api).check if self.config.metrics_auth else None,
                )
                self._http.start()
            if self.config.monitor_interval_s > 0:
                self.monitor = start_monitor(
                    self.config.monitor_config(),
                    self.api,
                    self.inventory,
                    self.plugin.metrics.registry,
                    prepared_holdings(self.plugin.preparer.snapshot),
                    self.nvml,
                )
            if self.publish_slices and not self._lead():
                log.info(
                    "another agent on this node publishes its ResourceSlices; taking over when it leaves",
                    extra={"lock": str(self._publisher_lock.path)},
                )
                self._leader_stop.clear()
                self._leader_wait = threading.Thread(
                    target=self._wait_to_lead, name="slices-leader", daemon=True
                )
                self._leader_wait.start()
        except BaseException:
            self.stop(grace_s=0)
            raise

    def _lead(self) -> bool:
        """Publish the slices if this agent can take the publisher lock; whether it publishes."""
        if not self._publisher_lock.try_acquire():
            return False
        publisher = SlicePublisher(
            self.api,
            self.config.node_name,
            self.inventory,
            self.sharing,
            driver=self.config.driver_name,
            prepared_claims=self.plugin.prepared_claims,
        )
        publisher.start()
        self._publisher = publisher
        self.plugin.metrics.publishing.set(1)
        log.info("publishing this node's ResourceSlices", extra={"node": self.config.node_name})
        return True

    def _wait_to_lead(self) -> None:
        while not self._leader_stop.wait(LEADER_POLL_S):
            try:
                if self._lead():
                    return
            except Exception:
                log.exception("could not take over publishing the ResourceSlices; retrying")

    @property
    def publishing(self) -> bool:
        """Whether this agent publishes the node's ResourceSlices (it holds the publisher lock)."""
        return self._publisher is not None

    def stop(self, grace_s: float = 2.0) -> None:
        """Leave the kubelet first (the plugin), then stop the rest. Idempotent, and safe after a failed start."""
        self.plugin.stop(grace_s)
        self._leader_stop.set()
        if self._leader_wait is not None:
            self._leader_wait.join()
            self._leader_wait = None
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                self._publisher.stop()
            self._publisher = None
            self.plugin.metrics.publishing.set(0)
        self._publisher_lock.release()  # the other agent of a rolling update publishes from now on
        if self._http is not None:
            self._http.stop()
            self._http = None
        self._health.stop()
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None

    def __enter__(self) -> NodeAgent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http is not None else None

    def healthz(self) -> tuple[bool, str]:
        """Unhealthy while the agent cannot do its job: the monitor or the slice publisher stalled, a
        socket not answering, the state directory not writable or full, the kubelet's calls stuck.
        Answered from what the agent's own loops found last; never waits (`HealthProbe`)."""
        stalled = self.monitor.stalled() if self.monitor is not None else None
        if stalled is None and self._publisher is not None:
            stalled = self._publisher.stuck()
        return (False, stalled) if stalled else self._health.check()
