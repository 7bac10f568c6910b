"""Every GPU-wide change the plugin makes goes through this one small interface.

Time-slice intervals, compute modes and MPS control daemons are settings of the physical GPU, not of
a container, so the plugin changes them with NVIDIA's tools. An MPS control daemon is started in a
session of its own (and, where configured, moved to a cgroup of its own), so it is no child of the
node agent: a restart, an upgrade or an OOM kill of the agent's container leaves it and its clients
running, and the next agent finds it through its pipe directory. Keeping the calls behind ``GpuCommands``
lets tests and simulated nodes substitute ``SimulatedCommands``, which runs nothing, records what
was asked, keeps the resulting GPU state (optionally in a file, so that it outlives a plugin
process as a real GPU's settings do) and fails on demand.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile, profile_memory, table_for
from dra_gpu.plugin.mig_commands import (
    MIG_MINORS,
    MigCommandError,
    instance_from_json,
    parse_created,
    parse_gpu_instances,
    parse_mig_uuids,
    simulated_create,
    simulated_mig_minors,
)

log = logging.getLogger(__name__)


DEFAULT_MPS_SHM_BYTES = 1 << 30
"""The size of an MPS daemon's /dev/shm where the node does not set one (`--mps-shm-size`)."""


STATE_KEYS = ("computeMode", "timeslice", "mps", "mig", "migInUse", "migSerial")
"""The simulated GPU state: the settings, MIG instances per GPU, busy instances, a UUID serial."""
SETTINGS = STATE_KEYS[:3]
"""Always in a snapshot; the MIG keys only once there is something in them."""


class ComputeMode(StrEnum):
    DEFAULT = "DEFAULT"
    EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"


class CommandError(Exception):
    """A GPU command failed; the message names the command and what it printed."""


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
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if protocol is not None:
            env["CUDA_MPS_PROTOCOL_VERSION"] = protocol
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


class SimulatedCommands:
    """Stands in for nvidia-smi and the MPS control daemon where there is no GPU.

    It keeps the state the real commands would leave on the GPUs: compute mode per GPU UUID,
    time-slice value per GPU index, and which GPUs have a running control daemon. Settings equal to
    the driver's defaults are not stored, so an untouched node has an empty state. With
    ``state_file`` the state is re-read before and written after every call, so it survives a
    plugin restart. ``fail`` maps an operation name (``set_compute_mode``, ``set_timeslice``,
    ``start_mps_daemon``, ``stop_mps_daemon``, ``create_mig_instance``, ``destroy_mig_instance``) to the
    error message it should raise. MIG instances are a table per GPU that refuses what the driver
    refuses; ``set_mig_in_use`` stands for a process running on an instance.
    """

    simulated = True

    def __init__(
        self,
        state_file: Path | None = None,
        fail: Mapping[str, str] | None = None,
        control_program: str | None = None,
    ) -> None:
        self.state_file = state_file
        self.control_program = control_program
        """A stand-in for `nvidia-cuda-mps-control` that `run_mps_control` runs (tests' MPS v3 fake)."""
        self.fail: dict[str, str] = dict(fail or {})
        self.calls: list[tuple[str, ...]] = []
        self._lock = threading.Lock()
        self._state: dict[str, dict[str, Any]] = {k: {} for k in STATE_KEYS}

    # -- state -----------------------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_file is None:
            return
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            data = {}
        except ValueError:
            log.warning(
                "simulated GPU state unreadable, starting clean", extra={"path": str(self.state_file)}
            )
            data = {}
        self._state = {key: dict(data.get(key) or {}) for key in STATE_KEYS}

    def _save(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_file.parent, prefix=".simulated-gpus.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self._state, f, sort_keys=True)
            os.replace(tmp, self.state_file)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        if self.state_file is None:
            yield
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.state_file.with_name(f".{self.state_file.name}.lock"), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The GPU-wide state now: `{"computeMode": {...}, "timeslice": {...}, "mps": {...}}`, plus
        `mig` (instances per GPU) and `migInUse` where not empty."""
        with self._lock:
            self._load()
            shown = {k: v for k, v in self._state.items() if k in SETTINGS or (v and k != "migSerial")}
            return json.loads(json.dumps(shown))  # type: ignore[no-any-return]

    def _do(self, op: str, *args: str, change: Callable[[], None] | None = None) -> None:
        with self._lock:
            self.calls.append((op, *args))
            log.debug("simulated GPU command (nothing is run)", extra={"op": op, "argv": list(args)})
            if op in self.fail:
                raise CommandError(self.fail[op])
            if change is not None:
                with self._file_lock():  # two plugin processes change different GPUs at once
                    self._load()
                    change()
                    self._save()

    # -- GpuCommands -----------------------------------------------------------------------------
    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        def change() -> None:
            if mode == ComputeMode.DEFAULT:
                self._state["computeMode"].pop(gpu_uuid, None)
            else:
                self._state["computeMode"][gpu_uuid] = mode.value

        self._do("set_compute_mode", gpu_uuid, mode.value, change=change)

    def set_timeslice(self, gpu_index: int, value: int) -> None:
        if value not in (0, 1, 2, 3):
            raise CommandError(f"nvidia-smi: invalid time-slice value {value} (use 0 to 3)")

        def change() -> None:
            if value == 0:
                self._state["timeslice"].pop(str(gpu_index), None)
            else:
                self._state["timeslice"][str(gpu_index)] = value

        self._do("set_timeslice", str(gpu_index), str(value), change=change)

    def start_mps_daemon(self, gpu_uuid: str, pipe_dir: Path, log_dir: Path) -> None:
        def change() -> None:
            if self._state["computeMode"].get(gpu_uuid) != ComputeMode.EXCLUSIVE_PROCESS.value:
                log.warning(
                    "simulated MPS daemon started outside exclusive-process mode", extra={"gpu": gpu_uuid}
                )
            self._state["mps"][gpu_uuid] = str(pipe_dir)

        self._do("start_mps_daemon", gpu_uuid, str(pipe_dir), str(log_dir), change=change)

    def stop_mps_daemon(self, gpu_uuid: str, pipe_dir: Path) -> None:
        self._do(
            "stop_mps_daemon", gpu_uuid, str(pipe_dir), change=lambda: self._state["mps"].pop(gpu_uuid, None)
        )

    def mps_daemon_running(self, gpu_uuid: str, pipe_dir: Path) -> bool:
        with self._lock:
            self._load()
            return self._state["mps"].get(gpu_uuid) == str(pipe_dir)

    def mps_launcher(self, shm: Path) -> list[str]:
        return []  # nothing to isolate: no daemon of its own runs

    def release_mps_shm(self, shm: Path) -> None:
        return None

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
        """Through `control_program` (a stand-in for the MPS control program), as the real one would
        be run; without one, simulated GPUs have no MPS control daemon to drive."""
        self.calls.append(("run_mps_control", str(pipe_dir), *args))
        if self.control_program is None:
            raise CommandError("simulated GPUs have no MPS control daemon (no control program given)")
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if protocol is not None:
            env["CUDA_MPS_PROTOCOL_VERSION"] = protocol
        argv = [self.control_program, *args]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            text = (done.stderr or done.stdout or "").strip() or "no output"
            raise CommandError(f"`{' '.join(argv)}` failed with exit code {done.returncode}: {text}")
        return done.stdout

    def kill_mps_daemon(self, gpu_uuid: str) -> None:
        """What a crashed daemon looks like (tests): it is simply no longer running."""
        with self._lock:
            self._load()
            self._state["mps"].pop(gpu_uuid, None)
            self._save()

    # -- MIG ---------------------------------------------------------------------------------------
    def _live(self, gpu_uuid: str) -> list[MigInstance]:
        return [instance_from_json(d) for d in self._state["mig"].get(gpu_uuid, [])]

    def create_mig_instance(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigInstance:
        made: list[MigInstance] = []

        def change() -> None:
            serial = int(self._state["migSerial"].get("next", 0))
            try:
                instance = simulated_create(gpu, profile, start, self._live(gpu.uuid), serial)
            except MigCommandError as exc:
                raise CommandError(f"nvidia-smi mig -cgi {profile.profile_id}:{start}: {exc}") from None
            self._state["migSerial"]["next"] = serial + 1
            self._state["mig"].setdefault(gpu.uuid, []).append(instance.to_json())
            made.append(instance)

        self._do("create_mig_instance", gpu.uuid, profile.name, str(start), change=change)
        return made[0]

    def destroy_mig_instance(self, gpu: GpuInfo, instance: MigInstance) -> None:
        def change() -> None:
            live = self._state["mig"].get(gpu.uuid, [])
            kept = [d for d in live if int(d["giId"]) != instance.gi_id]
            if len(kept) == len(live):
                raise CommandError(
                    f"nvidia-smi mig -dgi: GPU {gpu.uuid} has no GPU instance {instance.gi_id}"
                )
            gone = next(d for d in live if int(d["giId"]) == instance.gi_id)
            if self._state["migInUse"].get(gone["uuid"]):
                raise CommandError(
                    f"nvidia-smi mig -dci: compute instance {instance.ci_id} of GPU instance "
                    f"{instance.gi_id} on {gpu.uuid} is in use by another client"
                )
            self._state["mig"][gpu.uuid] = kept

        self._do("destroy_mig_instance", gpu.uuid, str(instance.gi_id), change=change)

    def mig_instances(self, gpu: GpuInfo) -> list[MigInstance]:
        with self._lock:
            self._load()
            return self._live(gpu.uuid)

    def set_mig_in_use(self, mig_uuid: str, in_use: bool) -> None:
        """A process starts or stops on an instance (tests)."""
        with self._lock, self._file_lock():
            self._load()
            if in_use:
                self._state["migInUse"][mig_uuid] = True
            else:
                self._state["migInUse"].pop(mig_uuid, None)
            self._save()

    def mig_minors_file(self) -> Path:
        base = self.state_file.parent if self.state_file is not None else Path(tempfile.gettempdir())
        path = base / "simulated-mig-minors"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(simulated_mig_minors())
        return path
