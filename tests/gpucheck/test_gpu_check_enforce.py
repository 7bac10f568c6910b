"""The GPU check's enforcement results (`memory.enforce`, `compute.enforce`, `enforce.node-settings`): how each
is judged from given figures; the pods' cgroups made, frozen as the agent freezes them, and removed, on this
host's real hierarchy; the agent's monitor holding a process that runs flat out without the library in such a
cgroup (fake NVML, a process whose GPU time is its CPU time); and `memory.enforce` end to end against the
limiter's fake CUDA driver and fake NVML."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import fake_pynvml
from repo_paths import ROOT
from waiting import wait_for

sys.path.insert(0, str(ROOT))

from dra_gpu.monitor.freezer import CgroupFreezer, freezer_of
from dra_gpu.monitor.process_owner import PodRef, parse_cgroup
from gpucheck import cgroups, enforce_agent, report
from gpucheck.checks import enforce
from gpucheck.checks.enforce import Agent, ComputeOutcome, MemoryOutcome
from gpucheck.context import Context
from gpucheck.gpu import Gpu
from gpucheck.proc import Ran

UUID = "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000"
"""The fake driver's device 0."""
MS = 1_000_000
S = 1_000_000_000
FAKE = ROOT / "native/limiter/build/fake"


def _agent(*events: tuple[str, str], **out: Any) -> Agent:
    """The agent's output with Events (reason, object name)."""
    body: dict[str, Any] = {
        "events": [{"reason": r, "kind": "Pod", "name": n, "message": ""} for r, n in events]
    }
    body.update({"hold": {"margin": 0.02, "burst_s": 0.2}, "watch_interval_s": 1.0, **out})
    return Agent(Ran(["agent"], 0, json.dumps(body), "", 1.0), body)


HELD_NS = 5_000 * S
ROGUE_KILLED = Ran(["gc_drv"], -9, f"allocated={2**31}\nheld_ns={HELD_NS}\nholding\n", "", 1.0)
HONEST = Ran(["gc_drv"], 0, "allocated=524288000\nstopped=refused\nheld_ns=1\nholding\n", "", 3.0)


def _memory(**changes: Any) -> MemoryOutcome:
    outcome = MemoryOutcome(
        _agent(
            ("LimiterMissing", "rogue-pod"), ("MemoryOverLimit", "rogue-pod"), ("MemoryOverLimit", "rogue")
        ),
        rogue=ROGUE_KILLED,
        honest=HONEST,
        held_ns=HELD_NS,
        exited_at=HELD_NS / 1e9 + 0.4,
        honest_alive=True,
    )
    for key, value in changes.items():
        setattr(outcome, key, value)
    return outcome


# -- memory.enforce, judged ------------------------------------------------------------------------------------
def test_a_process_killed_within_a_second_of_going_over_passes_and_the_neighbour_is_untouched() -> None:
    result = enforce.judge_memory("memory.enforce", _memory())
    assert result.status == report.PASS, result.summary
    assert result.figures["killed_s"] == pytest.approx(0.4)
    assert result.figures["rogue_events"] == ["LimiterMissing", "MemoryOverLimit"]
    assert result.figures["honest_untouched"] is True
    assert "killed 0.400 s later" in result.summary


def test_a_kill_later_than_a_second_fails_saying_how_late() -> None:
    result = enforce.judge_memory("memory.enforce", _memory(exited_at=HELD_NS / 1e9 + 1.6))
    assert result.status == report.FAIL
    assert "killed 1.600 s after it went over its cap (goal <= 1 s)" in result.summary


def test_a_process_that_is_never_killed_fails() -> None:
    lived = Ran(["gc_drv"], 0, f"held_ns={HELD_NS}\nholding\n", "", 16.0)
    result = enforce.judge_memory("memory.enforce", _memory(rogue=lived, exited_at=None))
    assert result.status == report.FAIL
    assert "was not killed within 15 s" in result.summary
    assert result.figures["killed_s"] is None


def test_a_kill_without_a_memory_event_fails() -> None:
    result = enforce.judge_memory("memory.enforce", _memory(agent=_agent(("LimiterMissing", "rogue-pod"))))
    assert result.status == report.FAIL
    assert "no MemoryOverLimit Event names its claim" in result.summary


@pytest.mark.parametrize(
    "changes",
    [
        {"honest_alive": False},
        {"honest": Ran(["gc_drv"], -9, "holding\n", "", 1.0)},
        {"agent": _agent(("MemoryOverLimit", "rogue"), ("MemoryOverLimit", "honest-pod"))},
    ],
    ids=["gone", "killed", "named-in-an-event"],
)
def test_a_neighbour_under_the_limiter_that_was_touched_fails(changes: dict[str, Any]) -> None:
    result = enforce.judge_memory("memory.enforce", _memory(**changes))
    assert result.status == report.FAIL
    assert "neighbour under the limiter" in result.summary
    assert result.figures["honest_untouched"] is False


def test_an_agent_that_could_not_run_is_no_measurement_with_its_error() -> None:
    broken = Agent(Ran(["agent"], 1, '{"error": "InventoryError: NVML failed"}', "", 1.0))
    broken.out = enforce.agent_result(broken.ran.stdout if broken.ran else "")
    result = enforce.judge_memory("memory.enforce", _memory(agent=broken))
    assert result.status == report.FAIL
    assert result.summary == "no measurement: the agent failed: InventoryError: NVML failed"


# -- compute.enforce, judged -----------------------------------------------------------------------------------
def _duty(start_s: float, end_s: float, on_ms: float, period_ms: float = 10.0, phase_ms: float = 0.0) -> list:
    """Spans of `on_ms` every `period_ms` from `start_s` to `end_s`."""
    out = []
    t = int(start_s * S + phase_ms * MS)
    while t < end_s * S:
        out.append((t, t + int(on_ms * MS)))
        t += int(period_ms * MS)
    return out


def _compute(caught_s: float | None, after: float, honest_freezes: int = 0, **agent: Any) -> ComputeOutcome:
    """The hog flat out until caught, frozen 1.1 s to repay, then `after` percent; the neighbour at 20 %
    in the hog's gaps; 12 s in all."""
    caught = 1.0 if caught_s is None else caught_s
    hog = _duty(0, caught, 10.0)
    if caught_s is not None:
        hog += _duty(caught + 1.1, 12.0, after / 10)
    honest = _duty(0, 12.0, 2.0, phase_ms=7.5)
    outcome = ComputeOutcome(
        _agent(**agent),
        started=100.0,
        first_frozen={} if caught_s is None else {"hog": 100.0 + caught_s},
        freezes={"hog": 0 if caught_s is None else 5, "honest": honest_freezes},
        spans={"hog": hog, "honest": honest},
        ran={n: Ran(["gc_rt"], 0, "launches=1", "", 12.0) for n in ("hog", "honest")},
    )
    return outcome


def test_a_process_caught_within_two_seconds_and_held_to_its_ceiling_passes() -> None:
    result = enforce.judge_compute("compute.enforce", _compute(1.0, 30.0))
    assert result.status == report.PASS, result.summary
    assert result.figures["caught_s"] == pytest.approx(1.0)
    assert result.figures["share_mean"] == pytest.approx(30 * 9.9 / 11, abs=0.5), "the repaying freeze counts"
    assert result.figures["share_10s_max"] <= result.figures["share_10s_goal"] == pytest.approx(34.0)
    assert result.figures["window_s"] == 10.0
    assert result.figures["honest_freezes"] == 0


def test_a_process_never_frozen_fails_with_the_share_it_took() -> None:
    result = enforce.judge_compute("compute.enforce", _compute(None, 0.0))
    assert result.status == report.FAIL
    assert result.summary.startswith("never frozen: it held")
    assert result.figures["caught_s"] is None


def test_a_process_caught_late_fails() -> None:
    result = enforce.judge_compute("compute.enforce", _compute(2.5, 30.0))
    assert result.status == report.FAIL
    assert "first frozen 2.50 s after it started (goal <= 2 s)" in result.summary


def test_a_process_held_above_its_ceiling_and_margin_fails_and_the_worst_window_too() -> None:
    result = enforce.judge_compute("compute.enforce", _compute(1.0, 40.0))
    assert result.status == report.FAIL
    assert "once caught (goal <= 32 %)" in result.summary
    assert "over its worst 10 s (goal <= 34 %)" in result.summary


def test_the_goals_follow_the_agents_hold() -> None:
    result = enforce.judge_compute(
        "compute.enforce", _compute(1.0, 30.0, hold={"margin": 0.05, "burst_s": 0.5})
    )
    assert result.figures["share_mean_goal"] == pytest.approx(35.0)
    assert result.figures["share_10s_goal"] == pytest.approx(40.0)


def test_a_neighbour_under_the_limiter_that_was_frozen_fails() -> None:
    result = enforce.judge_compute("compute.enforce", _compute(1.0, 30.0, honest_freezes=2))
    assert result.status == report.FAIL
    assert "the neighbour under the limiter was frozen 2 times" in result.summary


def test_a_run_without_kernels_is_no_measurement() -> None:
    outcome = _compute(1.0, 30.0)
    outcome.spans["hog"] = []
    outcome.ran["hog"] = Ran(["gc_rt"], 0, "error=cudaErrorNoDevice\n", "", 1.0)
    result = enforce.judge_compute("compute.enforce", outcome)
    assert result.status == report.FAIL
    assert result.summary == "no measurement: hog: gc_rt: cudaErrorNoDevice"


# -- the node's settings, and what cannot run --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "accepts"),
    [
        ("[nvidia-container-cli]\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n", False),
        ("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", True),
        ("#accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", True),
        ("disable-require = false\n", True),
    ],
    ids=["false", "true", "commented-out", "unset"],
)
def test_the_container_runtimes_setting_is_read_as_it_reads_it(
    tmp_path: Path, text: str, accepts: bool
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    assert cgroups.toolkit_setting(config)[0] is accepts


def test_node_settings_pass_only_where_unprivileged_pods_cannot_name_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctx: Context
) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setattr(cgroups, "TOOLKIT_CONFIG", config)
    assert enforce.node_settings(ctx).status == report.SKIP
    config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
    assert enforce.node_settings(ctx).status == report.PASS
    config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n")
    result = enforce.node_settings(ctx)
    assert result.status == report.KNOWN
    assert "a pod with no claim reaches a shared GPU" in result.summary
    assert result.figures["cgroup_version"] in (1, 2)


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    gpu = Gpu(0, UUID, "NVIDIA H200", 143771 * 2**20, "580.95.05")
    (tmp_path / "work").mkdir()
    return Context(root=ROOT, build=tmp_path, out=tmp_path, gpu=gpu, work=tmp_path / "work", quick=True)


def test_without_the_programs_the_limiter_or_root_each_check_is_skipped_with_why(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx.limiter_error = "make failed"
    assert enforce.memory(ctx).summary == "gc_drv: not built"
    ctx.programs.update({"gc_drv": Path("x"), "gc_rt_static": Path("x"), "gc_rt_shared": Path("x")})
    for result in (enforce.memory(ctx), enforce.compute(ctx)):
        assert (result.status, result.summary) == (report.SKIP, "make failed")
    ctx.limiter = Path("libdragpu.so")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert enforce.compute(ctx).summary == "making and freezing cgroups needs root"


# -- the pods' cgroups on this host ------------------------------------------------------------------------------
needs_cgroups = pytest.mark.skipif(
    bool(cgroups.why_not()), reason=f"cannot make cgroups here: {cgroups.why_not()}"
)


def _sleeper(argv: list[str]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


SLEEPER = [sys.executable, "-c", "import time\nprint('ready', flush=True)\ntime.sleep(300)"]
SPINNER = [sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"]


@needs_cgroups
def test_a_program_starts_in_its_pods_cgroup_where_the_agent_finds_and_freezes_it() -> None:
    with cgroups.pods("gpu-check-test") as made:
        top = made.top
        pod_uid, cid = "0b7c5f2e-9c1d-4d2a-8e3f-112233445566", cgroups.container_id()
        container = made.add("a", pod_uid, cid)
        child = _sleeper(container.argv(SLEEPER))
        try:
            text = Path(f"/proc/{child.pid}/cgroup").read_text()
            assert parse_cgroup(text) == PodRef(pod_uid, cid), "the agent's reading of the pod and container"
            freezer = freezer_of(text)
            assert freezer == CgroupFreezer(str(container.directory), made.hierarchy.version)
            assert container.pids() == [child.pid] and container.frozen() is False
            with cgroups.Watcher({"a": container}) as watch:
                freezer.freeze()
                wait_for(lambda: watch.freezes.get("a"), what="the freeze to be seen")
                freezer.thaw()
                wait_for(lambda: container.frozen() is False, what="the thaw")
            assert watch.freezes["a"] == 1 and "a" in watch.first_frozen
            freezer.freeze()  # left frozen: removing the pods still ends the process and the directories
        finally:
            made.remove()
            child.wait(timeout=10)
    assert child.returncode == -9
    assert not top.exists()


# -- the agent's monitor, holding a process in such a cgroup ---------------------------------------------------
@pytest.fixture
def fake_nvml() -> Iterator[fake_pynvml.FakeDriver]:
    driver = fake_pynvml.FakeDriver(gpus=[fake_pynvml.FakeGpu(uuid=UUID)])
    fake_pynvml.install(driver)
    try:
        yield driver
    finally:
        fake_pynvml.install(None)


@pytest.mark.slow
@needs_cgroups
def test_the_agent_freezes_a_process_running_past_its_ceiling_and_never_the_neighbour(
    tmp_path: Path, fake_nvml: fake_pynvml.FakeDriver
) -> None:
    """`enforce_agent.serve` as the check runs it, with NVML's per-process figures from the fake: the hog's GPU
    time is its CPU time (flat out), the neighbour's none; only the hog's cgroup is frozen."""
    claims = [("hog", 5), ("honest", 5)]  # a ceiling a flat-out process passes on a loaded machine
    ids = {name: cgroups.container_id() for name, _ in claims}
    spec = {
        "node": "gpu-check-node",
        "state_dir": str(tmp_path),
        "gpu": UUID,
        "limiter": None,
        "claims": [
            {
                "uid": f"uid-{n}",
                "name": n,
                "memory": None,
                "cores": c,
                "pod": f"{n}-pod",
                "container_id": ids[n],
            }
            for n, c in claims
        ],
    }
    seen: dict[str, Any] = {}

    def body(pods: dict[str, str]) -> None:
        with cgroups.pods("gpu-check-test") as made:
            containers = {n: made.add(n, pods[f"{n}-pod"], ids[n]) for n, _ in claims}
            # A tenant's pod on the node, not the check's: its process on the GPU must be left alone.
            tenant_cgroup = made.add("tenant", str(uuid.uuid4()), cgroups.container_id())
            hog = _sleeper(containers["hog"].argv(SPINNER))
            honest = _sleeper(containers["honest"].argv(SLEEPER))
            tenant = _sleeper(tenant_cgroup.argv(SPINNER))
            gpu = fake_nvml.gpus[0]
            for child in (hog, honest, tenant):
                gpu.processes[child.pid] = 2**30
                gpu.runs_on_cpu[child.pid] = (0, 0)
            gpu.processes[tenant.pid] = 70 * 2**30
            try:
                with cgroups.Watcher({**containers, "tenant": tenant_cgroup}) as watch:
                    wait_for(lambda: watch.freezes.get("hog"), 60, "the hog to be frozen")
                    wait_for(lambda: watch.freezes["hog"] >= 2, 60, "a second freeze")
                seen.update(freezes=dict(watch.freezes), top=made.top, tenant=tenant.poll())
            finally:
                for child in (hog, honest, tenant):
                    child.kill()
                    child.wait()

    out = enforce_agent.serve(spec, body, inventory=enforce_agent.CheckedGpu(UUID), nvml=fake_pynvml)
    assert seen["freezes"]["hog"] >= 1
    assert seen["freezes"]["honest"] == 0
    assert seen["tenant"] is None and seen["freezes"]["tenant"] == 0, "another pod's process: never touched"
    assert out["accounts"]["uid-hog"]["freezes"] >= 1
    assert {e["reason"] for e in out["events"] if e["name"] == "hog"} >= {"ComputeOverCeiling"}
    assert not [e for e in out["events"] if e["name"] in ("honest", "honest-pod")]
    assert out["hold"] == {"margin": 0.02, "burst_s": 0.2, "max_freeze_s": 2.0}
    assert not seen["top"].exists()


def test_the_agent_quotes_what_stopped_it_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"node": "n", "state_dir": str(tmp_path), "gpu": UUID, "claims": [], "inventory": "x"})
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpucheck.enforce_agent", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1
    assert enforce.agent_result(done.stdout)["error"].startswith("InventoryError: unknown inventory 'x'")


# -- memory.enforce end to end against the fakes -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.limiter
@needs_cgroups
@pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA programs cannot be built"
)
@pytest.mark.usefixtures("built")  # builds the limiter and its fake driver; fails if they do not build
def test_memory_enforce_end_to_end_against_the_fake_driver(tmp_path: Path) -> None:
    """`python3 -m gpucheck --only memory.enforce` with the limiter's fake CUDA driver (which publishes what each
    process holds) and fake NVML (which lists it): the process without the library is killed by the agent,
    the neighbour under the limiter is not, and no cgroup is left."""
    assert importlib.util.find_spec("pynvml"), "the fake GPU is found through NVML: install nvidia-ml-py"
    (tmp_path / "procs").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CHECK_", "DRAGPU_"))}
    env.update(
        LD_LIBRARY_PATH=str(FAKE),
        FAKE_CUDA_PROCESS_DIR=str(tmp_path / "procs"),
        GPU_CHECK_OUT=str(tmp_path / "out"),
        GPU_CHECK_AGENT_INVENTORY="checked",
    )
    hierarchy = cgroups.hierarchy()[0]
    assert hierarchy is not None
    done = subprocess.run(
        [sys.executable, "-m", "gpucheck", "--only", "memory.enforce"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    data = json.loads((tmp_path / "out/report.json").read_text())
    result = data["results"][0]
    assert result["name"] == "memory.enforce"
    figures = result["figures"]
    assert figures["rogue_exit"] == -9, done.stdout
    assert "MemoryOverLimit" in figures["rogue_events"], done.stdout
    assert figures["honest_untouched"] is True and figures["honest_events"] == [], done.stdout
    assert figures["killed_s"] is not None and figures["killed_s"] > 0
    left = [n for n in os.listdir(hierarchy.path) if n.startswith("gpu-check-memory-")]
    assert not left, "the pods' cgroups were removed"


def test_wait_exit_sees_the_exit() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert enforce.wait_exit(child, 60) is not None
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert enforce.wait_exit(sleeping, 0.05) is None
    finally:
        sleeping.kill()
        sleeping.wait()


# -- compute.enforce end to end against the fake NVML -------------------------------------------------------------
FAKE_BUSY = r"""
import mmap, os, struct, sys, time
# `gc_rt busy SECONDS KERNEL_US --ready --out FILE` as a process whose GPU work is its CPU time: it publishes that
# time where the limiter's fake driver publishes a process's kernel time (FAKE_CUDA_PROCESS_DIR/<pid>), so the
# fake NVML reports it as the process's utilization, and writes each 10 ms "kernel" as (start, spun, end), its
# end what it ran (a frozen process runs nothing). Flat out; under the limiter's environment, 0.8 of its share.
args = sys.argv[1:]
seconds, out = float(args[1]), args[args.index("--out") + 1]
duty = 0.8 * float(os.environ["DRAGPU_CORES_LIMIT"]) / 100 if os.environ.get("DRAGPU_CORES_LIMIT") else 1.0
size = 32 + 8 * 80
fd = os.open(os.path.join(os.environ["FAKE_CUDA_PROCESS_DIR"], str(os.getpid())), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, size)
page = mmap.mmap(fd, size)
def publish(busy):
    struct.pack_into("<48sQQQQ", page, 32, os.environ["CUDA_VISIBLE_DEVICES"].encode(), 1 << 30, busy, time.monotonic_ns(), 0)
struct.pack_into("<IIQQ", page, 8, os.getpid(), 1, 0, 0)
publish(0)
struct.pack_into("<Q", page, 0, 0x31434F5250414446)
print("ready", flush=True)
sys.stdin.read(1)
kernels, started, cpu0 = [], time.monotonic(), time.thread_time_ns()
while time.monotonic() - started < seconds:
    t0, c0 = time.monotonic_ns(), time.thread_time_ns()
    while time.thread_time_ns() - c0 < duty * 10_000_000:
        pass
    ran = time.thread_time_ns() - c0
    kernels.append((t0, t0 + ran, t0 + ran))
    publish(time.thread_time_ns() - cpu0)
    time.sleep((1 - duty) * 0.01)
with open(out, "wb") as f:
    f.writelines(struct.pack("<QQQ", *k) for k in kernels)
print(f"launches={len(kernels)}")
"""


@pytest.mark.slow
@pytest.mark.limiter
@needs_cgroups
def test_compute_enforce_end_to_end_against_the_fake_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctx: Context, built: Path
) -> None:
    """`compute.enforce` as gpu-check runs it: the agent in its own process, NVML the limiter's fake (a process's
    utilization is what it published), the workloads stand-ins whose GPU time is their CPU time. The one without
    the library is frozen and held back; the neighbour under the limiter's environment is not."""
    busy = tmp_path / "gc_rt"
    busy.write_text(f"#!{sys.executable}\n{FAKE_BUSY}")
    busy.chmod(0o755)
    ctx.programs.update({"gc_rt_static": busy, "gc_rt_shared": busy})
    ctx.limiter = built / "libdragpu-limiter.so"
    ctx.python = sys.executable
    ctx.pythonpath = [ROOT, ROOT / "src"]
    ctx.quick = False  # the fake NVML's first figure for a process needs two reads: the catch comes late
    # The stand-ins' GPU is this machine's CPU, shared with whatever else runs here: a ceiling of 5 % is one that
    # a flat-out process passes however loaded the machine is.
    monkeypatch.setattr(enforce, "CEILING", 5)
    (tmp_path / "procs").mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", str(FAKE))
    monkeypatch.setenv("FAKE_CUDA_PROCESS_DIR", str(tmp_path / "procs"))
    monkeypatch.setenv("GPU_CHECK_AGENT_INVENTORY", "checked")
    result = enforce.compute(ctx)
    figures = result.figures
    assert figures.get("caught_s") is not None, (result.summary, result.details)
    assert figures["freezes"] >= 1 and figures["frozen_s"] > 0
    assert "ComputeOverCeiling" in figures["hog_events"]
    assert figures["ceiling_percent"] == 5
    # Held back once caught: less than over the whole run, which includes its time flat out before. (Not to its
    # ceiling: the agent freezes and thaws only at its watches, once a second, for at most 2 s at a time, which
    # leaves a flat-out process about a third of the time whatever its ceiling; the real GPU's figure is the
    # check's to report.)
    assert figures["share_mean"] < figures["share_run"], "held back once caught"
    assert figures["honest_freezes"] == 0 and figures["honest_events"] == [], result.summary
    hierarchy = cgroups.hierarchy()[0]
    assert hierarchy is not None
    assert not [n for n in os.listdir(hierarchy.path) if n.startswith("gpu-check-compute-")]
