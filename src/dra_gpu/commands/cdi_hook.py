"""`dra-gpu cdi-hook`: the OCI hooks a claim's CDI spec runs: the driver's memory limits, the loader cache.

`update-ldcache` runs at `createContainer` (in the container's mount namespace, its mounts in place,
before it pivots into its root): it runs the node's `ldconfig` on the container's root with the
folder where the claim's spec mounted the driver's libraries, which makes their soname links and
adds them to the container's loader cache. The workload then finds `libcuda.so.1` without
`LD_LIBRARY_PATH`.

`set-memory-limits` runs at `createRuntime`: the container's process exists and sits in its own
cgroup, the workload has not started. It reads the OCI state from stdin (as every OCI hook does),
finds the process's cgroup-v2 leaf from /proc/<pid>/cgroup, and sets each GPU's soft limit (the
claim's request) and hard limit (its ceiling) there through NVML. It records what it set in the
claim's record directory, so that `clear-memory-limits` (a `poststop` hook) and the kubelet
plugin's unprepare can clear the soft limits again. Any failure is one line on stderr and a
non-zero exit, which makes the runtime refuse to start the container: a workload never runs
without the isolation its class promised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu.cgroups import CgroupError, leaf_of_pid, regions_holding, release_ancestors
from dra_gpu.inventory.capabilities import cgroup_root
from dra_gpu.inventory.memory_limits import clear_limits, load_nvml, set_limits
from dra_gpu.quantity import format_quantity

NAME = "cdi-hook"
HELP = "OCI hooks referenced from CDI specs (run by the container runtime, not by hand)"

EXIT_BAD_INPUT = 2
EXIT_KERNEL = 3
"""The cgroup layout cannot carry the limit (no cgroup v2, the container's cgroup is missing)."""
EXIT_DRIVER = 4
"""The driver cannot (older than 615, no permission, MIG, no memory accounting)."""

PROC_ROOT_ENV = "DRA_GPU_PROC_ROOT"


class HookError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class GpuLimit:
    uuid: str
    soft: int
    hard: int


def parse_limit(text: str) -> GpuLimit:
    uuid, sep, values = text.partition("=")
    soft_text, sep2, hard_text = values.partition(":")
    if not (sep and sep2 and uuid.startswith("GPU-") and soft_text.isdigit() and hard_text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected GPU-UUID=SOFT_BYTES:HARD_BYTES")
    soft, hard = int(soft_text), int(hard_text)
    if soft > hard:
        raise argparse.ArgumentTypeError(f"{text!r}: the soft limit {soft} is above the hard limit {hard}")
    return GpuLimit(uuid, soft, hard)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="hook", metavar="HOOK", required=True)
    ldcache = sub.add_parser(
        "update-ldcache", help="createContainer: add folders to the container's loader cache"
    )
    ldcache.add_argument(
        "--folder", action="append", required=True, help="a folder inside the container (repeatable)"
    )
    set_parser = sub.add_parser(
        "set-memory-limits", help="createRuntime: set the GPUs' limits on the container's cgroup"
    )
    set_parser.add_argument(
        "--limit", type=parse_limit, action="append", required=True, metavar="UUID=SOFT:HARD"
    )
    clear_parser = sub.add_parser(
        "clear-memory-limits", help="poststop: clear the limits the set hook recorded"
    )
    for child in (set_parser, clear_parser):
        child.add_argument("--record-dir", type=Path, required=True, help="the claim's record directory")
        child.add_argument(
            "--cgroup-root", type=Path, default=None, help="cgroup-v2 mount (default /sys/fs/cgroup)"
        )
        child.add_argument("--proc-root", type=Path, default=None, help="procfs mount (default /proc)")


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


LDCONFIG_SEARCH = "/usr/sbin:/sbin:/usr/bin:/bin"


def container_root(state: dict[str, Any]) -> Path:
    """The container's root directory, from the bundle's config.json that the OCI state names."""
    bundle = state.get("bundle")
    if not isinstance(bundle, str) or not bundle:
        raise HookError("the OCI state on stdin has no bundle; run this only as an OCI hook", EXIT_BAD_INPUT)
    try:
        config = json.loads((Path(bundle) / "config.json").read_text())
        root = Path(config["root"]["path"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HookError(
            f"cannot read the container's root from {bundle}/config.json: {exc}", EXIT_BAD_INPUT
        ) from None
    return root if root.is_absolute() else Path(bundle) / root


def update_ldcache(state: dict[str, Any], folders: list[str]) -> None:
    root = container_root(state)
    ldconfig = shutil.which("ldconfig", path=LDCONFIG_SEARCH)
    if ldconfig is None:
        raise HookError(f"ldconfig was not found in {LDCONFIG_SEARCH}", EXIT_BAD_INPUT)
    bad = [f for f in folders if not f.startswith("/") or ".." in Path(f).parts]
    if bad:
        raise HookError(
            f"--folder must be an absolute path inside the container: {', '.join(bad)}", EXIT_BAD_INPUT
        )
    done = subprocess.run(
        [ldconfig, "-r", str(root), *folders], capture_output=True, text=True, timeout=20, check=False
    )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise HookError(
            f"ldconfig -r {root} failed ({done.returncode}): {said[-1] if said else 'no output'}",
            EXIT_BAD_INPUT,
        )


def run(args: argparse.Namespace) -> int:
    if args.hook == "update-ldcache":
        try:
            update_ldcache(read_state(sys.stdin), args.folder)
        except HookError as exc:
            print(f"dra-gpu cdi-hook {args.hook}: {exc}", file=sys.stderr)
            return exc.code
        return 0
    cgroups = args.cgroup_root or cgroup_root()
    proc = args.proc_root or Path(os.environ.get(PROC_ROOT_ENV) or "/proc")
    try:
        state = read_state(sys.stdin)
        if args.hook == "set-memory-limits":
            set_memory_limits(state, args.limit, args.record_dir, cgroups, proc)
            return 0
        problems = clear_recorded(args.record_dir, state["id"])
    except HookError as exc:
        print(f"dra-gpu cdi-hook {args.hook}: {exc}", file=sys.stderr)
        return exc.code
    for problem in problems:
        print(f"dra-gpu cdi-hook {args.hook}: {problem}", file=sys.stderr)
    return EXIT_DRIVER if problems else 0
