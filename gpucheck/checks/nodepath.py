"""The node path end to end; the work is done by `gpucheck.nodepath` in its own process."""

from __future__ import annotations

import json

from gpucheck.checks.memory import cap_for
from gpucheck.context import Context
from gpucheck.proc import run
from gpucheck.report import STATUSES, Result, failed, skipped

CORES = 30


def nodepath(ctx: Context) -> Result:
    name = "nodepath.limiter-claim"
    missing = ctx.missing("gc_drv", "limiter")
    if missing:
        return skipped(name, missing)
    env = ctx.project_env()
    env["GPU_CHECK_UUID"] = ctx.gpu.uuid
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the plugin sees the node's GPUs, the claim's spec sets it
    ran = run(
        [
            ctx.python,
            "-m",
            "gpucheck.nodepath",
            str(ctx.program("gc_drv")),
            str(ctx.limiter),
            str(cap_for(ctx)),
            str(CORES),
        ],
        env=env,
        timeout_s=300,
        cwd=ctx.root,
    )
    lines = [line for line in ran.stdout.splitlines() if line.startswith("{")]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not ran.ok or not isinstance(data, dict) or data.get("status") not in STATUSES:
        result = failed(name, f"the node path did not finish: {ran.why()}")
        result.details += ran.describe()
        return result
    result = Result(name, str(data["status"]), str(data.get("summary", "")), dict(data.get("figures") or {}))
    result.details += [str(d) for d in data.get("details") or []]
    return result
