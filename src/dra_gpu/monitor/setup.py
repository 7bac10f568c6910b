"""Builds the node agent's monitor from its configuration and starts it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from dra_gpu.inventory import Inventory
from dra_gpu.kube import KubeAPI
from dra_gpu.monitor.metrics import MonitorCollector
from dra_gpu.monitor.monitor import Monitor, PreparedClaims
from dra_gpu.monitor.nvml_usage import NvmlSampler
from dra_gpu.monitor.pods import PodDirectory
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.watchdog import Watchdog

log = logging.getLogger(__name__)


def _sampler(inventory: Inventory, nvml: Any) -> NvmlSampler | None:
    if nvml is None and inventory.backend != "nvml":
        return None  # simulated GPUs: the limiter's regions are the only figures
    try:
        if nvml is None:
            import pynvml

            nvml = pynvml
        return NvmlSampler(nvml)
    except Exception as exc:  # the inventory opened NVML; failing here only costs the per-process figures
        log.warning("NVML per-process figures are unavailable", extra={"error": str(exc)})
        return None


@dataclass(frozen=True)
class MonitorConfig:
    """What the monitor needs of the node agent's configuration."""

    node_name: str
    claims_dir: Path
    """The plugin's per-claim state directories (the limiter's regions)."""
    interval_s: float
    """Usage sampling and watchdog interval."""
    watch_interval_s: float = 1.0
    """How often memory is watched: floors published, caps and the limiter's presence checked."""
    proc_root: Path = Path("/proc")
    """The host's /proc (the agent runs with hostPID), for mapping GPU processes to pods."""
    context_allowance: int | None = None
    """Bytes NVML may count per process beyond the limiter's charges; None: the watchdog's default."""
    grace_s: float | None = None
    """Seconds between the watchdog's SIGTERM and SIGKILL; None: the watchdog's default."""
    cgroup_root: Path = Path("/sys/fs/cgroup")
    """The host's cgroup mount, where a claim over its compute ceiling has its containers frozen."""
    limiter_library: Path | None = None
    """The limiter library the plugin mounts into containers: a process has the limiter if it mapped this file."""


def start_monitor(
    config: MonitorConfig,
    api: KubeAPI,
    inventory: Inventory,
    registry: CollectorRegistry,
    prepared: PreparedClaims,
    nvml: Any = None,
) -> Monitor:
    """`prepared`: the claims prepared on this node (the node agent reads them from its preparer)."""
    proc = ProcReader(config.proc_root)
    watchdog = Watchdog(api, config.node_name, proc)
    if config.grace_s is not None:
        watchdog.grace_s = config.grace_s
    monitor = Monitor(
        prepared=prepared,
        claims_dir=config.claims_dir,
        gpus=lambda: [g.uuid for g in inventory.gpus()],
        pods=PodDirectory(api, config.node_name, min_refresh_s=config.interval_s),
        watchdog=watchdog,
        sampler=_sampler(inventory, nvml),
        proc=proc,
        interval_s=config.interval_s,
        watch_interval_s=config.watch_interval_s,
        cgroup_root=config.cgroup_root,
        limiter_library=config.limiter_library,
    )
    if config.context_allowance is not None:
        monitor.context_allowance = config.context_allowance
    collector = MonitorCollector(monitor)
    registry.register(collector)
    monitor.start()
    monitor.on_stop = lambda: registry.unregister(collector)  # a restarted agent registers anew
    return monitor
