"""The limiter's cost on real work: the same PyTorch workload with and without the preload, interleaved.

With the preload the limiter is active but generous: a memory cap of the whole GPU (so every
allocation is accounted) and no compute cap (the unthrottled launch path, which is what a claim
without a cores limit runs). The figure is the ratio of the medians of the timed sections.
"""

from __future__ import annotations

from gpucheck.context import Context
from gpucheck.parse import float_of, key_values, median
from gpucheck.proc import run
from gpucheck.report import Result, failed, skipped, verdict

WORKLOADS = {"matmul": 2000, "train": 300, "graph": 300}
ROUNDS = 5
QUICK_ROUNDS = 2
MAX_RATIO = 1.05


def overhead(ctx: Context) -> list[Result]:
    out = []
    script = ctx.root / "gpucheck/workloads/torch_bench.py"
    for workload, iterations in WORKLOADS.items():
        name = f"overhead.{workload}"
        if ctx.limiter is None:
            out.append(skipped(name, ctx.missing("limiter")))
            continue
        times: dict[str, list[float]] = {"bare": [], "preload": []}
        details: list[str] = []
        problem = ""
        rounds = QUICK_ROUNDS if ctx.quick else ROUNDS
        for i in range(rounds):
            order = ("bare", "preload") if i % 2 == 0 else ("preload", "bare")
            for kind in order:
                env = (
                    ctx.base_env()
                    if kind == "bare"
                    else ctx.limiter_env(memory=ctx.gpu.memory_bytes, state_dir=ctx.state_dir(name))
                )
                ran = run([ctx.python, script, workload, str(iterations)], env=env, timeout_s=300)
                values = key_values(ran.stdout)
                if "skip" in values:
                    problem = "skip:" + values["skip"]
                    break
                seconds = float_of(values, "seconds")
                if not ran.ok or seconds is None:
                    problem = f"{kind} run failed: {ran.why()}"
                    details += ran.describe()
                    break
                times[kind].append(seconds)
            if problem:
                break
        if problem.startswith("skip:"):
            out.append(skipped(name, problem[5:]))
            continue
        if problem:
            result = failed(name, problem)
            result.details += details
            out.append(result)
            continue
        out.append(judge_overhead(name, times["bare"], times["preload"]))
    return out


def judge_overhead(name: str, bare: list[float], preload: list[float]) -> Result:
    ratio = median(preload) / median(bare)
    return verdict(
        name,
        ratio <= MAX_RATIO,
        f"with the preload / without: {ratio:.4f} (medians {median(preload) * 1000:.2f} / "
        f"{median(bare) * 1000:.2f} ms over {len(bare)} interleaved rounds; goal <= {MAX_RATIO})",
        ratio=round(ratio, 5),
        bare_seconds=bare,
        preload_seconds=preload,
    )
