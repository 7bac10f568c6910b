"""A claim's process for the demo's elastic step: a container's view of its claim, then kernels in phases.

Run as `unshare --map-root-user --mount --propagation private python -m dra_gpu.demo.claim_process SPEC`.
First, as the namespace's root, it makes the mounts the claim's CDI spec gives a container under
`/run/dra-gpu` (on a tmpfs over `/run`, seen by this process only), read-only where the spec says so,
as a container runtime would: the limiter then trusts the limits file and the board as it does in a
pod. Then it runs itself again with the limiter preloaded and launches kernels on device 0 of the fake
CUDA driver (through `dlopen`, as frameworks reach the driver) while each of its phases lasts. Once its
driver is set up it prints `ready` and reads the start (CLOCK_MONOTONIC seconds) from its standard input,
so that the claims' phases start together however long each took to set up.

SPEC is JSON: `library` (host path), `env` (the process's environment), `mounts` ([container path, host
path, options]), `phases` ([[from s, to s], ...] after the start), `kernel_us` (each kernel's length).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT

MOUNT_ROOT = str(PurePosixPath(CONTAINER_CLAIMS_ROOT).parent)
"""Where a container sees its claims' files and its GPUs' arbitration directories."""
RUN_FLAG = "--run"
SM_COUNT = 132
WAVE_US = 10
"""The fake driver's settings the claim processes get (FAKE_CUDA_SM_COUNT, FAKE_CUDA_WAVE_NS / 1000)."""


class ClaimProcessError(RuntimeError):
    """The process could not set up its claim's view or its driver; the message says which step."""


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ClaimProcessError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def make_mounts(mounts: list[list[str]]) -> None:
    """The spec's mounts under MOUNT_ROOT, parents first, on a tmpfs over its parent directory."""
    _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(Path(MOUNT_ROOT).parent))
    for container_path, host_path, options in sorted(mounts, key=lambda m: m[0]):
        if not container_path.startswith(MOUNT_ROOT + "/"):
            continue
        target = Path(container_path)
        if not target.exists():
            if Path(host_path).is_dir():
                target.mkdir(parents=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
        _mount("--bind", host_path, container_path)
        if "ro" in options.split(","):
            _mount("-o", "remount,bind,ro", container_path)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise ClaimProcessError(f"{what} failed with CUDA error {result}")


def run_phases(phases: list[list[float]], kernel_us: int) -> None:
    """Kernels back to back on one stream while each phase lasts; the device drained between phases."""
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context, module, function, stream = (ctypes.c_void_p() for _ in range(5))
    _check(cuda.cuInit(0), "cuInit")
    _check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    _check(cuda.cuModuleLoadData(ctypes.byref(module), b"image"), "cuModuleLoadData")
    _check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"small"), "cuModuleGetFunction")
    _check(cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    grid = ctypes.c_uint(SM_COUNT * max(1, kernel_us // WAVE_US))
    one, threads = ctypes.c_uint(1), ctypes.c_uint(128)
    print("ready", flush=True)
    start = sys.stdin.readline()
    if not start:
        return  # the demo went away before the start
    begin = float(start)
    for start, end in phases:
        wait = begin + start - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # idle until the phase begins: this claim leaves the GPU to the others
        while time.monotonic() < begin + end:
            _check(
                cuda.cuLaunchKernel(
                    function, grid, one, one, threads, one, one, ctypes.c_uint(0), stream, None, None
                ),
                "cuLaunchKernel",
            )
        _check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[-1])
    try:
        if RUN_FLAG not in argv:
            make_mounts(spec["mounts"])
            env = dict(spec["env"], LD_PRELOAD=spec["library"])
            os.execve(sys.executable, [sys.executable, "-m", __spec__.name, RUN_FLAG, argv[-1]], env)
        run_phases(spec["phases"], int(spec["kernel_us"]))
    except (ClaimProcessError, OSError, ValueError) as exc:
        print(f"claim process: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
