"""A whole MIG cycle on the checked GPU: enable MIG, make the smallest instance, run the limiter's cap inside it,
destroy the instance, disable MIG.

Changing the MIG mode stops everything else on the GPU, so the cycle runs only when asked
(`GPU_CHECK_MIG_CYCLE=1`); otherwise it is a skip that says so. Where the driver refuses (a GPU without MIG, a
virtual machine that does not pass MIG through, a mode change that waits for a GPU reset, no privileges) it is
a skip that quotes the driver, after putting the mode back. The check never resets the GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from gpucheck.checks.memory import CHUNK, HERE_TIMEOUT_S, judge_cap
from gpucheck.context import MIB, Context
from gpucheck.parse import key_values
from gpucheck.proc import Ran, run, which
from gpucheck.report import FAIL, Result, failed, skipped

ENV = "GPU_CHECK_MIG_CYCLE"
NAME = "mig.cycle"
CAP = 1024 * MIB
"""The limiter's memory cap inside the instance: below the smallest instance of every MIG GPU (10 GB)."""

_PROFILE_ROW = re.compile(r"^\|\s+\d+\s+MIG (\d+g\.\d+gb)\s+(\d+)\s+\d+/\d+\s")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")
_REFUSED = ("unable", "not supported", "insufficient permissions", "failed", "error")


def smallest_profile(lgip: str) -> tuple[str, int] | None:
    """The 1-slice profile without media extensions (`1g.10gb`, id 19) in `nvidia-smi mig -lgip` output."""
    for line in lgip.splitlines():
        row = _PROFILE_ROW.match(line)
        if row and row.group(1).startswith("1g."):
            return row.group(1), int(row.group(2))
    return None


def mig_uuid(listing: str, gpu_uuid: str, profile: str) -> str | None:
    """The UUID of the `profile` MIG device under GPU `gpu_uuid` in `nvidia-smi -L` output."""
    under = False
    for line in listing.splitlines():
        if line.startswith("GPU "):
            under = f"(UUID: {gpu_uuid})" in line
            continue
        found = _MIG_LINE.match(line)
        if under and found and found.group(1) == profile:
            return found.group(2)
    return None


def mode_change_refused(ran: Ran) -> str:
    """Why the driver did not switch the mode now ("" if it did): its own words, or the pending reset."""
    text = (ran.stdout + "\n" + ran.stderr).strip()
    lowered = text.lower()
    if not ran.ok or any(word in lowered for word in _REFUSED):
        return text or ran.why()
    if "pending" in lowered or "reset" in lowered or "reboot" in lowered:
        return text
    return ""


def mig_cycle(ctx: Context) -> list[Result]:
    if os.environ.get(ENV, "") in ("", "0"):
        return [
            skipped(
                NAME, f"it changes the GPU's MIG mode, stopping all other work on it: set {ENV}=1 to run it"
            )
        ]
    smi = which("nvidia-smi")
    missing = "nvidia-smi is not on PATH" if smi is None else ctx.missing("gc_drv", "limiter")
    if missing:
        return [skipped(NAME, missing)]
    assert smi is not None
    gpu = ctx.gpu.uuid
    steps: list[Ran] = []

    def step(*argv: str) -> Ran:
        ran = run([smi, *argv], timeout_s=120)
        steps.append(ran)
        return ran

    enabled = step("-i", gpu, "-mig", "1")
    refused = mode_change_refused(enabled)
    try:
        if refused:
            result = skipped(NAME, f"the driver did not enable MIG now: {refused.splitlines()[0][:300]}")
        else:
            result = _inside_an_instance(ctx, step, gpu)
    finally:
        step("mig", "-i", gpu, "-dci")
        step("mig", "-i", gpu, "-dgi")
        disabled = step("-i", gpu, "-mig", "0")
    if not refused and not disabled.ok:
        result.status = FAIL
        result.summary += f"; MIG could not be disabled again: {disabled.why()}"
    for ran in steps:
        result.details += ran.describe()
    return [result]


def _inside_an_instance(ctx: Context, step: Callable[..., Ran], gpu: str) -> Result:
    """Makes the smallest instance and runs the cap check inside it (the limits keyed by its `MIG-` UUID)."""
    listed = step("mig", "-i", gpu, "-lgip")
    profile = smallest_profile(listed.stdout)
    if profile is None:
        return skipped(NAME, f"no 1g profile in the driver's list: {listed.why() or listed.stdout[:200]}")
    made = step("mig", "-i", gpu, "-cgi", str(profile[1]), "-C")
    if not made.ok:
        return skipped(NAME, f"the driver did not make a {profile[0]} instance: {made.why()}")
    uuid = mig_uuid(step("-L").stdout, gpu, profile[0])
    if uuid is None:
        return failed(NAME, f"a {profile[0]} instance was made but `nvidia-smi -L` does not list it")
    binary = ctx.program("gc_drv")
    assert binary is not None and ctx.limiter is not None
    env = ctx.base_env()
    env.update(
        CUDA_VISIBLE_DEVICES=uuid,
        LD_PRELOAD=str(ctx.limiter),
        DRAGPU_LIMITER_STATE_DIR=str(ctx.state_dir(NAME)),
        DRAGPU_MEMORY_LIMIT_BY_UUID=f"{uuid}={CAP}",
    )
    info = run([binary, "info"], env=env, timeout_s=HERE_TIMEOUT_S)
    fill = run([binary, "family", "mem", str(CHUNK), str(2 * CAP)], env=env, timeout_s=HERE_TIMEOUT_S)
    result = judge_cap(NAME, CAP, ctx.gpu.memory_bytes, key_values(info.stdout), key_values(fill.stdout))
    if not info.ok or not fill.ok:
        result.status = FAIL
        result.summary = f"the program failed inside {uuid}: {(info if not info.ok else fill).why()}"
    else:
        result.summary = f"inside a {profile[0]} instance ({uuid}): {result.summary}"
    result.details += info.describe() + fill.describe()
    return result
