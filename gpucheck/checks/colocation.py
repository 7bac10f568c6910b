"""A latency-critical claim beside a besteffort training loop, real PyTorch on the real GPU.

Two claims laid out as the agent lays them out (`gpucheck.claims`): `latency` (floor 30 %, ceiling 100,
class latency) serves fixed inference requests of about 2 ms at 30 % duty; `besteffort` (floor 10 %,
ceiling 100, class besteffort) trains. Both are small transformers built from a config with random
weights (`workloads/colocation.py`). Each process starts once; the phases follow one another: the
requests alone, the training alone, then both at once.

- `compute.colocation.latency-p99`: the requests' p99 beside the training over their p99 alone,
  goal <= 1.10;
- `compute.colocation.besteffort-share`: the training's steps per second beside the requests over its
  steps per second alone (the share of the GPU it kept), over the share the requests leave idle (1 less
  their time over the window alone), goal >= 0.5.
The claims' activity files (the library's word) give each claim's GPU time in the shared phase beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpucheck import claims as claims_
from gpucheck.claims import Claim, Layout, laid_out
from gpucheck.context import Context
from gpucheck.parse import float_of, int_of, key_values
from gpucheck.proc import Background, Ran
from gpucheck.report import Result, failed, skipped, verdict

LATENCY = Claim("latency", 30, 100, "latency")
BESTEFFORT = Claim("besteffort", 10, 100, "besteffort")
REQUEST_MS = 2.0
DUTY = 0.3
P99_GOAL = 1.10
KEEP_GOAL = 0.5
SECONDS = {"alone": 4.0, "train_alone": 3.0, "beside": 6.0}
QUICK_SECONDS = {"alone": 2.0, "train_alone": 1.5, "beside": 3.0}
LOAD_TIMEOUT_S = 300.0
STEP_TIMEOUT_S = 120.0
NAMES = ("compute.colocation.latency-p99", "compute.colocation.besteffort-share")


@dataclass
class Outcome:
    """What the two processes printed, and the claims' GPU time in the shared phase (library's word, ms)."""

    serve: dict[str, str] = field(default_factory=dict)
    train: dict[str, str] = field(default_factory=dict)
    problem: str = ""
    skip: str = ""
    library_ms: dict[str, float] = field(default_factory=dict)
    held_ms: dict[str, float] = field(default_factory=dict)
    """Time each claim's launches waited because the latency claim was active (library's word, ms)."""
    ran: list[Ran] = field(default_factory=list)

    def details(self) -> list[str]:
        return [line for r in self.ran for line in r.describe()]


def colocation(ctx: Context) -> list[Result]:
    missing = ctx.missing("limiter") or claims_.why_not()
    if missing:
        return [skipped(n, missing) for n in NAMES]
    with laid_out(ctx.work / "claims-colocation", ctx.gpu.uuid, (LATENCY, BESTEFFORT)) as layout:
        outcome = run_phases(ctx, layout)
    if outcome.skip:
        return [skipped(n, outcome.skip) for n in NAMES]
    return [judge_latency(NAMES[0], outcome), judge_besteffort(NAMES[1], outcome)]


def _step(proc: Background, command: str) -> str:
    """Send one command; empty once it is done, else why not."""
    proc.send(command + "\n")
    if proc.wait_for(f"done {command}", STEP_TIMEOUT_S):
        return ""
    return f"`{command}` did not finish within {STEP_TIMEOUT_S:g} s"


def run_phases(ctx: Context, layout: Layout) -> Outcome:
    assert ctx.limiter is not None
    seconds = QUICK_SECONDS if ctx.quick else SECONDS
    script = ctx.root / "gpucheck/workloads/colocation.py"
    python = ctx.workload_python
    serve = Background(
        layout.argv(LATENCY.uid, ctx.limiter, [python, script, "serve", f"{REQUEST_MS:g}", f"{DUTY:g}"]),
        ctx.base_env(),
        ctx.work / "colocation-serve.log",
    )
    train = Background(
        layout.argv(BESTEFFORT.uid, ctx.limiter, [python, script, "train"]),
        ctx.base_env(),
        ctx.work / "colocation-train.log",
    )
    out = Outcome()
    try:
        for what, p in (("the server", serve), ("the trainer", train)):
            if not p.wait_for("loaded", LOAD_TIMEOUT_S):
                out.skip = key_values(p.text()).get("skip", "")
                out.problem = f"{what} did not load its model within {LOAD_TIMEOUT_S:g} s"
                break
        steps = [
            (serve, "calibrate"),
            (train, "warm"),
            (serve, f"run alone {seconds['alone']:g}"),
            (train, f"run train_alone {seconds['train_alone']:g}"),
        ]
        for proc, command in steps if not out.problem else []:
            out.problem = _step(proc, command)
            if out.problem:
                break
        if not out.problem:
            before = {uid: layout.activity(uid) for uid in (LATENCY.uid, BESTEFFORT.uid)}
            both = f"run beside {seconds['beside']:g}"
            serve.send(both + "\n")
            out.problem = _step(train, both) or (
                "" if serve.wait_for(f"done {both}", STEP_TIMEOUT_S) else f"`{both}` did not finish"
            )
            for uid, was in before.items():
                now = layout.activity(uid)
                if was is not None and now is not None:
                    out.library_ms[uid] = (now.used_ns - was.used_ns) / 1e6
                    out.held_ms[uid] = (now.held_ns - was.held_ns) / 1e6
    finally:
        out.ran = [serve.collect(60), train.collect(60)]
    out.serve, out.train = key_values(out.ran[0].stdout), key_values(out.ran[1].stdout)
    bad = next((r for r in out.ran if not r.ok), None)
    refused = next(filter(None, (claims_.refusal(r.stdout) for r in out.ran)), "")
    if refused:
        out.problem = refused
    elif bad is not None:
        out.problem = f"{out.problem}: {bad.why()}" if out.problem else bad.why()
    return out


def judge_latency(name: str, o: Outcome) -> Result:
    alone, beside = float_of(o.serve, "alone_p99_ms"), float_of(o.serve, "beside_p99_ms")
    if o.problem or alone is None or beside is None or alone <= 0:
        result = failed(name, f"no measurement: {o.problem or 'the server printed no p99'}")
        result.details += o.details()
        return result
    ratio = beside / alone
    result = verdict(
        name,
        ratio <= P99_GOAL,
        f"p99 {beside:.3f} ms beside a besteffort training loop / {alone:.3f} ms alone = {ratio:.3f} x "
        f"(goal <= {P99_GOAL:.2f} x); {REQUEST_MS:g} ms requests at {DUTY * 100:g} % duty",
        ratio=round(ratio, 4),
        goal=P99_GOAL,
        p99_ms_alone=alone,
        p99_ms_beside=beside,
        p50_ms_alone=float_of(o.serve, "alone_p50_ms"),
        p50_ms_beside=float_of(o.serve, "beside_p50_ms"),
        requests_alone=int_of(o.serve, "alone_requests"),
        requests_beside=int_of(o.serve, "beside_requests"),
        request_ms=float_of(o.serve, "request_ms"),
        request_batch=int_of(o.serve, "request_batch"),
        model=o.serve.get("config", ""),
    )
    result.details += o.details()
    return result


def judge_besteffort(name: str, o: Outcome) -> Result:
    figures: dict[str, Any] = {
        "steps_alone": int_of(o.train, "train_alone_steps"),
        "steps_beside": int_of(o.train, "beside_steps"),
    }
    s_alone, s_beside = float_of(o.train, "train_alone_seconds"), float_of(o.train, "beside_seconds")
    busy = float_of(o.serve, "alone_busy")
    if o.problem or not (figures["steps_alone"] and s_alone and s_beside and busy is not None):
        result = failed(
            name, f"no measurement: {o.problem or 'the trainer or the server printed no figures'}"
        )
        result.details += o.details()
        return result
    kept = (figures["steps_beside"] or 0) / s_beside / (figures["steps_alone"] / s_alone)
    idle = max(1e-9, 1.0 - busy)
    share = kept / idle
    result = verdict(
        name,
        share >= KEEP_GOAL,
        f"the training kept {share * 100:.1f} % of the idle time (goal >= {KEEP_GOAL * 100:g} %): "
        f"{kept * 100:.1f} % of its speed alone, beside requests that leave {idle * 100:.1f} % idle",
        share_of_idle=round(share, 4),
        goal=KEEP_GOAL,
        kept_of_alone=round(kept, 4),
        latency_busy_alone=busy,
        step_ms_alone=float_of(o.train, "step_ms"),
        library_used_ms_beside={uid: round(ms, 1) for uid, ms in o.library_ms.items()},
        library_held_ms_beside={uid: round(ms, 1) for uid, ms in o.held_ms.items()},
        model=o.train.get("config", ""),
        **figures,
    )
    result.details += o.details()
    return result
