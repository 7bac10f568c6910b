"""The demo's limiter step: a real process under the native limiter, against the fake CUDA driver.

The probe gets the environment the limiter claim's CDI spec gives its containers, with the container
paths of the spec's mounts mapped back to their host paths (no container runtime runs here), plus
`LD_LIBRARY_PATH` to the fake `libcuda.so.1`. In a container, the claim's device nodes decide which
GPUs CUDA sees; here `CUDA_VISIBLE_DEVICES` names the same GPUs by UUID, and the fake, like the real
driver, exposes exactly those, so the limiter matches them to the spec's per-UUID limits.
`NVIDIA_VISIBLE_DEVICES` (read by the NVIDIA container runtime, not by CUDA) is left out.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dra_gpu.demo.report import ContainerView
from dra_gpu.plugin.sharing.modes.limiter import host_environment_of
from dra_gpu.plugin.sharing.steps.device_access import device_uuids
from dra_gpu.quantity import format_quantity

LIBRARY = "libdragpu-limiter.so.1"
PROBE = "limiter-probe"
FAKE_DRIVER_DIR = "fake"
CHUNK = 2**30
MAX_CHUNKS = 16
LEFT_OUT = ("NVIDIA_VISIBLE_DEVICES",)


@dataclass
class LimiterRun:
    ran: bool
    lines: list[str] = field(default_factory=list)
    granted_chunks: int = 0
    refused_at: int | None = None
    refused_error: str = ""
    allocated_bytes: int = 0
    reported_total: int | None = None
    reported_free: int | None = None


def _is_build(path: Path) -> bool:
    return (path / LIBRARY).is_file() and (path / PROBE).is_file() and (path / FAKE_DRIVER_DIR).is_dir()


def find_limiter_build() -> Path | None:
    """`native/limiter/build` from the working directory, or next to the source tree of this package."""
    candidates = [
        Path.cwd() / "native/limiter/build",
        Path(__file__).resolve().parents[3] / "native/limiter/build",
    ]
    return next((c for c in candidates if _is_build(c)), None)


def limiter_library(build: Path | None, workdir: Path) -> Path:
    """The library the node agents hand to limiter claims: the build's, or a placeholder file saying why not."""
    if build is not None and (build / LIBRARY).is_file():
        return build / LIBRARY
    placeholder = workdir / "limiter-not-built" / LIBRARY
    placeholder.parent.mkdir(parents=True, exist_ok=True)
    placeholder.write_text("placeholder: the native limiter is not built (make -C native/limiter)\n")
    return placeholder


def probe_environment(view: ContainerView, build: Path) -> dict[str, str]:
    env = {k: v for k, v in view.env.items() if k not in LEFT_OUT}
    for container_path, host_path, _ in sorted(view.mounts, key=lambda m: -len(m[0])):
        env = {k: v.replace(container_path, host_path) for k, v in env.items()}
    # In a container the library loads from /etc/ld.so.preload and reads the claim's limits file;
    # out here it reads the same limits from the environment.
    env.update(host_environment_of((c, h) for c, h, _ in view.mounts))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(device_uuids(view.env))
    env["LD_LIBRARY_PATH"] = str(build / FAKE_DRIVER_DIR)
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    return env


def _total(output: str) -> int | None:
    found = re.search(r"\btotal=(\d+)", output)
    return int(found.group(1)) if found else None


def _free(output: str) -> int | None:
    found = re.search(r"\bfree=(\d+)", output)
    return int(found.group(1)) if found else None


def run_limiter_probe(build: Path | None, view: ContainerView | None, workdir: Path) -> LimiterRun:
    if build is None or not _is_build(build):
        return LimiterRun(
            False,
            [
                "skipped: the native limiter is not built here (`make -C native/limiter` builds it; "
                "`make demo` tries to)."
            ],
        )
    if view is None:
        return LimiterRun(False, ["skipped: the limiter claim was not prepared"])
    env = probe_environment(view, build)
    probe = str(build / PROBE)
    run = LimiterRun(True)
    shown = {k: env[k] for k in sorted(env) if k.startswith(("DRAGPU_", "LD_PRELOAD"))}
    run.lines.append(
        "environment from the claim's CDI spec and limits file (container paths mapped to host paths):"
    )
    run.lines += [f"  {k}={v}" for k, v in shown.items()]
    bare_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    try:
        bare = subprocess.run(
            [probe, "info"], env=bare_env, capture_output=True, text=True, timeout=30, cwd=workdir
        )
        info = subprocess.run(
            [probe, "info"], env=env, capture_output=True, text=True, timeout=30, cwd=workdir
        )
        alloc = subprocess.run(
            [probe, "alloc", str(CHUNK), str(MAX_CHUNKS)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=workdir,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LimiterRun(False, [*run.lines, f"the probe could not run: {exc}"])
    if info.returncode != 0 or alloc.returncode != 0:
        problem = (info.stderr or alloc.stderr).strip().splitlines()[-1:] or ["no output"]
        return LimiterRun(False, [*run.lines, f"the probe failed to start: {problem[0]}"])
    device = _total(bare.stdout)
    run.reported_total = _total(info.stdout)
    run.reported_free = _free(info.stdout)
    if device is not None and run.reported_total is not None:
        run.lines.append(
            f"$ limiter-probe info -> without the limiter the (fake) GPU has {format_quantity(device)}; "
            f"under it the program sees {format_quantity(run.reported_total)}"
        )
    if run.reported_total is not None and run.reported_free is not None:
        # The claim's cap includes the process's CUDA context, charged what the driver took for it.
        run.lines.append(
            f"  of which its own CUDA context already holds "
            f"{format_quantity(run.reported_total - run.reported_free)}"
        )
    run.lines.append(
        f"$ limiter-probe alloc {format_quantity(CHUNK)} {MAX_CHUNKS}  (cuMemAlloc_v2 in 1Gi chunks)"
    )
    for line in alloc.stdout.splitlines():
        m = re.match(r"alloc (\d+) (\S+)", line)
        if m:
            if m.group(2) == "ok":
                run.granted_chunks += 1
            elif run.refused_at is None:  # the probe counts from 0; people count from 1
                run.refused_at, run.refused_error = int(m.group(1)) + 1, m.group(2)
        done = re.search(r"allocated=(\d+)", line)
        if done:
            run.allocated_bytes = int(done.group(1))
    if run.granted_chunks:
        run.lines.append(f"  allocations 1 to {run.granted_chunks}: ok")
    if run.refused_at is not None:
        run.lines.append(
            f"  allocation {run.refused_at}: {run.refused_error}  <- refused: it would exceed the claim's cap"
        )
    run.lines.append(f"  allocated {format_quantity(run.allocated_bytes)} in total, then stopped")
    return run
