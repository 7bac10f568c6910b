"""The node holds a claim's GPU time to its ceiling with the kernel's freezer: a claim that runs past its
ceiling (a process that bypasses the library) is frozen in a duty cycle that brings its long-run share back
and repays what it took; an honest claim is never frozen. One freezer interface for cgroup v2 and v1."""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.fake_cgroup import FakeCgroupTree
from monitor_harness import add_pod, fake_proc, plugin_with_nvml
from plugin_harness import Alloc, Kubelet, PluginDirs, add_claim, monitor_of, opaque, uid_of
from test_monitor import _events, limiter_config
from waiting import wait_for

from dra_gpu.kube.fake import FakeKube
from dra_gpu.monitor import Monitor, PodDirectory
from dra_gpu.monitor.compute_hold import BURST_S, MARGIN, MAX_FREEZE_S, WINDOW_S, ComputeHold
from dra_gpu.monitor.freezer import RECORDS_DIR, CgroupFreezer, freezer_of, namespace_root
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.watchdog import Watchdog

CGROUP = Path("/sys/fs/cgroup")


class FakeFreezer(CgroupFreezer):
    """A freezer whose state is a flag: the simulation's process runs only while it is thawed."""

    states: dict[str, bool] = {}

    def freeze(self) -> None:
        FakeFreezer.states[self.path] = True

    def thaw(self) -> None:
        FakeFreezer.states[self.path] = False

    def frozen(self) -> bool:
        return FakeFreezer.states.get(self.path, False)


def _simulate(
    demand: dict[str, float], ceiling: float, seconds: float, step: float = 0.25
) -> dict[str, object]:
    """Claims that each want `demand` of the GPU, fed to the hold every `step` of a simulated clock; busy
    is what each ran while thawed. Returns each claim's share over the second half, its freezes, and the
    longest freeze."""
    FakeFreezer.states = {}
    freezers = {pid: FakeFreezer(f"/c/{name}", 2) for pid, name in enumerate(demand)}
    hold = ComputeHold(lambda pid: freezers[pid])
    busy_total = {name: 0.0 for name in demand}
    frozen_since: dict[str, float] = {}
    longest = 0.0
    now = 0.0
    usage: dict[tuple[str, str], tuple[float, float, list[int]]] = {
        (name, "gpu"): (ceiling, 0.0, [pid]) for pid, name in enumerate(demand)
    }
    hold.feed(now, usage)
    while now < seconds:
        ran = {}
        for pid, name in enumerate(demand):
            ran[name] = 0.0 if freezers[pid].frozen() else demand[name] * step
        now += step
        hold.tick(now)
        usage = {(name, "gpu"): (ceiling, ran[name], [pid]) for pid, name in enumerate(demand)}
        hold.feed(now, usage)
        for pid, name in enumerate(demand):
            if now > seconds / 2:
                busy_total[name] += ran[name]
            if freezers[pid].frozen():
                frozen_since.setdefault(name, now)
            elif name in frozen_since:
                longest = max(longest, now - frozen_since.pop(name))
    return {
        "share": {name: busy / (seconds / 2) for name, busy in busy_total.items()},
        "freezes": {name: hold.accounts[(name, "gpu")].freezes for name in demand},
        "longest": longest,
    }


def test_a_claim_past_its_ceiling_is_brought_back_and_an_honest_one_never_frozen() -> None:
    result = _simulate({"bypass": 1.0, "honest": 0.30, "idle": 0.0}, ceiling=0.30, seconds=120)
    share, freezes = result["share"], result["freezes"]
    assert isinstance(share, dict) and isinstance(freezes, dict)
    assert share["bypass"] <= 0.30 + MARGIN + BURST_S / 60 + 0.01, share
    assert share["bypass"] >= 0.25, "held back, not starved"
    assert freezes["honest"] == 0 and freezes["idle"] == 0
    assert freezes["bypass"] > 0
    assert isinstance(result["longest"], float) and result["longest"] <= MAX_FREEZE_S + 0.25


def test_a_bypassing_process_gets_its_ceiling_over_every_window() -> None:
    """A process that runs flat out past a 30 % claim, watched at uneven intervals (a loaded node's watch
    comes 250 to 400 ms apart): over every 10 s window after its first freeze, its share stays within its
    ceiling plus the margin - the swing of the duty cycle (what it runs between two watches) included - and
    an honest neighbour that runs its ceiling is never frozen."""
    FakeFreezer.states = {}
    freezers = {1: FakeFreezer("/c/bypass", 2), 2: FakeFreezer("/c/honest", 2)}
    hold = ComputeHold(lambda pid: freezers[pid])
    clock = random.Random(7)
    now = 0.0
    hold.feed(now, {("bypass", "gpu"): (0.3, 0.0, [1]), ("honest", "gpu"): (0.3, 0.0, [2])})
    steps: list[tuple[float, float]] = []  # (when the step ended, what the bypassing process ran in it)
    first = None
    while now < 180.0:
        step = clock.uniform(0.25, 0.4)
        ran = 0.0 if freezers[1].frozen() else step
        honest = 0.0 if freezers[2].frozen() else 0.3 * step
        now += step
        steps.append((now, ran))
        hold.tick(now)
        hold.feed(now, {("bypass", "gpu"): (0.3, ran, [1]), ("honest", "gpu"): (0.3, honest, [2])})
        if first is None and freezers[1].frozen():
            first = len(steps)
    assert first is not None, "the bypassing process was frozen"
    worst = 0.0
    for i in range(first, len(steps)):
        start = steps[i - 1][0]
        ran, j = 0.0, i
        while j < len(steps) and steps[j][0] - start < WINDOW_S:
            ran += steps[j][1]
            j += 1
        if j == len(steps):
            break
        ran += steps[j][1]
        worst = max(worst, ran / (steps[j][0] - start))
    assert worst <= 0.30 + MARGIN, f"{worst:.3f} of the GPU over a {WINDOW_S:g} s window"
    assert worst >= 0.25, "held back, not starved"
    assert hold.accounts[("honest", "gpu")].freezes == 0


@pytest.mark.parametrize("ceiling", [0.1, 0.3])
def test_a_bypassing_process_gets_its_ceiling_at_the_default_one_second_watch(ceiling: float) -> None:
    """The agent's default memory watch is 1 s: the monitor then looks at a held claim when the hold asks
    (`next_look`: a thaw due, or HELD_LOOK_S while it repays), each look up to 50 ms late. A process that runs
    flat out gets at most its ceiling plus the margin over every 10 s window after its first freeze - a look
    only once a second would leave it a whole second of running after each thaw, a third of the GPU."""
    FakeFreezer.states = {}
    freezer = FakeFreezer("/c/bypass", 2)
    hold = ComputeHold(lambda pid: freezer)
    late = random.Random(11)
    now = 0.0
    hold.feed(now, {("bypass", "gpu"): (ceiling, 0.0, [1])})
    steps: list[tuple[float, float]] = []
    first = None
    while now < 120.0:
        look = hold.next_look(now)
        step = min(1.0, (look - now) if look is not None else 1.0) + late.uniform(0.0, 0.05)
        ran = 0.0 if freezer.frozen() else step
        now += step
        steps.append((now, ran))
        hold.tick(now)
        hold.feed(now, {("bypass", "gpu"): (ceiling, ran, [1])})
        if first is None and freezer.frozen():
            first = len(steps)
    assert first is not None, "the bypassing process was frozen"
    worst = 0.0
    for i in range(first, len(steps)):
        start, ran, j = steps[i - 1][0], 0.0, i
        while j < len(steps) and steps[j][0] - start < WINDOW_S:
            ran += steps[j][1]
            j += 1
        if j == len(steps):
            break
        worst = max(worst, (ran + steps[j][1]) / (steps[j][0] - start))
    assert worst <= ceiling + MARGIN, f"{worst:.3f} of the GPU over a {WINDOW_S:g} s window"
    assert worst >= ceiling / 2, "held back, not starved"


def test_the_hold_asks_for_no_early_look_while_no_claim_is_held() -> None:
    """An honest claim under its ceiling leaves the monitor to its own interval (no extra NVML reads)."""
    FakeFreezer.states = {}
    hold = ComputeHold(lambda pid: FakeFreezer("/c/honest", 2))
    hold.feed(0.0, {("honest", "gpu"): (0.3, 0.0, [1])})
    for n in range(1, 20):
        hold.feed(float(n), {("honest", "gpu"): (0.3, 0.25, [1])})
        assert hold.next_look(float(n)) is None


def test_an_honest_claim_frozen_once_by_a_glitch_is_not_held_below_its_ceiling() -> None:
    """A claim the limiter paces to its 30 % ceiling (the driver reads it a point above), whose figures once
    said it ran 2 s more than it did (a glitch): it is frozen for that, and repays; but as it runs no more than
    its ceiling and the margin whenever it is thawed, it stops repaying within a window or two and is not
    frozen again while it keeps to its ceiling."""
    FakeFreezer.states = {}
    freezer = FakeFreezer("/c/honest", 2)
    hold = ComputeHold(lambda pid: freezer)
    now = 0.0
    hold.feed(now, {("honest", "gpu"): (0.3, 0.0, [1])})
    freezes_at: dict[float, int] = {}
    while now < 90.0:
        ran = 0.0 if freezer.frozen() else 0.31 * 0.25
        now += 0.25
        glitch = 2.0 if abs(now - 5.0) < 1e-9 else 0.0
        hold.tick(now)
        hold.feed(now, {("honest", "gpu"): (0.3, ran + glitch, [1])})
        freezes_at[now] = hold.accounts[("honest", "gpu")].freezes
    account = hold.accounts[("honest", "gpu")]
    assert freezes_at[6.0] >= 1, "the glitch froze it"
    assert not account.repaying
    assert account.freezes == freezes_at[45.0], "not frozen again once it had repaid the glitch"


def test_what_was_taken_is_repaid() -> None:
    """A claim that ran at 100 % for 10 s before the node saw it (its debt came in one feed) is held below
    its ceiling until it has paid that back: over the 60 s that follow, its share is its ceiling's."""
    FakeFreezer.states = {}
    freezer = FakeFreezer("/c/late", 2)
    hold = ComputeHold(lambda pid: freezer)
    hold.feed(0.0, {("late", "gpu"): (0.3, 0.0, [1])})
    hold.feed(10.0, {("late", "gpu"): (0.3, 10.0, [1])})
    assert freezer.frozen()
    now, ran = 10.0, 0.0
    while now < 70.0:
        step = 0.0 if freezer.frozen() else 0.25
        now += 0.25
        ran += step
        hold.tick(now)
        hold.feed(now, {("late", "gpu"): (0.3, step, [1])})
    assert (10.0 + ran) / 70.0 <= 0.30 + MARGIN + 0.01


def test_a_claim_that_arrives_running_flat_out_is_frozen_at_the_first_look() -> None:
    """A claim's first second on the GPU counts: a claim whose processes appear between two reads of the
    driver's figures, running flat out, is frozen at the next read, not one read later."""
    FakeFreezer.states = {}
    freezer = FakeFreezer("/c/new", 2)
    hold = ComputeHold(lambda pid: freezer)
    hold.feed(0.0, {})  # the node's claims so far: none of this one's
    hold.feed(1.0, {("new", "gpu"): (0.3, 1.0, [1])})
    assert freezer.frozen()


def test_a_claim_on_its_way_to_debt_is_read_at_every_watch() -> None:
    """Past its rate by more than half its burst, a claim is watched at every pass (`watching`), so that
    the freeze comes one watch after its debt; a claim at its ceiling is not."""
    FakeFreezer.states = {}
    hold = ComputeHold(lambda pid: FakeFreezer(f"/c/{pid}", 2))
    hold.feed(0.0, {("honest", "gpu"): (0.3, 0.0, [1]), ("greedy", "gpu"): (0.3, 0.0, [2])})
    hold.feed(1.0, {("honest", "gpu"): (0.3, 0.3, [1]), ("greedy", "gpu"): (0.3, 0.3, [2])})
    assert not hold.watching()
    hold.feed(
        2.0, {("honest", "gpu"): (0.3, 0.3, [1]), ("greedy", "gpu"): (0.3, 0.3 + MARGIN + BURST_S, [2])}
    )
    assert hold.watching() and not any(a.frozen_until for a in hold.accounts.values())


def test_freezer_of_reads_the_hosts_view_of_each_hierarchy(tmp_path: Path) -> None:
    tree = FakeCgroupTree(tmp_path, dmem=False)
    leaf = tree.mkdir("kubepods/podx/c1")
    (leaf / "cgroup.freeze").write_text("0\n")
    v2 = freezer_of("0::/kubepods/podx/c1\n", tree.root)
    assert v2 == CgroupFreezer(str(leaf), 2)
    v2.freeze()
    assert (leaf / "cgroup.freeze").read_text().strip() == "1" and v2.frozen()
    v2.thaw()
    assert not v2.frozen()
    assert freezer_of("0::/\n", tree.root) is None, "the root cgroup is never frozen"
    assert freezer_of("0::/../../kubepods/podx/c1\n", tree.root) is None, "another cgroup namespace's view"
    # v1, and a hybrid host: the freezer controller's line wins, the unified one serves where it is absent.
    v1_root = tmp_path / "v1"
    (v1_root / "freezer" / "kubepods" / "c1").mkdir(parents=True)
    (v1_root / "unified").mkdir()
    (v1_root / "unified" / "cgroup.controllers").write_text("")
    text = "7:freezer:/kubepods/c1\n4:memory:/kubepods/c1\n0::/kubepods/c1\n"
    assert freezer_of(text, v1_root) == CgroupFreezer(f"{v1_root}/freezer/kubepods/c1", 1)
    assert freezer_of("4:memory:/kubepods/c1\n0::/kubepods/c1\n", v1_root) == CgroupFreezer(
        f"{v1_root}/unified/kubepods/c1", 2
    )
    assert freezer_of("4:memory:/kubepods/c1\n", v1_root) is None


def test_a_tenant_seen_from_the_agents_own_cgroup_namespace_is_frozen_in_the_hosts_tree(
    tmp_path: Path,
) -> None:
    """On cgroup v2 the runtime gives the agent's container a cgroup namespace of its own, so a tenant's
    /proc/<pid>/cgroup reads `/../../<its pod>/<its container>`: it is placed from where the agent's own
    namespace root is in the host's tree (the directory whose cgroup.procs lists the agent)."""
    tree = FakeCgroupTree(tmp_path, dmem=False)
    tree.add_process(4242, "kubepods/burstable/agentpod/agent")
    tenant = tree.mkdir("kubepods/besteffort/tenantpod/c1")
    (tenant / "cgroup.freeze").write_text("0\n")
    roots = namespace_root("0::/\n", 4242, tree.root)
    assert roots == {str(tree.root): f"{tree.root}/kubepods/burstable/agentpod/agent"}
    text = "0::/../../../besteffort/tenantpod/c1\n"
    assert freezer_of(text, tree.root, roots) == CgroupFreezer(str(tenant), 2)
    assert freezer_of(text, tree.root) is None, (
        "without the agent's place, a path out of its namespace is not followed"
    )
    assert freezer_of("0::/../../../../../../etc\n", tree.root, roots) is None, (
        "never above the hierarchy's root"
    )
    assert namespace_root("0::/\n", 999, tree.root) == {}, "an agent not found in the tree places nothing"


def _spinner() -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass\n"], stdout=subprocess.PIPE
    )
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def _real_cgroup(version: int) -> Iterator[tuple[Path, str]]:
    """A cgroup of the host's own hierarchy (v1 freezer or the v2 mount) for this test, removed after."""
    base = (
        CGROUP / "freezer"
        if version == 1
        else (CGROUP if (CGROUP / "cgroup.controllers").exists() else CGROUP / "unified")
    )
    probe = "freezer.state" if version == 1 else "cgroup.freeze"
    if os.geteuid() != 0:
        pytest.skip("a real cgroup needs root to make and to freeze")
    if not base.is_dir():
        pytest.skip(f"this host has no cgroup v{version} {'freezer' if version == 1 else 'mount'} at {base}")
    name = f"dra-gpu-test-{secrets.token_hex(4)}"
    path = base / name
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {base}: {exc.strerror}")
    try:
        if not (path / probe).exists():
            pytest.skip(f"cgroups under {base} have no {probe}")
        yield path, name
    finally:
        for line in (path / "cgroup.procs").read_text().split() if (path / "cgroup.procs").exists() else []:
            (base / "cgroup.procs").write_text(line)
        if version == 1:
            (path / "freezer.state").write_text("THAWED")
        else:
            (path / "cgroup.freeze").write_text("0")
        with contextlib.suppress(OSError):  # a process of the test still in it: the kernel keeps it
            path.rmdir()


@pytest.fixture(params=[1, 2], ids=["v1-freezer", "v2-cgroup.freeze"])
def real_cgroup(request: pytest.FixtureRequest) -> Iterator[tuple[int, Path, str]]:
    for path, name in _real_cgroup(request.param):
        yield request.param, path, name


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_real_cgroup_freezes_and_thaws_a_real_process(real_cgroup: tuple[int, Path, str]) -> None:
    version, path, name = real_cgroup
    child = _spinner()
    try:
        (path / "cgroup.procs").write_text(str(child.pid))
        text = f"7:freezer:/{name}\n" if version == 1 else f"0::/{name}\n"
        freezer = freezer_of(text, CGROUP)
        assert freezer is not None and freezer.version == version and freezer.path == str(path)
        freezer.freeze()
        if version == 1:
            wait_for(lambda: (path / "freezer.state").read_text().strip() == "FROZEN", what="v1 FROZEN")
        else:
            wait_for(lambda: "frozen 1" in (path / "cgroup.events").read_text(), what="v2 frozen 1")
        assert freezer.frozen()
        freezer.thaw()
        assert not freezer.frozen()
        wait_for(lambda: _state(child.pid) == "R", what="the spinner running again")
    finally:
        child.kill()
        child.wait()


def test_the_monitor_holds_a_bypassing_process_to_its_share_and_never_freezes_an_honest_one(
    dirs: PluginDirs, tmp_path: Path, real_cgroup: tuple[int, Path, str]
) -> None:
    """A real process of a 10 % claim that spins (its GPU work, as the fake driver counts it, is its CPU
    time) in a real cgroup: the agent's own watch freezes it and says so; an idle neighbour is never frozen."""
    version, path, name = real_cgroup
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claims = [
        add_claim(
            api,
            claim,
            [
                Alloc(
                    device="gpu-0",
                    share_id=f"00000000-0000-4000-8000-00000000000{n}",
                    consumed={"memory": "4Gi", "cores": cores},
                )
            ],
            [opaque(limiter_config())],
        )
        # 10 %: low, so that even a spinner a loaded machine slows is over its ceiling
        for n, claim, cores in ((1, "bypass", "10"), (2, "honest", "30"))
    ]
    bypass = _spinner()
    honest = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        (path / "cgroup.procs").write_text(str(bypass.pid))
        with plugin_with_nvml(dirs, api, proc_root, interval_s=5.0, watch_interval_s=0.25) as (
            plugin,
            driver,
        ):
            kubelet = Kubelet(dirs.registration_dir)
            kubelet.register()
            assert not any(r.error for r in kubelet.prepare(*claims).values())
            for claim, child in (("bypass", bypass), ("honest", honest)):
                pod_uid, cid = add_pod(api, f"{claim}-pod", [claim])
                fake_proc(proc_root, child.pid, pod_uid, cid, limiter=claim == "honest")
                line = f"7:freezer:/{name}" if version == 1 else f"0::/{name}"
                pod_line = f"1:name=systemd:/kubepods/pod{pod_uid}/{cid}"
                (proc_root / str(child.pid) / "cgroup").write_text(
                    f"{line}\n{pod_line}\n" if claim == "bypass" else f"{pod_line}\n"
                )
                driver.gpus[0].processes[child.pid] = 1 << 30
                driver.gpus[0].runs_on_cpu[child.pid] = (0, 0)
            hold = monitor_of(plugin).hold
            wait_for(
                lambda: any(
                    a.freezes >= 2 for (uid, _), a in hold.accounts.items() if uid == uid_of(claims[0])
                ),
                what="the bypassing claim frozen twice",
                timeout_s=60,
            )
            assert all(a.freezes == 0 for (uid, _), a in hold.accounts.items() if uid == uid_of(claims[1]))
            said = [e for e in _events(api, "Pod", "bypass-pod") if e["reason"] == "ComputeOverCeiling"]
            assert said and "over its ceiling of 10 %" in said[0]["message"]
            assert not _events(api, "Pod", "honest-pod")
            assert bypass.poll() is None, "held back, never killed"
            assert not kubelet.unprepare(claims[0])[uid_of(claims[0])]
            wait_for(
                lambda: not any(uid == uid_of(claims[0]) for uid, _ in hold.accounts),
                what="the account closed",
            )
            kubelet.close()
        freezer = freezer_of(f"7:freezer:/{name}\n" if version == 1 else f"0::/{name}\n", CGROUP)
        assert freezer is not None and not freezer.frozen(), "nothing is left frozen"
    finally:
        for child in (bypass, honest):
            child.send_signal(signal.SIGKILL)
            child.wait()


_AGENT = """
import sys, time
from pathlib import Path
from dra_gpu.monitor.compute_hold import ComputeHold
from dra_gpu.monitor.freezer import RECORDS_DIR, FreezeRecords, freezer_of
state, text = Path(sys.argv[1]), sys.argv[2]
hold = ComputeHold(lambda pid: freezer_of(text, "/sys/fs/cgroup"), records=FreezeRecords(state / RECORDS_DIR))
hold.feed(0.0, {("claim", "gpu"): (0.3, 0.0, [1])})
hold.feed(1.0, {("claim", "gpu"): (0.3, 1.0, [1])})  # ran all of that second: in debt, frozen
print("frozen" if any(a.frozen_until for a in hold.accounts.values()) else "not frozen", flush=True)
time.sleep(300)
"""


def test_an_agent_killed_mid_freeze_leaves_the_claim_frozen_only_until_the_next_agent_starts(
    tmp_path: Path, real_cgroup: tuple[int, Path, str]
) -> None:
    """The agent records each cgroup in its own state directory before it freezes it; killed (SIGKILL) before
    the thaw, it leaves the tenant's container frozen, and the next agent's monitor thaws it as it starts."""
    version, path, name = real_cgroup
    state = tmp_path / "state"
    tenant = _spinner()
    agent: subprocess.Popen[str] | None = None
    try:
        (path / "cgroup.procs").write_text(str(tenant.pid))
        text = f"7:freezer:/{name}\n" if version == 1 else f"0::/{name}\n"
        agent = subprocess.Popen(
            [sys.executable, "-c", _AGENT, str(state), text], stdout=subprocess.PIPE, text=True
        )
        assert agent.stdout is not None and agent.stdout.readline().strip() == "frozen"
        agent.kill()
        agent.wait()
        freezer = freezer_of(text, CGROUP)
        assert freezer is not None and freezer.frozen(), "the killed agent's freeze outlives it"
        assert list((state / RECORDS_DIR).iterdir()), "and so does its record"
        api = FakeKube()
        monitor = Monitor(
            prepared=list,
            claims_dir=state / "claims",
            gpus=list,
            pods=PodDirectory(api, "node"),
            watchdog=Watchdog(api, "node", ProcReader()),
            cgroup_root=CGROUP,
        )
        monitor.start()
        try:
            assert not freezer.frozen(), "the next agent thaws it before it holds anything"
            wait_for(lambda: _state(tenant.pid) == "R", what="the tenant running again")
            assert not list((state / RECORDS_DIR).iterdir())
        finally:
            monitor.stop()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        left = freezer_of(f"7:freezer:/{name}\n" if version == 1 else f"0::/{name}\n", CGROUP)
        if left is not None:
            left.thaw()  # a frozen v1 task takes its SIGKILL only once thawed
        tenant.kill()
        tenant.wait()
