"""The real GPU commands: `nvidia-smi` and `nvidia-cuda-mps-control` from the node's driver.

An MPS control daemon is started in a session of its own (and, where configured, moved to a cgroup of
its own), so it is no child of the node agent: a restart, an upgrade or an OOM kill of the agent's
container leaves it and its clients running, and the next agent finds it through its pipe directory.
`make gpu-check` loads this file by its path (`gpucheck/agent.py`) and reads `NvidiaCommands`,
`CommandError` and `ComputeMode` from it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dra_gpu.host.gpu_commands import DEFAULT_MPS_SHM_BYTES, CommandError, ComputeMode, mps_control_env
from dra_gpu.host.mig_commands import (
    MIG_MINORS,
    MigCommandError,
    parse_created,
    parse_gpu_instances,
    parse_mig_uuids,
)
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile, profile_memory, table_for

log = logging.getLogger(__name__)


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class NvidiaCommands:
    """The real thing: `nvidia-smi` and `nvidia-cuda-mps-control` from the node's driver."""

    simulated = False

    def __init__(
        self,
        nvidia_smi: str = "nvidia-smi",
        mps_control: str = "nvidia-cuda-mps-control",
        timeout_s: float = 30.0,
        start_wait_s: float = 10.0,
        runner: Runner = subprocess.run,
        tool_env: Mapping[str, str] | None = None,
        isolate_shm: bool = False,
        mps_shm_bytes: int = DEFAULT_MPS_SHM_BYTES,
        mps_cgroup: Path | None = None,
        mig_minors: Path = Path("/") / MIG_MINORS,
    ) -> None:
        """With `isolate_shm`, the GPU's `<mps dir>/shm` is a tmpfs of `mps_shm_bytes` (memory, not
        the node's disk, and bounded), and the MPS daemon runs in its own mount namespace with that
        tmpfs as its /dev/shm; every MPS client of the GPU mounts the same tmpfs as its /dev/shm
        (needs CAP_SYS_ADMIN, which the node agent has where it drives real GPUs). With
        `mps_cgroup` (a cgroup-v2 directory, created if missing), the daemon runs in that cgroup, so
        its memory and CPU are not charged to the agent's container and a kill of that container's
        cgroup does not reach it.
        """
        self.tool_env = dict(tool_env or {})
        """Environment the driver's tools need (e.g. to find the driver's libraries under its root)."""
        self.isolate_shm = isolate_shm
        self.mps_shm_bytes = mps_shm_bytes
        self.mps_cgroup = mps_cgroup
        self.mig_minors = mig_minors
        self.nvidia_smi = nvidia_smi
        self.mps_control = mps_control
        self.timeout_s = timeout_s
        self.start_wait_s = start_wait_s
        self._run_process = runner

    def _run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        output: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run to completion; with `output`, stdout and stderr go to that file instead of pipes, and
        the command starts a session of its own.

        A command that leaves a daemon behind must not get pipes: the daemon would inherit them and
        reading them would never end. Nor may it share the agent's session and process group: a
        signal to those (a terminal's, a process supervisor's) must not reach the daemon.
        """
        full_env = {**os.environ, **self.tool_env, **(env or {})} if env or self.tool_env else None
        shown = " ".join(argv)
        try:
            if output is None:
                return self._run_process(
                    list(argv),
                    env=full_env,
                    input=stdin,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    check=False,
                )
            with open(output, "w") as sink:
                done = self._run_process(
                    list(argv),
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=self.timeout_s,
                    check=False,
                    start_new_session=True,
                )
            done.stdout = output.read_text(errors="replace")
            return done
        except FileNotFoundError:
            raise CommandError(
                f"{argv[0]} was not found: the NVIDIA driver's tools must be on the plugin's PATH "
                "(mount the driver root into the plugin container)"
            ) from None
        except subprocess.TimeoutExpired:
            raise CommandError(f"`{shown}` did not finish within {self.timeout_s:g}s") from None

    def _check(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        output: Path | None = None,
    ) -> str:
        done = self._run(argv, env, stdin, output)
        if done.returncode != 0:
            text = (done.stderr or done.stdout or "").strip() or "no output"
            raise CommandError(f"`{' '.join(argv)}` failed with exit code {done.returncode}: {text}")
        return done.stdout or ""

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self._check([self.nvidia_smi, "-i", gpu_uuid, "-c", mode.value])

    def set_timeslice(self, gpu_index: int, value: int) -> None:
        self._check([self.nvidia_smi, "compute-policy", "-i", str(gpu_index), "--set-timeslice", str(value)])

    @staticmethod
    def _mps_env(gpu_uuid: str, pipe_dir: Path, log_dir: Path | None = None) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": gpu_uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
        if log_dir is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
        return env

    def _mount_shm(self, shm: Path) -> None:
        if os.path.ismount(shm):
            return  # a daemon's tmpfs from before an agent restart: its clients still use it
        options = f"size={self.mps_shm_bytes},mode=1777,nosuid,nodev,noexec"
        self._check(["mount", "-t", "tmpfs", "-o", options, "dra-gpu-mps-shm", str(shm)])

    def _unmount_shm(self, shm: Path) -> None:
        if os.path.ismount(shm):
            # Lazy: a client that still has it open keeps its view; nobody new can attach.
            self._check(["umount", "--lazy", str(shm)])

    def _cgroup_procs(self) -> Path | None:
        if self.mps_cgroup is None:
            return None
        try:
            self.mps_cgroup.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot create the MPS daemons' cgroup {self.mps_cgroup}: {exc}") from None
        return self.mps_cgroup / "cgroup.procs"

    def mps_launcher(self, shm: Path) -> list[str]:
        argv: list[str] = []
        procs = self._cgroup_procs()
        if procs is not None:
            # The launcher joins the cgroup before it execs: the daemon it forks is born there.
            argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]
        if self.isolate_shm:
            self._mount_shm(shm)
            script = 'mount --bind "$0" /dev/shm && exec "$@"'
            argv += ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(shm)]
        return argv

    def release_mps_shm(self, shm: Path) -> None:
        if self.isolate_shm:
            self._unmount_shm(shm)

    def start_mps_daemon(self, gpu_uuid: str, pipe_dir: Path, log_dir: Path) -> None:
        argv = [*self.mps_launcher(pipe_dir.parent / "shm"), self.mps_control, "-d"]
        self._check(
            argv,
            self._mps_env(gpu_uuid, pipe_dir, log_dir),
            output=log_dir / "control-start.out",
        )
        deadline = time.monotonic() + self.start_wait_s
        while not self.mps_daemon_running(gpu_uuid, pipe_dir):
            if time.monotonic() >= deadline:
                raise CommandError(
                    f"the MPS control daemon for {gpu_uuid} started but does not answer on {pipe_dir} "
                    f"after {self.start_wait_s:g}s; see its log in {log_dir}"
                )
            time.sleep(0.1)

    def stop_mps_daemon(self, gpu_uuid: str, pipe_dir: Path) -> None:
        if self.mps_daemon_running(gpu_uuid, pipe_dir):
            self._check([self.mps_control], self._mps_env(gpu_uuid, pipe_dir), stdin="quit\n")
        self.release_mps_shm(pipe_dir.parent / "shm")

    def mps_daemon_running(self, gpu_uuid: str, pipe_dir: Path) -> bool:
        # The control client exits non-zero when no daemon listens on the pipe directory.
        done = self._run([self.mps_control], self._mps_env(gpu_uuid, pipe_dir), stdin="get_server_list\n")
        return done.returncode == 0

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
        env = mps_control_env(pipe_dir, log_dir, gpu, protocol)
        argv = [*launcher, self.mps_control, *args]
        if "-d" in args:  # leaves a daemon behind: no pipes, a session of its own
            return self._check(argv, env, output=log_dir / "control-start.out")
        return self._check(argv, env, stdin="")

    def _mig_uuids(self, gpu: GpuInfo) -> set[str]:
        return set(parse_mig_uuids(self._check([self.nvidia_smi, "-L", "-i", gpu.uuid])))

    def create_mig_instance(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigInstance:
        before = self._mig_uuids(gpu)
        out = self._check(
            [self.nvidia_smi, "mig", "-i", gpu.uuid, "-cgi", f"{profile.profile_id}:{start}", "-C"]
        )
        try:
            gi, ci = parse_created(out)
        except MigCommandError as exc:
            raise CommandError(str(exc)) from None
        made = sorted(self._mig_uuids(gpu) - before)
        if len(made) != 1:
            raise CommandError(
                f"created MIG {profile.name} at slice {start} on {gpu.uuid} (GPU instance {gi}), but "
                f"nvidia-smi -L lists {len(made)} new MIG devices instead of one"
            )
        return MigInstance(
            made[0], gpu.uuid, profile.name, start, profile.memory_slices, gi, ci,
            profile_memory(profile, gpu),
        )  # fmt: skip

    def destroy_mig_instance(self, gpu: GpuInfo, instance: MigInstance) -> None:
        gi = str(instance.gi_id)
        self._check([self.nvidia_smi, "mig", "-i", gpu.uuid, "-gi", gi, "-ci", str(instance.ci_id), "-dci"])
        self._check([self.nvidia_smi, "mig", "-i", gpu.uuid, "-gi", gi, "-dgi"])

    def mig_instances(self, gpu: GpuInfo) -> list[MigInstance]:
        table = table_for(gpu.product_name, gpu.memory_bytes)
        found = []
        for name, _profile_id, gi, start in parse_gpu_instances(
            self._check([self.nvidia_smi, "mig", "-lgi", "-i", gpu.uuid])
        ):
            profile = table.find(name) if table else None
            size = profile.memory_slices if profile else 1
            memory = profile_memory(profile, gpu) if profile else 0
            found.append(MigInstance("", gpu.uuid, name, start, size, gi, 0, memory))
        return found

    def mig_minors_file(self) -> Path:
        return self.mig_minors
