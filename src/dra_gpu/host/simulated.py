"""The GPU commands where there is no GPU: `SimulatedCommands` keeps the state the real commands would
leave (see its docstring), for tests, the demo and simulated nodes.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu.host.gpu_commands import CommandError, ComputeMode, mps_control_env
from dra_gpu.host.mig_commands import (
    MigCommandError,
    instance_from_json,
    simulated_create,
    simulated_mig_minors,
)
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile

log = logging.getLogger(__name__)


STATE_KEYS = ("computeMode", "timeslice", "mps", "mig", "migInUse", "migSerial")
"""The simulated GPU state: the settings, MIG instances per GPU, busy instances, a UUID serial."""
SETTINGS = STATE_KEYS[:3]
"""Always in a snapshot; the MIG keys only once there is something in them."""


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
        env = {**os.environ, **mps_control_env(pipe_dir, log_dir, gpu, protocol)}
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
