"""The node holds every cap by itself: processes without the limiter, held by the node agent alone.

Each check runs the agent's own usage monitor (`gpucheck.enforce_agent`: `start_monitor` with the agent's
default intervals, NVML's per-process figures, the host's /proc and cgroup mount, an in-memory API server
that lists the pods) for two Limiter claims on the checked GPU, each used by one pod whose container cgroup
the check makes as the kubelet and the runtime would (`gpucheck.cgroups`: `pod<uid>/<container id>` in the
hierarchy where the agent freezes). One claim's process runs without the limiter: started without
`LD_PRELOAD`, as a container that clears its environment, or runs an executable the loader never preloads
into, would run it (the agent judges by what the process has mapped, `/proc/<pid>/maps`, so how the library
was kept out makes no difference to it). The other claim's process is an honest neighbour under the limiter,
which the node must leave alone.

- `memory.enforce`: the process without the library (`gc_drv`, driver API) allocates 2 GiB at once in a
  claim of 1 GiB. `killed_s`: from the moment it held the memory (its own CLOCK_MONOTONIC stamp) to its exit
  (SIGKILL by the watchdog), goal <= 1 s; the neighbour (a 1 GiB claim filled to its cap under the limiter)
  still holds its memory afterwards, with no Event against it.
- `compute.enforce`: the process without the library (`gc_rt` with the CUDA runtime linked statically) launches
  50 us kernels flat out in a claim whose ceiling is 30 %, beside a neighbour of 30 % under the limiter.
  `caught_s`: from its first launch to the first time its cgroup was seen frozen, goal <= 2 s;
  `share_mean`: its share of the GPU (on the GPU's timer) from then to the end, goal <= ceiling + 2 points
  (the hold's margin); `share_10s_max`: the most it held over any 10 s window of the run, the start
  included, goal <= ceiling + margin + the hold's burst over 10 s (2 points). The neighbour is never frozen.
- `enforce.node-settings`: the cgroup hierarchy the agent freezes in and whether the NVIDIA container runtime
  accepts `NVIDIA_VISIBLE_DEVICES` from unprivileged pods (a pod with no claim reaching a shared GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck import cgroups
from gpucheck.checks.compute import VARIANTS, busy_argv
from gpucheck.context import GIB, MIB, Context
from gpucheck.parse import Interval, int_of, kernels_from_bytes, key_values, launch_spans
from gpucheck.proc import Background, Ran
from gpucheck.report import KNOWN, Result, failed, judged, passed, skipped
from gpucheck.sampler import UtilizationSampler
from gpucheck.timeline import attribute

CAP = GIB
ROGUE_BYTES = 2 * GIB
"""Allocated at once by the process without the library: past its claim's cap and the agent's allowance."""
KILL_GOAL_S = 1.0
KILL_WAIT_S = 15.0
"""How long the check waits for the kill before it says there was none."""
CEILING = 30
CAUGHT_GOAL_S = 2.0
RUN_S = 12.0
QUICK_RUN_S = 6.0
WINDOW_S = 10.0
BIN_NS = 500_000_000
"""The 10 s windows slide by this much."""
MARGIN = 0.02
BURST_S = 0.2
"""The hold's margin and burst (`dra_gpu.monitor.compute_hold`) where the agent did not say them."""
AGENT_START_S = 120.0
MIN_SPANS = 10


@dataclass(frozen=True)
class ClaimSpec:
    name: str
    memory: int | None = None
    cores: int | None = None


@dataclass
class Agent:
    """What the agent's process did: its run and its one line of JSON."""

    ran: Ran | None = None
    out: dict[str, Any] = field(default_factory=dict)

    def problem(self) -> str:
        if self.ran is None:
            return "the agent did not run"
        if "error" in self.out:
            return f"the agent failed: {self.out['error']}"
        if not self.out:
            return f"the agent printed no result: {self.ran.why()}"
        return ""

    def reasons(self, claim: str) -> list[str]:
        """The reasons of the Events the watchdog wrote about `claim` (its ResourceClaim or its pod)."""
        return sorted(
            {
                str(e.get("reason"))
                for e in self.out.get("events", [])
                if e.get("name") in (claim, f"{claim}-pod")
            }
        )

    def hold(self, key: str, default: float) -> float:
        value = self.out.get("hold", {}).get(key)
        return float(value) if isinstance(value, int | float) else default


def agent_result(text: str) -> dict[str, Any]:
    """The agent's last line of JSON (what it printed before is its log)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


class Session:
    """The agent enforcing `claims`, each with its pod's container cgroup; programs started in those."""

    def __init__(self, ctx: Context, tag: str, claims: Sequence[ClaimSpec], made: cgroups.Pods) -> None:
        self.ctx = ctx
        self.tag = tag
        self.claims = {c.name: c for c in claims}
        self.made = made
        self.state = ctx.work / f"enforce-{tag}"
        self.agent = Agent()
        self.containers: dict[str, cgroups.Container] = {}
        self.ids = {c.name: cgroups.container_id() for c in claims}
        for c in claims:
            (self.state / "claims" / c.name / "limiter").mkdir(parents=True, exist_ok=True)
            (self.state / "claims" / c.name / "limiter").chmod(0o777)
        spec = {
            "node": "gpu-check-node",
            "state_dir": str(self.state),
            "gpu": ctx.gpu.uuid,
            "limiter": str(ctx.limiter) if ctx.limiter else None,
            "inventory": os.environ.get("GPU_CHECK_AGENT_INVENTORY") or "nvml",
            "claims": [
                {
                    "uid": str(uuid.uuid4()),
                    "name": c.name,
                    "memory": c.memory,
                    "cores": c.cores,
                    "pod": f"{c.name}-pod",
                    "container_id": self.ids[c.name],
                }
                for c in claims
            ],
        }
        path = self.state / "spec.json"
        path.write_text(json.dumps(spec))
        self._process = Background(
            [ctx.python, "-m", "gpucheck.enforce_agent", path],
            ctx.project_env(),
            ctx.work / f"agent-{tag}.log",
        )

    def start(self) -> str:
        """Waits for the agent; makes each pod's cgroup. Why it could not, or empty."""
        if not self._process.wait_for("ready", AGENT_START_S):
            self.stop()
            return self.agent.problem() or "the agent did not start"
        pods = json.loads(key_values(self._process.text()).get("pods", "{}"))
        for name in self.claims:
            self.containers[name] = self.made.add(name, pods[f"{name}-pod"], self.ids[name])
        return ""

    def limiter_dir(self, name: str) -> Path:
        """The claim's limiter state directory, where the agent reads its region."""
        return self.state / "claims" / name / "limiter"

    def argv(self, name: str, program: Sequence[str | Path]) -> list[str]:
        return self.containers[name].argv(program)

    def stop(self) -> Agent:
        if self.agent.ran is None:
            self.agent.ran = self._process.collect(60)
            self.agent.out = agent_result(self.agent.ran.stdout)
        return self.agent


@contextlib.contextmanager
def session(ctx: Context, tag: str, claims: Sequence[ClaimSpec]) -> Iterator[tuple[Session, str]]:
    """The agent and the pods' cgroups (removed afterwards, however the block ends); why they could not be
    set up, or empty."""
    with cgroups.pods(f"gpu-check-{tag}") as made:
        run = Session(ctx, tag, claims, made)
        try:
            yield run, run.start()
        finally:
            run.stop()


def wait_exit(process: Any, timeout_s: float) -> float | None:
    """time.monotonic() when `process` (a Popen) exited, seen through a pidfd where there is one; None if it
    is still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    fd = None
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(process.pid)
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return time.monotonic()
            if fd is not None:
                select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
                if process.poll() is not None:
                    return time.monotonic()
            else:
                time.sleep(0.002)
        return None
    finally:
        if fd is not None:
            os.close(fd)


# -- memory ------------------------------------------------------------------------------------------------
@dataclass
class MemoryOutcome:
    agent: Agent
    rogue: Ran | None = None
    honest: Ran | None = None
    held_ns: int | None = None
    """When the process without the library held its memory (CLOCK_MONOTONIC)."""
    exited_at: float | None = None
    """When it exited (time.monotonic), None while it ran on."""
    honest_alive: bool = False
    """The neighbour still ran after the other was killed."""
    setup: str = ""


def memory(ctx: Context) -> Result:
    name = "memory.enforce"
    why = ctx.missing("gc_drv", "limiter") or cgroups.why_not()
    if why:
        return skipped(name, why)
    program = ctx.program("gc_drv")
    assert program is not None
    claims = (ClaimSpec("rogue", memory=CAP), ClaimSpec("honest", memory=CAP))
    with session(ctx, "memory", claims) as (run, problem):
        outcome = MemoryOutcome(run.agent, setup=problem)
        if not problem:
            honest = Background(
                run.argv("honest", [program, "family", "mem", str(64 * MIB), str(2 * CAP), "--hold"]),
                ctx.limiter_env(memory=CAP, state_dir=run.limiter_dir("honest")),
                ctx.work / "enforce-memory-honest.log",
            )
            try:
                if honest.wait_for("holding", 120):
                    outcome = run_rogue(ctx, run, program, honest, outcome)
                else:
                    outcome.setup = (
                        f"the neighbour under the limiter did not start holding: {honest.text()[-300:]}"
                    )
                outcome.honest = honest.collect(30)
            finally:
                honest.stop()
        run.stop()
    return judge_memory(name, outcome)


def run_rogue(
    ctx: Context, run: Session, program: Path, honest: Background, outcome: MemoryOutcome
) -> MemoryOutcome:
    rogue = Background(
        run.argv("rogue", [program, "family", "mem", str(ROGUE_BYTES), str(ROGUE_BYTES), "--hold"]),
        ctx.base_env(),
        ctx.work / "enforce-memory-rogue.log",
    )
    try:
        outcome.exited_at = wait_exit(rogue.process, KILL_WAIT_S)
        outcome.honest_alive = honest.process.poll() is None
        outcome.rogue = rogue.collect(10)
    finally:
        rogue.stop()
    outcome.held_ns = int_of(key_values(outcome.rogue.stdout), "held_ns")
    return outcome


def judge_memory(name: str, o: MemoryOutcome) -> Result:
    if o.setup or o.agent.problem():
        result = failed(name, f"no measurement: {o.setup or o.agent.problem()}")
        result.details += _details(o.agent, o.rogue, o.honest)
        return result
    rogue_values = key_values(o.rogue.stdout) if o.rogue else {}
    killed = o.rogue is not None and o.rogue.rc == -9
    killed_s = (
        round(o.exited_at - o.held_ns / 1e9, 3) if killed and o.exited_at is not None and o.held_ns else None
    )
    rogue_reasons = o.agent.reasons("rogue")
    honest_reasons = o.agent.reasons("honest")
    honest_values = key_values(o.honest.stdout) if o.honest else {}
    honest_ok = o.honest_alive and o.honest is not None and o.honest.ok and not honest_reasons
    problems = []
    if o.held_ns is None and not killed:
        problems.append(
            f"the process without the library never held its {ROGUE_BYTES // MIB} MiB: {_why(o.rogue)}"
        )
    elif not killed:
        problems.append(
            f"the process without the library held {ROGUE_BYTES // MIB} MiB in a claim of {CAP // MIB} MiB and was "
            f"not killed within {KILL_WAIT_S:g} s ({_why(o.rogue)})"
        )
    elif killed_s is None:
        problems.append("the process without the library was killed before it said it held its memory")
    elif killed_s > KILL_GOAL_S:
        problems.append(f"killed {killed_s:.3f} s after it went over its cap (goal <= {KILL_GOAL_S:g} s)")
    if killed and "MemoryOverLimit" not in rogue_reasons:
        problems.append(
            f"killed, but no MemoryOverLimit Event names its claim (Events: {rogue_reasons or 'none'})"
        )
    if not o.honest_alive or o.honest is None or not o.honest.ok:
        problems.append(
            f"the neighbour under the limiter was touched: {_why(o.honest) if o.honest else 'gone'}"
        )
    if honest_reasons:
        problems.append(f"Events against the neighbour under the limiter: {', '.join(honest_reasons)}")
    figures: dict[str, Any] = {
        "killed_s": killed_s,
        "goal_s": KILL_GOAL_S,
        "cap_bytes": CAP,
        "rogue_bytes": ROGUE_BYTES,
        "rogue_exit": None if o.rogue is None else o.rogue.rc,
        "rogue_events": rogue_reasons,
        "honest_allocated_bytes": int_of(honest_values, "allocated"),
        "honest_untouched": honest_ok,
        "honest_events": honest_reasons,
        "watch_interval_s": o.agent.out.get("watch_interval_s"),
        "rogue_allocated_bytes": int_of(rogue_values, "allocated"),
    }
    result = judged(
        name,
        problems,
        lambda: (
            f"a process without the library went {ROGUE_BYTES // MIB} MiB into a claim of {CAP // MIB} MiB: killed "
            f"{killed_s:.3f} s later (goal <= {KILL_GOAL_S:g} s, the agent watching every "
            f"{o.agent.out.get('watch_interval_s')} s); the neighbour under the limiter at its cap untouched"
        ),
        **figures,
    )
    result.details += _details(o.agent, o.rogue, o.honest)
    return result


# -- compute -----------------------------------------------------------------------------------------------
@dataclass
class ComputeOutcome:
    agent: Agent
    started: float = 0.0
    """time.monotonic() when both were released."""
    first_frozen: dict[str, float] = field(default_factory=dict)
    freezes: dict[str, int] = field(default_factory=dict)
    frozen_s: dict[str, float] = field(default_factory=dict)
    spans: dict[str, list[Interval]] = field(default_factory=dict)
    ran: dict[str, Ran] = field(default_factory=dict)
    nvml_utilization: float | None = None
    setup: str = ""


def compute(ctx: Context) -> Result:
    name = "compute.enforce"
    why = ctx.missing("gc_rt_static", "gc_rt_shared", "limiter") or cgroups.why_not()
    if why:
        return skipped(name, why)
    seconds = QUICK_RUN_S if ctx.quick else RUN_S
    claims = (ClaimSpec("hog", cores=CEILING), ClaimSpec("honest", cores=CEILING))
    outs = {c.name: ctx.work / f"enforce-compute-{c.name}.bin" for c in claims}
    with session(ctx, "compute", claims) as (run, problem):
        outcome = ComputeOutcome(run.agent, setup=problem)
        if not problem:
            outcome = run_compute(ctx, run, seconds, outs, outcome)
        run.stop()
    for uid, out in outs.items():
        data = out.read_bytes() if out.is_file() else b""
        outcome.spans[uid] = launch_spans(kernels_from_bytes(data), 1)
    return judge_compute(name, outcome)


def run_compute(
    ctx: Context, run: Session, seconds: float, outs: dict[str, Path], outcome: ComputeOutcome
) -> ComputeOutcome:
    static, shared = ctx.program("gc_rt_static"), ctx.program("gc_rt_shared")
    assert static is not None and shared is not None
    load = VARIANTS["short"]
    procs = {
        "hog": Background(
            run.argv("hog", [*busy_argv(static, seconds, load), "--out", outs["hog"]]),
            ctx.base_env(),
            ctx.work / "enforce-compute-hog.log",
        ),
        "honest": Background(
            run.argv("honest", [*busy_argv(shared, seconds, load), "--out", outs["honest"]]),
            ctx.limiter_env(cores=CEILING, state_dir=run.limiter_dir("honest")),
            ctx.work / "enforce-compute-honest.log",
        ),
    }
    try:
        for n, p in procs.items():
            if not p.wait_for("ready", 120):
                outcome.setup = f"{n} did not get ready: {p.text()[-300:]}"
                return outcome
        with cgroups.Watcher(run.containers) as watch, UtilizationSampler(ctx.gpu.uuid) as sampler:
            outcome.started = time.monotonic()
            for p in procs.values():
                p.release()
            outcome.ran = {n: p.collect(seconds + 120) for n, p in procs.items()}
        outcome.first_frozen, outcome.freezes, outcome.frozen_s = (
            watch.first_frozen,
            watch.freezes,
            watch.frozen_s,
        )
        outcome.nvml_utilization = sampler.mean()
    finally:
        for p in procs.values():
            p.stop()
    return outcome


@dataclass(frozen=True)
class Shares:
    caught_s: float | None
    share_mean: float | None
    """Percent of the GPU from the first freeze to the end."""
    share_10s_max: float
    share_run: float
    window_s: float
    run_s: float
    honest_share: float


def shares(o: ComputeOutcome) -> Shares:
    """The hog's shares of the GPU on its timer (where its kernels overlap the neighbour's, the one started last
    ran), from its first kernel's start to its last kernel's end."""
    hog = o.spans["hog"]
    lo, hi = min(s for s, _ in hog), max(e for _, e in hog)
    bins = attribute(o.spans, lo, hi, BIN_NS)
    per = max(1, min(len(bins["hog"]), round(WINDOW_S * 1e9 / BIN_NS)))
    window_ns = min(per * BIN_NS, hi - lo)
    most = max(sum(bins["hog"][i : i + per]) for i in range(max(1, len(bins["hog"]) - per + 1)))
    caught = o.first_frozen.get("hog")
    caught_s = None if caught is None else max(0.0, caught - o.started)
    share_mean = None
    if caught_s is not None and lo + int(caught_s * 1e9) < hi:
        start = lo + int(caught_s * 1e9)
        share_mean = attribute(o.spans, start, hi, hi - start)["hog"][0] / (hi - start) * 100
    return Shares(
        caught_s=None if caught_s is None else round(caught_s, 3),
        share_mean=None if share_mean is None else round(share_mean, 2),
        share_10s_max=round(most / window_ns * 100, 2),
        share_run=round(sum(bins["hog"]) / (hi - lo) * 100, 2),
        window_s=round(window_ns / 1e9, 2),
        run_s=round((hi - lo) / 1e9, 2),
        honest_share=round(sum(bins.get("honest", [0])) / (hi - lo) * 100, 2),
    )


def judge_compute(name: str, o: ComputeOutcome) -> Result:
    problem = o.setup or o.agent.problem()
    if not problem:
        bad = next((f"{n}: {r.why()}" for n, r in o.ran.items() if not r.ok), "")
        error = next(
            (f"{n}: gc_rt: {v}" for n, r in o.ran.items() if (v := key_values(r.stdout).get("error"))), ""
        )
        few = next((f"{n} recorded {len(s)} kernels" for n, s in o.spans.items() if len(s) < MIN_SPANS), "")
        problem = bad or error or few
    if problem:
        result = failed(name, f"no measurement: {problem}")
        result.details += _details(o.agent, *o.ran.values())
        return result
    s = shares(o)
    margin, burst = o.agent.hold("margin", MARGIN) * 100, o.agent.hold("burst_s", BURST_S)
    mean_goal = CEILING + margin
    window_goal = CEILING + margin + burst / s.window_s * 100
    problems = []
    if s.caught_s is None:
        problems.append(
            f"never frozen: it held {s.share_run:.1f} % of the GPU over {s.run_s:g} s (ceiling {CEILING} %)"
        )
    else:
        if s.caught_s > CAUGHT_GOAL_S:
            problems.append(f"first frozen {s.caught_s:.2f} s after it started (goal <= {CAUGHT_GOAL_S:g} s)")
        if s.share_mean is not None and s.share_mean > mean_goal:
            problems.append(f"held {s.share_mean:.1f} % once caught (goal <= {mean_goal:g} %)")
    if s.share_10s_max > window_goal:
        problems.append(
            f"held {s.share_10s_max:.1f} % over its worst {s.window_s:g} s (goal <= {window_goal:g} %)"
        )
    if o.freezes.get("honest"):
        problems.append(f"the neighbour under the limiter was frozen {o.freezes['honest']} times")
    figures: dict[str, Any] = {
        "caught_s": s.caught_s,
        "caught_goal_s": CAUGHT_GOAL_S,
        "ceiling_percent": CEILING,
        "share_mean": s.share_mean,
        "share_mean_goal": round(mean_goal, 2),
        "share_10s_max": s.share_10s_max,
        "share_10s_goal": round(window_goal, 2),
        "window_s": s.window_s,
        "share_run": s.share_run,
        "run_s": s.run_s,
        "freezes": o.freezes.get("hog", 0),
        "frozen_s": round(o.frozen_s.get("hog", 0.0), 3),
        "honest_share": s.honest_share,
        "honest_freezes": o.freezes.get("honest", 0),
        "nvml_utilization_percent": o.nvml_utilization,
        "agent_accounts": o.agent.out.get("accounts", {}),
        "hog_events": o.agent.reasons("hog"),
        "honest_events": o.agent.reasons("honest"),
    }
    result = judged(
        name,
        problems,
        lambda: (
            f"a process without the library flat out in a claim of {CEILING} %: frozen {s.caught_s:.2f} s after it "
            f"started (goal <= {CAUGHT_GOAL_S:g} s), then {s.share_mean} % (goal <= {mean_goal:g} %), at most "
            f"{s.share_10s_max:.1f} % over {s.window_s:g} s (goal <= {window_goal:g} %); the neighbour under the "
            f"limiter ({s.honest_share:.1f} %) never frozen"
        ),
        **figures,
    )
    result.details += _details(o.agent, *o.ran.values())
    return result


# -- the node's settings -----------------------------------------------------------------------------------
def node_settings(ctx: Context) -> Result:
    name = "enforce.node-settings"
    found, why = cgroups.hierarchy()
    accepts, detail = cgroups.toolkit_setting()
    figures: dict[str, Any] = {
        "cgroup_version": None if found is None else found.version,
        "freezer": None if found is None else str(found.path),
        "toolkit_accepts_envvar": accepts,
        "toolkit": detail,
    }
    where = (
        why
        if found is None
        else f"containers frozen through cgroup v{found.version} ({found.path})"
        + ("" if found.version == 2 else ": a frozen process gets SIGKILL only once thawed")
    )
    if accepts is None:
        return skipped(name, f"{where}; no NVIDIA container runtime config ({detail})", **figures)
    if accepts:
        return Result(
            name,
            KNOWN,
            f"{where}; the NVIDIA container runtime accepts NVIDIA_VISIBLE_DEVICES from unprivileged pods "
            f"({detail}): a pod with no claim reaches a shared GPU and only the agent stops it "
            "(ProcessWithoutClaim); set it to false",
            figures,
        )
    return passed(name, f"{where}; {detail}", **figures)


def _why(ran: Ran | None) -> str:
    if ran is None:
        return "it did not run"
    return ran.why() if not ran.ok else "exit 0"


def _details(agent: Agent, *runs: Ran | None) -> list[str]:
    out = [line for r in runs if r is not None for line in r.describe()]
    if agent.ran is not None:
        out += agent.ran.describe()
    return out
