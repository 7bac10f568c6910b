"""The limiter's cost on real work: the same PyTorch workloads with and without the preload, interleaved.

With the preload the limiter is active but generous: a memory cap of the whole GPU (so every
allocation is accounted) and no compute cap (the unthrottled launch path, which is what a claim
without a cores limit runs). The figure is the ratio of the medians of the timed sections.

`overhead.<workload>.throttled` runs the same with a compute share of THROTTLED_CORES %: every launch
takes the throttled path (admission, the timing events of the launches it times), and a workload that
keeps the GPU busy is held to that share, so its goal is MAX_RATIO times 100 / THROTTLED_CORES.
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
THROTTLED_CORES = 99
KINDS = ("bare", "preload", "throttled")


def _name(workload: str, kind: str) -> str:
    return f"overhead.{workload}" + (".throttled" if kind == "throttled" else "")


def overhead(ctx: Context) -> list[Result]:
    names = [_name(w, kind) for kind in KINDS[1:] for w in WORKLOADS]
    if ctx.limiter is None:
        return [skipped(n, ctx.missing("limiter")) for n in names]
    script = ctx.root / "gpucheck/workloads/torch_bench.py"
    argv = [ctx.workload_python, str(script), *(f"{w}={n}" for w, n in WORKLOADS.items())]
    times: dict[str, dict[str, list[float]]] = {w: {k: [] for k in KINDS} for w in WORKLOADS}
    firsts: dict[str, dict[str, list[float]]] = {w: {k: [] for k in KINDS} for w in WORKLOADS}
    for i in range(QUICK_ROUNDS if ctx.quick else ROUNDS):
        for kind in KINDS[i % len(KINDS) :] + KINDS[: i % len(KINDS)]:  # each kind first in turn
            env = (
                ctx.base_env()
                if kind == "bare"
                else ctx.limiter_env(
                    memory=ctx.gpu.memory_bytes,
                    cores=THROTTLED_CORES if kind == "throttled" else None,
                    state_dir=ctx.state_dir(f"overhead-{kind}"),
                )
            )
            ran = run(argv, env=env, timeout_s=600)
            values = key_values(ran.stdout)
            if "skip" in values:
                return [skipped(n, values["skip"]) for n in names]
            missing = [w for w in WORKLOADS if float_of(values, f"{w}_seconds") is None]
            if not ran.ok or missing:
                out = []
                for n in names:
                    result = failed(n, f"the {kind} run failed: {ran.why()}")
                    result.details += ran.describe()
                    out.append(result)
                return out
            for w in WORKLOADS:
                seconds = float_of(values, f"{w}_seconds")
                assert seconds is not None
                times[w][kind].append(seconds)
                first = float_of(values, f"{w}_first_step_seconds")
                if first is not None:
                    firsts[w][kind].append(first)
    results = []
    for kind in KINDS[1:]:
        throttled = kind == "throttled"
        for w in WORKLOADS:
            result = judge_overhead(
                _name(w, kind),
                times[w]["bare"],
                times[w][kind],
                MAX_RATIO * 100 / THROTTLED_CORES if throttled else MAX_RATIO,
                f" and a {THROTTLED_CORES} % compute share" if throttled else "",
            )
            if firsts[w]["bare"] and firsts[w][kind]:  # the first step, every launch kind new: not judged
                result.figures["first_step_ms"] = round(median(firsts[w][kind]) * 1000, 3)
                result.figures["first_step_ms_bare"] = round(median(firsts[w]["bare"]) * 1000, 3)
            results.append(result)
    return results


def judge_overhead(
    name: str, bare: list[float], preload: list[float], goal: float = MAX_RATIO, share: str = ""
) -> Result:
    ratio = median(preload) / median(bare)
    return verdict(
        name,
        ratio <= goal,
        f"with the preload{share} / without: {ratio:.4f} (medians {median(preload) * 1000:.2f} / "
        f"{median(bare) * 1000:.2f} ms over {len(bare)} interleaved rounds; goal <= {goal:.4f})",
        ratio=round(ratio, 5),
        goal=round(goal, 5),
        bare_seconds=bare,
        preload_seconds=preload,
    )
