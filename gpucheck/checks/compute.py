"""The limiter's compute cap, measured with the GPU's own clock.

`gc_rt busy` launches spin kernels (one block per SM) for a few seconds; every kernel records its
start and end on the GPU's global timer, its end after the bookkeeping that follows its spin (it holds
the GPU as long as the spin does); a CUDA graph holds the GPU from its first node's start to its last
node's end. The busy fraction is the union of those spans over the window (less a margin at each
edge), so two processes of one claim are measured together. The spin alone is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpucheck.context import Context
from gpucheck.parse import busy_fraction, kernels_from_bytes, launch_spans, median, spin_spans
from gpucheck.proc import Background, Ran
from gpucheck.report import Result, failed, skipped, verdict
from gpucheck.sampler import UtilizationSampler

TARGETS = (10, 30, 50, 70)


@dataclass(frozen=True)
class Load:
    """What `gc_rt busy` runs: kernels of `kernel_us`, in CUDA graphs of `graph_n` kernels (0: plain
    launches), in `processes` processes of one claim; `periodic`: every fourth kernel 20 times as long
    (one kernel and grid on different data, as a model's layers repeat)."""

    kernel_us: float
    graph_n: int = 0
    processes: int = 1
    periodic: bool = False


VARIANTS = {
    "short": Load(50.0),
    "long": Load(5000.0),
    "graph": Load(100.0, graph_n=20),
    "two-processes": Load(50.0, processes=2),
    "periodic": Load(20.0, periodic=True),
}
WINDOW_S = 4.0
QUICK_WINDOW_S = 1.5
TRIM_NS = 200_000_000
"""Left out at each edge: start-up of the processes and the limiter's first estimates."""
BASELINE_MIN_BUSY = 0.9


def tolerance(target: int) -> float:
    """Allowed absolute error in percentage points: 10 % of the target, at least 2 points."""
    return max(2.0, 0.1 * target)


@dataclass
class Measurement:
    busy: float
    window_ns: int
    ran: list[Ran]
    nvml_utilization: float | None = None
    spin_busy: float = 0.0
    """The kernels' spins alone, without their bookkeeping (nor a graph's gaps between nodes)."""
    bookkeeping_ns: float = 0.0
    """Median time from a kernel's last spin to its end."""


def busy_argv(binary: Path, seconds: float, load: Load) -> list[str | Path]:
    """`gc_rt busy` for the load, waiting to be released (`--ready`); `--out FILE` is for the caller to add."""
    argv: list[str | Path] = [binary, "busy", f"{seconds:g}", f"{load.kernel_us:g}", "--ready"]
    if load.graph_n:
        argv += ["--graph", str(load.graph_n)]
    if load.periodic:
        argv += ["--periodic"]
    return argv


def measure(ctx: Context, env: dict[str, str] | None, load: Load, tag: str) -> Measurement:
    """Busy fraction and window (ns) of the load's processes, `gc_rt busy` runs started together."""
    binary = ctx.program("gc_rt_shared")
    assert binary is not None
    seconds = QUICK_WINDOW_S if ctx.quick else WINDOW_S
    outs = [ctx.work / f"busy-{tag}-{i}.bin" for i in range(load.processes)]
    argv = busy_argv(binary, seconds, load)
    procs = [
        Background([*argv, "--out", str(o)], env, ctx.work / f"busy-{tag}-{i}.log")
        for i, o in enumerate(outs)
    ]
    try:
        for p in procs:
            if not p.wait_for("ready", 120):
                break
        with UtilizationSampler(ctx.gpu.uuid) as sampler:
            for p in procs:
                p.release()  # all start together
            ran = [p.collect(seconds + 120) for p in procs]
    finally:
        for p in procs:
            p.stop()
    held, spins, bookkeeping = [], [], []
    for o in outs:
        if Path(o).is_file():
            kernels = kernels_from_bytes(Path(o).read_bytes())
            held += launch_spans(kernels, load.graph_n or 1)
            spins += spin_spans(kernels)
            bookkeeping += [e - spun for s, spun, e in kernels if s < spun <= e]
    busy, window = busy_fraction(held, TRIM_NS)
    spin_busy, _ = busy_fraction(spins, TRIM_NS)
    return Measurement(
        busy, window, ran, sampler.mean(), spin_busy, median(bookkeeping) if bookkeeping else 0.0
    )


def baseline(ctx: Context) -> Result:
    name = "compute.baseline"
    missing = ctx.missing("gc_rt_shared")
    if missing:
        return skipped(name, missing)
    m = measure(ctx, ctx.base_env(), VARIANTS["short"], "baseline")
    busy, window, ran = m.busy, m.window_ns, m.ran
    if not all(r.ok for r in ran):
        result = failed(name, f"no measurement: {next(r for r in ran if not r.ok).why()}")
        for r in ran:
            result.details += r.describe()
        return result
    result = verdict(
        name,
        all(r.ok for r in ran) and busy >= BASELINE_MIN_BUSY,
        f"unthrottled short kernels keep the GPU {busy * 100:.1f} % busy (the method needs >= "
        f"{BASELINE_MIN_BUSY * 100:.0f} %)",
        busy=busy,
        window_ns=window,
        nvml_utilization_percent=m.nvml_utilization,
        spin_busy=m.spin_busy,
        bookkeeping_ns=m.bookkeeping_ns,
    )
    for r in ran:
        result.details += r.describe()
    return result


def accuracy(ctx: Context) -> list[Result]:
    out = []
    for target in TARGETS:
        for variant, load in VARIANTS.items():
            name = f"compute.{target}pct.{variant}"
            missing = ctx.missing("gc_rt_shared", "limiter")
            if missing:
                out.append(skipped(name, missing))
                continue
            env = ctx.limiter_env(cores=target, state_dir=ctx.state_dir(name))
            m = measure(ctx, env, load, f"{target}-{variant}")
            result = judge_accuracy(name, target, m.busy, m.window_ns, m.ran)
            result.figures["nvml_utilization_percent"] = m.nvml_utilization
            result.figures["spin_busy_percent"] = round(m.spin_busy * 100, 3)
            result.figures["bookkeeping_ns"] = m.bookkeeping_ns
            if m.window_ns:
                result.summary += f"; the spins alone {m.spin_busy * 100:.2f} %"
            if m.nvml_utilization is not None:
                result.summary += f"; NVML utilization {m.nvml_utilization:.0f} %"
            out.append(result)
    return out


def judge_accuracy(name: str, target: int, busy: float, window_ns: int, ran: list[Ran]) -> Result:
    if not all(r.ok for r in ran) or window_ns == 0:
        bad = next((r for r in ran if not r.ok), None)
        result = failed(name, f"no measurement: {bad.why() if bad else 'no kernel intervals recorded'}")
    else:
        percent = busy * 100
        error = percent - target
        result = verdict(
            name,
            abs(error) <= tolerance(target),
            f"busy {percent:.2f} % for a {target} % cap (error {error:+.2f} points, "
            f"{error / target * 100:+.1f} % relative; allowed +/-{tolerance(target):.1f} points)",
            target=target,
            busy_percent=round(percent, 3),
            error_points=round(error, 3),
            relative_error=round(error / target, 4),
            window_ns=window_ns,
        )
    for r in ran:
        result.details += r.describe()
    return result
