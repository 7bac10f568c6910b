"""Real frameworks under a cap C, through their own allocators: PyTorch (each allocator, with and without
a CUDA-graph capture that allocates), CuPy (default and async pool) and JAX (with and without
preallocation), where the framework's Python has them.

Each variant runs `workloads/frameworks.py` under the limiter's environment (as the kubelet plugin
writes it) and must:

- report a total of C (JAX: its allocator's `bytes_limit`, which XLA sets to the memory fraction the
  check gives it of the total it sees, so that fraction of C, or C where XLA lets the pool grow to the
  whole total; within 1 % of C either way, which the physical total is not);
- stop with the framework's out-of-memory error, having allocated at most C and at least C less the
  process's context less one chunk (JAX with preallocation: its pool, fraction x C, less two chunks,
  its own bookkeeping and the last chunk; JAX without: nine tenths of C less the context, less a
  chunk, for its allocator's growth policy, `Variant.usable`);
- use, as nvidia-smi shows the process at its peak, at most C plus its context (what nvidia-smi
  showed for it before it allocated) plus `USAGE_SLACK`.

A capture is first run without the preload: where it fails there, the variant is skipped with that
reason; where it works there and fails under the preload, the variant fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gpucheck.context import GIB, MIB, Context
from gpucheck.parse import int_of, key_values, smi_csv
from gpucheck.proc import Background, Ran, run, which
from gpucheck.report import Result, failed, skipped, verdict

CAP = 4 * GIB
CHUNK = 256 * MIB
CONTEXT_GUESS = GIB
"""The context assumed where nvidia-smi cannot show the process's own usage."""
USAGE_SLACK = 16 * MIB
"""nvidia-smi's whole MiB, and the modules the driver loads lazily after the context was read."""
JAX_PREALLOC_FRACTION = 0.75
"""JAX's documented default, given explicitly so that every JAX version takes the same pool."""
START_TIMEOUT_S = 120.0
STEP_TIMEOUT_S = 120.0
OOM_MARKS = (
    "outofmemory",
    "out of memory",
    "resource_exhausted",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
)


@dataclass(frozen=True)
class Variant:
    name: str
    """The result's name after `framework.`."""
    framework: str
    allocator: str
    env: dict[str, str] = field(default_factory=dict)
    graph: bool = False
    fraction: float | None = None
    """JAX: the memory fraction given to XLA; the total it reports is this fraction of C."""
    preallocates: bool = False
    usable: float = 1.0
    """The share of what the cap leaves (C less the context) the allocator is expected to reach: XLA's
    allocator grows in regions of doubling size and, refused, backs off in 10 % steps only once, so it
    may stop a tenth short of what the cap leaves."""


VARIANTS: tuple[Variant, ...] = (
    Variant("torch.default", "torch", "default"),
    Variant("torch.default.graph", "torch", "default", graph=True),
    Variant(
        "torch.expandable", "torch", "expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    ),
    Variant(
        "torch.expandable.graph",
        "torch",
        "expandable",
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        graph=True,
    ),
    Variant("torch.async", "torch", "async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    Variant(
        "torch.async.graph",
        "torch",
        "async",
        {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
        graph=True,
    ),
    Variant("cupy.pool", "cupy", "pool"),
    Variant("cupy.async", "cupy", "async"),
    Variant(
        "jax.prealloc",
        "jax",
        "prealloc",
        {
            "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": str(JAX_PREALLOC_FRACTION),
        },
        fraction=JAX_PREALLOC_FRACTION,
        preallocates=True,
    ),
    Variant(
        "jax.on-demand",
        "jax",
        "on-demand",
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "1.0"},
        fraction=1.0,
        usable=0.9,
    ),
)


@dataclass
class Usage:
    """What nvidia-smi showed for the workload's process: before it allocated and at its peak."""

    context: int | None = None
    peak: int | None = None
    problem: str = ""
    """Why a figure is missing, empty otherwise."""
    unmeasurable: bool = False
    """nvidia-smi is not there at all: the usage is not judged (said in the summary)."""


def cap_for(ctx: Context) -> int:
    return min(CAP, max(ctx.gpu.memory_bytes // 4 // MIB, 64) * MIB)


def workload_python(ctx: Context) -> tuple[str, str]:
    """The Python that has the frameworks, and why it cannot run (empty when it can)."""
    python = ctx.workload_python
    found = which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if found is None:
        return (
            python,
            f"{python} not found or not executable (GPU_CHECK_FRAMEWORK_PYTHON names the Python with the frameworks)",
        )
    return found, ""


def frameworks(ctx: Context) -> list[Result]:
    names = [f"framework.{v.name}" for v in VARIANTS]
    if ctx.limiter is None:
        return [skipped(n, ctx.missing("limiter")) for n in names]
    python, problem = workload_python(ctx)
    if problem:
        return [skipped(n, problem) for n in names]
    cap = cap_for(ctx)
    script = ctx.root / "gpucheck/workloads/frameworks.py"
    missing: dict[str, str] = {}
    out = []
    for variant in VARIANTS:
        name = f"framework.{variant.name}"
        if variant.framework in missing:
            out.append(skipped(name, missing[variant.framework]))
            continue
        argv = [python, str(script), variant.framework, variant.allocator, str(CHUNK), str(2 * cap)]
        bare: dict[str, str] | None = None
        details: list[str] = []
        if variant.graph:
            ran = run(
                [*argv, "graph", "no-fill"],
                env={**ctx.base_env(), **variant.env},
                stdin="\n\n",
                timeout_s=START_TIMEOUT_S,
            )
            bare = key_values(ran.stdout)
            details += ["without the preload:", *ran.describe()]
            if "skip" in bare:
                missing[variant.framework] = bare["skip"]
                out.append(skipped(name, bare["skip"]))
                continue
            if bare.get("graph") != "ok":
                bare.setdefault("graph_error", ran.why())
                result = judge_framework(name, variant, cap, CHUNK, {}, Usage(), ran.ok, ran.why(), bare)
                result.details += details
                out.append(result)
                continue
        env = {**ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(name)), **variant.env}
        values, usage, ran = run_workload(ctx, [*argv, *(["graph"] if variant.graph else [])], env, name)
        if "skip" in values:
            missing[variant.framework] = values["skip"]
        result = judge_framework(name, variant, cap, CHUNK, values, usage, ran.ok, ran.why(), bare)
        result.details += [*details, "under the preload:", *ran.describe()]
        out.append(result)
    return out


def run_workload(
    ctx: Context, argv: list[str], env: dict[str, str], name: str
) -> tuple[dict[str, str], Usage, Ran]:
    """The workload in steps: its usage read before it allocates and at its peak."""
    smi = which("nvidia-smi")
    usage = Usage(unmeasurable=smi is None, problem="nvidia-smi not found" if smi is None else "")
    log = ctx.work / f"{name}.log"
    proc = Background(argv, env, log)
    try:
        if proc.wait_for("ready", START_TIMEOUT_S):
            if smi is not None:
                usage.context, usage.problem = process_usage(smi, ctx.gpu.uuid, proc.process.pid)
            proc.send("\n")
            if proc.wait_for("holding", STEP_TIMEOUT_S) and smi is not None:
                usage.peak, problem = process_usage(smi, ctx.gpu.uuid, proc.process.pid)
                usage.problem = usage.problem or problem
        ran = proc.collect(STEP_TIMEOUT_S)
    finally:
        proc.stop()
    return key_values(ran.stdout), usage, ran


def process_usage(smi: str, uuid: str, pid: int) -> tuple[int | None, str]:
    ran = run(
        [smi, "-i", uuid, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        timeout_s=60,
    )
    if not ran.ok:
        return None, f"nvidia-smi failed: {ran.why()}"
    return usage_of(ran.stdout, pid)


def usage_of(text: str, pid: int) -> tuple[int | None, str]:
    """The process's used memory in `nvidia-smi --query-compute-apps=pid,used_memory` output."""
    try:
        rows = smi_csv(text, ("pid", "used_memory"))
    except ValueError as exc:
        return None, str(exc)
    for row in rows:
        if row["pid"] == str(pid):
            try:
                return int(row["used_memory"]) * MIB, ""
            except ValueError:
                return (
                    None,
                    f"nvidia-smi shows no used memory for process {pid} ({row['used_memory'] or 'N/A'})",
                )
    return None, f"nvidia-smi does not list process {pid} (another PID namespace?)"


def is_oom(stopped: str) -> bool:
    text = stopped.lower()
    return any(mark in text for mark in OOM_MARKS)


def judge_framework(
    name: str,
    variant: Variant,
    cap: int,
    chunk: int,
    values: dict[str, str],
    usage: Usage,
    ran_ok: bool,
    why: str,
    bare: dict[str, str] | None = None,
) -> Result:
    """The verdict on one variant, from what the workload printed and what nvidia-smi showed."""
    if "skip" in values:
        return skipped(name, values["skip"])
    if variant.graph and bare is not None and bare.get("graph") != "ok":
        return skipped(
            name,
            f"the capture fails without the preload too: {bare.get('graph_error', 'no result')}",
        )
    if variant.graph and values.get("graph") != "ok":
        error = values.get("graph_error") or why
        return failed(
            name, f"the capture works without the preload and fails with it: {error}", cap_bytes=cap
        )
    total, allocated = int_of(values, "total"), int_of(values, "allocated")
    stopped = values.get("stopped")
    context = usage.context
    if variant.preallocates and variant.fraction is not None:
        floor = int(variant.fraction * cap) - 2 * chunk
    else:
        floor = int(variant.usable * (cap - (context if context is not None else CONTEXT_GUESS))) - chunk
    figures = {
        "cap_bytes": cap,
        "chunk_bytes": chunk,
        "version": values.get("version"),
        "total": total,
        "allocated": allocated,
        "floor": floor,
        "stopped": stopped,
        "context_bytes": context,
        "peak_usage_bytes": usage.peak,
        "graph_bytes": int_of(values, "graph_bytes"),
    }
    if not ran_ok or allocated is None or stopped is None:
        return failed(name, f"the workload failed: {why}", **figures)
    problems = []
    if variant.fraction is None:
        if total != cap:
            problems.append(f"total {total} != cap {cap}")
    elif total is None or min(abs(total - variant.fraction * cap), abs(total - cap)) > cap / 100:
        problems.append(f"allocator limit {total} is neither the cap {cap} nor {variant.fraction} of it")
    if not stopped:
        problems.append(f"no out-of-memory error before {allocated / MIB:.0f} MiB")
    elif not is_oom(stopped):
        problems.append(f"stopped by {stopped}, not out-of-memory")
    if allocated > cap:
        problems.append(f"allocated {allocated / MIB:.0f} MiB > cap {cap / MIB:.0f} MiB")
    elif allocated < floor:
        problems.append(f"stopped at {allocated / MIB:.0f} MiB, below {floor / MIB:.0f} MiB")
    if usage.peak is not None:
        ceiling = cap + (context or 0) + USAGE_SLACK
        if context is None or usage.peak > ceiling:
            problems.append(
                f"nvidia-smi shows {usage.peak / MIB:.0f} MiB at the peak, over cap + context "
                f"{ceiling / MIB:.0f} MiB"
                if context is not None
                else f"nvidia-smi showed no context figure ({usage.problem})"
            )
    elif not usage.unmeasurable:
        problems.append(f"the process's usage was not read: {usage.problem}")
    if problems:
        return failed(name, "; ".join(problems), **figures)
    seen = (
        f"; nvidia-smi: {usage.peak / MIB:.0f} MiB at the peak, context {(context or 0) / MIB:.0f} MiB"
        if usage.peak is not None
        else f"; usage not read ({usage.problem})"
    )
    what = "allocator limit" if variant.fraction is not None else "total"
    graph = " (graph memory included)" if variant.graph else ""
    return verdict(
        name,
        True,
        f"{what} {(total or 0) / MIB:.0f} MiB under a {cap / MIB:.0f} MiB cap; allocated "
        f"{allocated / MIB:.0f} MiB{graph}, then {stopped[:80]}{seen}",
        **figures,
    )
