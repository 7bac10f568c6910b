"""Serving engines under a cap C (`workloads/serving.py`, PyTorch, under the limiter's environment):

- `serving.nccl`: NCCL's set-up and an all-reduce work with one rank; what NCCL's set-up costs the claim
  (the drop in the free memory the limiter reports) is at most what it costs the device (the same drop
  without the preload, the driver's own figure) plus `NCCL_SLACK`: NCCL's host-located VMM buffers
  (`cuMemCreate` with a host location) are not charged as GPU memory;
- `serving.decode`: a transformer's decode loop grows its KV cache to the cap and stops with PyTorch's
  out-of-memory error (the cache at most C, at least half of it), then, the cache freed, serves again;
- `serving.profile`: the memory-profiling sequence an engine runs before sizing its cache gives figures
  consistent with the cap - the total is C, free memory only falls through warm-up and capture, and what
  is left free (at most C less what PyTorch reserved) can be allocated, nine tenths of it, as a cache.
"""

from __future__ import annotations

from gpucheck.checks.frameworks import cap_for, is_oom, workload_python
from gpucheck.context import MIB, Context
from gpucheck.parse import int_of, key_values
from gpucheck.proc import run
from gpucheck.report import Result, failed, judged, skipped

NCCL_SLACK = 64 * MIB
"""The limiter charges whole 2 MiB granules; NCCL allocates its device buffers in a few dozen of them."""
TIMEOUT_S = 600.0
NAMES = ("serving.nccl", "serving.decode", "serving.profile")


def serving(ctx: Context) -> list[Result]:
    if ctx.limiter is None:
        return [skipped(n, ctx.missing("limiter")) for n in NAMES]
    python, problem = workload_python(ctx)
    if problem:
        return [skipped(n, problem) for n in NAMES]
    cap = cap_for(ctx)
    script = str(ctx.root / "gpucheck/workloads/serving.py")

    def workload(mode: str, limited: bool) -> tuple[dict[str, str], str]:
        env = (
            ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(f"serving-{mode}"))
            if limited
            else ctx.base_env()
        )
        ran = run([python, script, mode, str(cap)], env=env, timeout_s=TIMEOUT_S)
        return key_values(ran.stdout), "" if ran.ok else ran.why()

    bare, bare_error = workload("nccl", False)
    nccl, nccl_error = workload("nccl", True)
    decode, decode_error = workload("decode", True)
    profile, profile_error = workload("profile", True)
    return [
        judge_nccl(cap, bare, nccl, bare_error or nccl_error),
        judge_decode(cap, decode, decode_error),
        judge_profile(cap, profile, profile_error),
    ]


def judge_nccl(cap: int, bare: dict[str, str], limited: dict[str, str], error: str = "") -> Result:
    name = "serving.nccl"
    for values in (bare, limited):
        if "skip" in values:
            return skipped(name, values["skip"])
    if error or limited.get("finished") != "1":
        return failed(name, f"the workload failed: {error or 'it did not finish'}", cap_bytes=cap)
    device_cost = _drop(bare)
    charged = _drop(limited)
    figures = {
        "cap_bytes": cap,
        "nccl": limited.get("nccl"),
        "charged_bytes": charged,
        "device_bytes": device_cost,
        "total": int_of(limited, "total"),
    }
    problems = []
    if limited.get("allreduce") != "ok":
        problems.append(f"the all-reduce failed under the preload: {limited.get('allreduce')}")
    if int_of(limited, "total") != cap:
        problems.append(f"total {limited.get('total')} != cap {cap}")
    if charged is None or device_cost is None:
        problems.append("no free-memory figures")
    elif charged > device_cost + NCCL_SLACK:
        problems.append(
            f"NCCL's set-up is charged {charged / MIB:.0f} MiB but takes {device_cost / MIB:.0f} MiB of the "
            f"device: host memory is charged as GPU memory"
        )
    return judged(
        name,
        problems,
        lambda: (
            f"NCCL {limited.get('nccl')}: all-reduce ok under a {cap / MIB:.0f} MiB cap; set-up charged "
            f"{(charged or 0) / MIB:.0f} MiB, the device's {(device_cost or 0) / MIB:.0f} MiB"
        ),
        **figures,
    )


def judge_decode(cap: int, values: dict[str, str], error: str = "") -> Result:
    name = "serving.decode"
    if "skip" in values:
        return skipped(name, values["skip"])
    cache, steps, stopped = int_of(values, "cache_bytes"), int_of(values, "steps"), values.get("stopped")
    figures = {"cap_bytes": cap, "cache_bytes": cache, "steps": steps, "stopped": stopped}
    if error or cache is None or stopped is None:
        return failed(name, f"the workload failed: {error or 'no figures'}", **figures)
    problems = []
    if not is_oom(stopped):
        problems.append(f"stopped by {stopped or 'nothing'}, not PyTorch's out-of-memory error")
    if cache > cap:
        problems.append(f"the cache grew to {cache / MIB:.0f} MiB, past the cap {cap / MIB:.0f} MiB")
    elif cache < cap // 2:
        problems.append(f"the cache stopped at {cache / MIB:.0f} MiB, under half the cap")
    if values.get("served") != "ok":
        problems.append(f"it did not serve again after freeing: {values.get('served')}")
    return judged(
        name,
        problems,
        lambda: (
            f"KV cache grew to {cache / MIB:.0f} MiB in {steps} steps under a {cap / MIB:.0f} MiB cap, stopped "
            f"by {stopped[:60]}, then served again"
        ),
        **figures,
    )


def judge_profile(cap: int, values: dict[str, str], error: str = "") -> Result:
    name = "serving.profile"
    if "skip" in values:
        return skipped(name, values["skip"])
    keys = ("total", "free_before", "free_warm", "free_after", "torch_reserved")
    got = {k: int_of(values, k) for k in keys}
    figures = {"cap_bytes": cap, **got, "cache": values.get("cache")}
    if error or any(v is None for v in got.values()):
        return failed(name, f"the workload failed: {error or 'no figures'}", **figures)
    total, before, warm, after, reserved = (int(got[k] or 0) for k in keys)
    problems = []
    if total != cap:
        problems.append(f"total {total} != cap {cap}")
    if not before >= warm >= after:
        problems.append(f"free memory rose during profiling: {before} -> {warm} -> {after}")
    if after > cap - reserved:
        problems.append(
            f"free {after / MIB:.0f} MiB after profiling, more than the cap less PyTorch's {reserved / MIB:.0f} MiB"
        )
    if values.get("cache") != "ok":
        problems.append(
            f"a cache of nine tenths of the free memory could not be allocated: {values.get('cache')}"
        )
    return judged(
        name,
        problems,
        lambda: (
            f"free {before / MIB:.0f} -> {warm / MIB:.0f} (warm-up) -> {after / MIB:.0f} MiB (graph) of a "
            f"{cap / MIB:.0f} MiB cap; a cache of {0.9 * after / MIB:.0f} MiB fits"
        ),
        **figures,
    )


def _drop(values: dict[str, str]) -> int | None:
    before, after = int_of(values, "free_before"), int_of(values, "free_after")
    return None if before is None or after is None else before - after
