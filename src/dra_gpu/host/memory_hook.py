"""The memory-limit hook's logic: what `dra-gpu cdi-hook` does for the driver's memory limits.

`set_memory_limits` runs at `createRuntime`: the container's process exists and sits in its own
cgroup, the workload has not started. It finds the process's cgroup-v2 leaf from
/proc/<pid>/cgroup, and sets each GPU's soft limit (the claim's request) and hard limit (its
ceiling) there through NVML. It records what it set in the claim's record directory, so that
`clear_recorded` (from the `poststop` hook, and from the plugin's unprepare) can clear the soft
limits again. Failures are `HookError`s carrying the hook's exit code.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu.host.dmem_cgroup import CgroupError, leaf_of_pid, regions_holding, release_ancestors
from dra_gpu.inventory.memory_limits import clear_limits, load_nvml, set_limits
from dra_gpu.quantity import format_quantity

EXIT_BAD_INPUT = 2
EXIT_KERNEL = 3
"""The cgroup layout cannot carry the limit (no cgroup v2, the container's cgroup is missing)."""
EXIT_DRIVER = 4
"""The driver cannot (older than 615, no permission, MIG, no memory accounting)."""

PROC_ROOT_ENV = "DRA_GPU_PROC_ROOT"


class HookError(Exception):
    """A hook failure: one line for stderr, and the exit code that makes the runtime refuse the container."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class GpuLimit:
    uuid: str
    soft: int
    hard: int


def read_state(stream: Any) -> dict[str, Any]:
    try:
        state = json.load(stream)
    except ValueError as exc:
        raise HookError(f"the OCI state on stdin is not JSON: {exc}", EXIT_BAD_INPUT) from None
    if not isinstance(state, dict) or not isinstance(state.get("id"), str) or not state["id"]:
        raise HookError(
            "the OCI state on stdin has no container id; run this only as an OCI hook", EXIT_BAD_INPUT
        )
    return state


def _nvml_error(nvml: Any, exc: BaseException, gpu: str, what: str) -> HookError:
    code = getattr(exc, "value", None)
    names = {getattr(nvml, n, None): n for n in dir(nvml) if n.startswith("NVML_ERROR_")}
    name = names.get(code, f"NVML error {code}")
    hints = {
        "NVML_ERROR_FUNCTION_NOT_FOUND": "the driver has no per-cgroup memory limits (needs release 615 or later)",
        "NVML_ERROR_NO_PERMISSION": "setting memory limits needs root (CAP_SYS_ADMIN) in the runtime's namespace",
        "NVML_ERROR_NOT_SUPPORTED": "this GPU or cgroup cannot carry a memory limit (MIG mode, or no dmem/misc "
        "memory accounting for this cgroup)",
        "NVML_ERROR_INVALID_ARGUMENT": "the driver refused the values or the cgroup path",
        "NVML_ERROR_NOT_FOUND": "the GPU is not on this node",
    }
    hint = hints.get(name, "see the driver log")
    return HookError(f"{what} for GPU {gpu} failed: {exc} ({name}); {hint}", EXIT_DRIVER)


def _open_nvml() -> Any:
    try:
        nvml = load_nvml()
        nvml.nvmlInit()
    except ImportError as exc:
        raise HookError(f"cannot load the NVML binding: {exc}", EXIT_DRIVER) from None
    except Exception as exc:
        raise HookError(f"NVML is not available: {exc}", EXIT_DRIVER) from None
    return nvml


def _record_path(record_dir: Path, container_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in container_id)
    return record_dir / f"{safe}.json"


def _write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".record.", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(tmp, path)


def set_memory_limits(
    state: dict[str, Any], limits: list[GpuLimit], record_dir: Path, cgroups: Path, proc: Path
) -> Path:
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        raise HookError(
            "the OCI state has no container pid; register this hook at createRuntime", EXIT_BAD_INPUT
        )
    try:
        leaf = leaf_of_pid(pid, proc, cgroups)
    except CgroupError as exc:
        raise HookError(str(exc), EXIT_KERNEL) from None
    nvml = _open_nvml()
    record: dict[str, Any] = {"cgroup": str(leaf), "cgroupRoot": str(cgroups), "gpus": {}}
    path = _record_path(record_dir, state["id"])
    try:
        for limit in limits:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(limit.uuid)
                # Recorded before it is set, so that a half-done hook is still cleared at teardown.
                record["gpus"][limit.uuid] = {"soft": limit.soft, "hard": limit.hard, "regions": []}
                _write_record(path, record)
                set_limits(nvml, handle, str(leaf), limit.soft, limit.hard)
            except nvml.NVMLError as exc:
                what = f"setting soft {format_quantity(limit.soft)} / hard {format_quantity(limit.hard)} on {leaf}"
                error = _nvml_error(nvml, exc, limit.uuid, what)
                _clear(nvml, record)
                path.unlink(missing_ok=True)
                raise error from None
            record["gpus"][limit.uuid]["regions"] = regions_holding(leaf, limit.soft)
        _write_record(path, record)
    finally:
        nvml.nvmlShutdown()
    return leaf


def _clear(nvml: Any, record: dict[str, Any]) -> list[str]:
    """Clear every GPU's limit on the recorded cgroup; problems are returned, not raised."""
    leaf, root = Path(record["cgroup"]), Path(record["cgroupRoot"])
    problems: list[str] = []
    if not leaf.is_dir():
        regions = {r: int(g["soft"]) for g in record["gpus"].values() for r in g.get("regions", [])}
        release_ancestors(leaf, root, regions)
        return problems
    for uuid in record["gpus"]:
        try:
            clear_limits(nvml, nvml.nvmlDeviceGetHandleByUUID(uuid), str(leaf))
        except nvml.NVMLError as exc:
            problems.append(str(_nvml_error(nvml, exc, uuid, f"clearing the limits on {leaf}")))
    return problems


def clear_recorded(record_dir: Path, container_id: str | None = None) -> list[str]:
    """Clear what the set hook recorded (one container, or all of the claim's); problems returned."""
    paths = [_record_path(record_dir, container_id)] if container_id else sorted(record_dir.glob("*.json"))
    paths = [p for p in paths if p.is_file()]
    if not paths:
        return []
    nvml = None
    problems: list[str] = []
    try:
        for path in paths:
            try:
                record = json.loads(path.read_text())
            except ValueError as exc:
                problems.append(
                    f"unreadable record {path}: {exc}; clear its limits with nvidia-smi memory-limits"
                )
                continue
            if nvml is None and Path(record["cgroup"]).is_dir():
                nvml = _open_nvml()  # only a live leaf needs the driver
            found = _clear(nvml, record)
            problems += found
            if not found:
                path.unlink(missing_ok=True)
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()
    return problems
