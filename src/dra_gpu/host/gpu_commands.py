"""Every GPU-wide change the plugin makes goes through this one small interface, `GpuCommands`.

Time-slice intervals, compute modes and MPS control daemons are settings of the physical GPU, not of
a container, so the plugin changes them with NVIDIA's tools (`nvidia.py`: `NvidiaCommands`). Keeping
the calls behind ``GpuCommands`` lets tests and simulated nodes substitute ``SimulatedCommands``
(`simulated.py`), which runs nothing, records what was asked, keeps the resulting GPU state
(optionally in a file, so that it outlives a plugin process as a real GPU's settings do) and fails on
demand.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile

log = logging.getLogger(__name__)


DEFAULT_MPS_SHM_BYTES = 1 << 30
"""The size of an MPS daemon's /dev/shm where the node does not set one (`--mps-shm-size`)."""


class ComputeMode(StrEnum):
    DEFAULT = "DEFAULT"
    EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"


class CommandError(Exception):
    """A GPU command failed; the message names the command and what it printed."""


def mps_control_env(
    pipe_dir: Path, log_dir: Path, gpu: str | None = None, protocol: str | None = None
) -> dict[str, str]:
    """The environment `run_mps_control` gives the MPS control program: the daemon's pipe and log
    directories, and the GPU and protocol version where given."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if protocol is not None:
        env["CUDA_MPS_PROTOCOL_VERSION"] = protocol
    return env


class GpuCommands(Protocol):
    simulated: bool
    """True when nothing real is run (the log says so once at start)."""

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None: ...

    def set_timeslice(self, gpu_index: int, value: int) -> None:
        """`nvidia-smi compute-policy --set-timeslice`: 0 Default, 1 Short, 2 Medium, 3 Long."""
        ...

    def start_mps_daemon(self, gpu_uuid: str, pipe_dir: Path, log_dir: Path) -> None:
        """Start the control daemon for one GPU and return once it answers.

        Its /dev/shm is `pipe_dir.parent / "shm"`, the directory its clients mount as theirs.
        """
        ...

    def stop_mps_daemon(self, gpu_uuid: str, pipe_dir: Path) -> None:
        """Stop the daemon if it runs and release its /dev/shm; nothing to do is not an error."""
        ...

    def mps_daemon_running(self, gpu_uuid: str, pipe_dir: Path) -> bool: ...

    def mps_launcher(self, shm: Path) -> list[str]:
        """The argv prefix that starts an MPS control daemon outside the agent with `shm` (mounted as
        a tmpfs here) as its /dev/shm; for daemons another module starts (MPS v3)."""
        ...

    def release_mps_shm(self, shm: Path) -> None:
        """Unmount what `mps_launcher` mounted, once its daemon is gone."""
        ...

    def run_mps_control(
        self,
        pipe_dir: Path,
        log_dir: Path,
        args: Sequence[str],
        *,
        gpu: str | None = None,
        protocol: str | None = None,
        launcher: Sequence[str] = (),
    ) -> str:
        """Run the MPS control program with `args` against the daemon of `pipe_dir`; what it printed.

        The one way any MPS module drives a daemon (MPS v3's namespaces included), so each runs the
        driver root's program with the driver's libraries and tools, as `start_mps_daemon` does.
        `-d` with `launcher` (`mps_launcher`) starts a daemon outside the agent. CommandError on failure.
        """
        ...

    def create_mig_instance(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigInstance:
        """A GPU instance of `profile` at memory slice `start` with one compute instance spanning it."""
        ...

    def destroy_mig_instance(self, gpu: GpuInfo, instance: MigInstance) -> None:
        """Its compute instance, then its GPU instance; CommandError while a process uses it."""
        ...

    def mig_instances(self, gpu: GpuInfo) -> list[MigInstance]:
        """The instances on `gpu` now (uuid "" where the tool does not say it)."""
        ...

    def mig_minors_file(self) -> Path:
        """The driver's table of `/dev/nvidia-caps` minors (`gpu0/gi1/access 12` lines)."""
        ...
