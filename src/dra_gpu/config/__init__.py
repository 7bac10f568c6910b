"""The driver's configuration: the claim API (`GpuConfig`), the node's `--sharing` setting and the
controller's placement, each in its own module; every name is re-exported here."""

from dra_gpu.config.base import ConfigError
from dra_gpu.config.claim import (
    ComputeConfig,
    GpuConfig,
    LimiterConfig,
    MpsConfig,
    Sharing,
    Strategy,
    TimeSlicingConfig,
    Watchdog,
    WatchdogPolicy,
    json_schema,
    merge_configs,
    parse_gpu_config,
)
from dra_gpu.config.node import GpuSharingMode, NodeSharing
from dra_gpu.config.placement import Placement, PlacementPolicy
from dra_gpu.limiter_abi.limits import Priority

__all__ = [
    "ComputeConfig",
    "ConfigError",
    "GpuConfig",
    "GpuSharingMode",
    "LimiterConfig",
    "MpsConfig",
    "NodeSharing",
    "Placement",
    "PlacementPolicy",
    "Priority",
    "Sharing",
    "Strategy",
    "TimeSlicingConfig",
    "Watchdog",
    "WatchdogPolicy",
    "json_schema",
    "merge_configs",
    "parse_gpu_config",
]
