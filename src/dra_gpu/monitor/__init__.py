"""Who uses what on this node's GPUs: NVML per-process figures and the limiter's per-claim regions,
mapped to claims, pods and containers; Prometheus series; the watchdog for processes that escape."""

from dra_gpu.monitor.metrics import METRICS, MonitorCollector
from dra_gpu.monitor.monitor import DEFAULT_INTERVAL_S, ClaimHoldings, Monitor, PreparedClaims
from dra_gpu.monitor.nvml_usage import NvmlSampler
from dra_gpu.monitor.pods import PodDirectory
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.setup import MonitorConfig, start_monitor
from dra_gpu.monitor.watchdog import Watchdog

__all__ = [
    "DEFAULT_INTERVAL_S",
    "METRICS",
    "ClaimHoldings",
    "Monitor",
    "MonitorCollector",
    "MonitorConfig",
    "NvmlSampler",
    "PodDirectory",
    "PreparedClaims",
    "ProcReader",
    "Watchdog",
    "start_monitor",
]
