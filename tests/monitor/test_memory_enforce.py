"""The node holds a limiter claim to its memory cap by default, from the driver's per-process figures: the
processes that took the claim over (newest growth first) are killed, the claim's pods get an Event that says
why, the metric counts it; an honest claim is never touched, and only the class can turn this to Report."""

from __future__ import annotations

import signal
from pathlib import Path

from monitor_harness import GiB, add_pod, fake_proc, gpu_share, library_line, prepared_agent, reaped, sleeper
from plugin_harness import PluginDirs, monitor_of, opaque, uid_of
from test_monitor import _events, limiter_config, scrape
from waiting import wait_for

from dra_gpu.kube.fake import FakeKube
from dra_gpu.monitor.watchdog import LIMITER_ALLOWANCE

MiB = 2**20


def test_a_limiter_claim_without_a_policy_loses_the_process_that_grew_last(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    """No watchdog policy anywhere: the node enforces. The old large process stays; the one that grew past
    the cap goes, with SIGKILL; the neighbouring claim, itself at its cap, is untouched."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = gpu_share(api, "tenant", "4Gi", [opaque(limiter_config())], n=1)
    neighbour = gpu_share(api, "honest", "4Gi", [opaque(limiter_config())], n=2)
    old, grower, other = sleeper(), sleeper(), sleeper()
    with (
        reaped(old, grower, other),
        prepared_agent(dirs, api, proc_root, claim, neighbour) as (plugin, driver, _),
    ):
        pod_uid, cid = add_pod(api, "tenant-pod", ["tenant"])
        other_uid, other_cid = add_pod(api, "honest-pod", ["honest"])
        fake_proc(proc_root, old.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, grower.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, other.pid, other_uid, other_cid, limiter=True)
        monitor = monitor_of(plugin)
        driver.gpus[0].processes = {old.pid: 3 * GiB, grower.pid: 512 * MiB, other.pid: 4 * GiB}
        monitor.watch_once()
        # The small one grows past the cap (a forged region let it): it is the one that took the claim over.
        driver.gpus[0].processes = {old.pid: 3 * GiB, grower.pid: 2 * GiB, other.pid: 4 * GiB}
        monitor.watch_once()
        assert grower.wait(timeout=30) == -signal.SIGKILL
        assert old.poll() is None and other.poll() is None
        (event,) = [e for e in _events(api, "Pod", "tenant-pod") if e["reason"] == "MemoryOverLimit"]
        assert f"process {grower.pid} in container main of pod default/tenant-pod" in event["message"]
        assert "over its limit of 4294967296 bytes" in event["message"]
        assert "the process was killed" in event["message"]
        assert [e["reason"] for e in _events(api, "ResourceClaim", "tenant")] == ["MemoryOverLimit"]
        assert not _events(api, "Pod", "honest-pod")
        metrics = scrape(plugin.http_port)
        assert [
            (labels["claim"], labels["reason"], value)
            for labels, value in metrics["dra_gpu_watchdog_terminations_total"]
        ] == [("tenant", "MemoryOverLimit", 1.0)]


def test_as_many_processes_go_as_it_takes_and_no_more(dirs: PluginDirs, tmp_path: Path) -> None:
    """Three processes join at once, 1 GiB each, on a 2 GiB cap: the claim needs two of them gone to fit."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = gpu_share(api, "crowd", "2Gi", [opaque(limiter_config())])
    children = [sleeper() for _ in range(4)]
    with reaped(*children), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "crowd-pod", ["crowd"])
        for c in children:
            fake_proc(proc_root, c.pid, pod_uid, cid, limiter=True)
        first, *late = children
        driver.gpus[0].processes = {first.pid: 1 * GiB}
        monitor_of(plugin).watch_once()
        driver.gpus[0].processes = {c.pid: 1 * GiB for c in children}
        monitor_of(plugin).watch_once()
        wait_for(lambda: sum(c.poll() is not None for c in late) == 2, what="two of the late three killed")
        assert first.poll() is None, "the process that held its memory before is not the one that grew"
        assert sum(c.poll() is None for c in late) == 1


def test_an_honest_claim_is_never_killed(dirs: PluginDirs, tmp_path: Path) -> None:
    """A claim at its cap whose processes come and go, and whose module code (loaded by the driver unseen by
    the library) lands while it sits at the cap, over many watches: never an event, never a kill."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = gpu_share(api, "steady", "2Gi", [opaque(limiter_config())])
    a, b = sleeper(), sleeper()
    with reaped(a, b), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "steady-pod", ["steady"])
        fake_proc(proc_root, a.pid, pod_uid, cid, limiter=True)
        fake_proc(proc_root, b.pid, pod_uid, cid, limiter=True)
        module = 88 * MiB  # what a PyTorch process holds past its charged context (H100, driver 580)
        rounds: list[dict[int, int | None]] = [
            {a.pid: 2 * GiB},
            {a.pid: 1 * GiB, b.pid: 1 * GiB},
            {a.pid: 1 * GiB + module, b.pid: 1 * GiB + module},
            {b.pid: 2 * GiB + module},
            {a.pid: 524 * MiB, b.pid: 2 * GiB - 524 * MiB + module},
        ]
        for memory in rounds * 3:
            driver.gpus[0].processes = memory
            monitor_of(plugin).watch_once()
        monitor_of(plugin).sample_once()
        assert 2 * module <= LIMITER_ALLOWANCE
        assert _events(api, "ResourceClaim", "steady") == [] and _events(api, "Pod", "steady-pod") == []
        assert a.poll() is None and b.poll() is None


def test_only_the_class_can_make_the_node_only_report(dirs: PluginDirs, tmp_path: Path) -> None:
    """A claim that asks for Report itself is still held; a class that says Report is only reported."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    by_claim = gpu_share(api, "asks", "1Gi", [opaque(limiter_config("Report"), source="FromClaim")], n=1)
    by_class = gpu_share(api, "reported", "1Gi", [opaque(limiter_config("Report"), source="FromClass")], n=2)
    asker, reported = sleeper(), sleeper()
    with (
        reaped(asker, reported),
        prepared_agent(dirs, api, proc_root, by_claim, by_class) as (plugin, driver, _),
    ):
        (share,) = dirs.checkpoint().claims[uid_of(by_claim)].shares
        assert "watchdog" not in share.detail, "the node's default, which the claim cannot loosen"
        for name, child in (("asks", asker), ("reported", reported)):
            pod_uid, cid = add_pod(api, f"{name}-pod", [name])
            fake_proc(proc_root, child.pid, pod_uid, cid, limiter=True)
        driver.gpus[0].processes = {asker.pid: 3 * GiB, reported.pid: 3 * GiB}
        monitor_of(plugin).watch_once()
        assert asker.wait(timeout=30) == -signal.SIGKILL
        assert reported.poll() is None
        assert [e["reason"] for e in _events(api, "Pod", "reported-pod")] == ["MemoryOverLimit"]


def test_the_agents_own_watch_at_250_ms_kills_without_a_test_driving_it(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = gpu_share(api, "fast", "1Gi", [opaque(limiter_config())])
    greedy = sleeper()
    agent = prepared_agent(dirs, api, proc_root, claim, interval_s=5.0, watch_interval_s=0.25)
    with reaped(greedy), agent as (plugin, driver, _):
        assert monitor_of(plugin).watch_interval_s == 0.25
        pod_uid, cid = add_pod(api, "fast-pod", ["fast"])
        fake_proc(proc_root, greedy.pid, pod_uid, cid, limiter=True)
        driver.gpus[0].processes = {greedy.pid: 2 * GiB}
        assert greedy.wait(timeout=30) == -signal.SIGKILL


def test_the_library_is_known_by_the_file_the_agent_mounted_never_by_its_name(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    """A process that maps a file of its own under the library's name has no limiter (LimiterMissing); one
    that maps the agent's file under any name has it."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = gpu_share(api, "named", "4Gi", [opaque(limiter_config())])
    impostor, renamed = sleeper(), sleeper()
    forged = tmp_path / "libdragpu-limiter.so.1"
    forged.write_bytes(b"\x7fELF a tenant's own file\n")
    with reaped(impostor, renamed), prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _):
        pod_uid, cid = add_pod(api, "named-pod", ["named"])
        fake_proc(proc_root, impostor.pid, pod_uid, cid, limiter=False)
        with open(proc_root / str(impostor.pid) / "maps", "a") as maps:
            maps.write(library_line(forged) + "\n")
        fake_proc(proc_root, renamed.pid, pod_uid, cid, limiter=False)
        with open(proc_root / str(renamed.pid) / "maps", "a") as maps:
            maps.write(library_line(dirs.limiter_library, "/opt/tenant/anything.so") + "\n")
        driver.gpus[0].processes = {impostor.pid: 1 * GiB, renamed.pid: 1 * GiB}
        monitor_of(plugin).watch_once()
        said = {(e["reason"], e["message"].split(" ")[1]) for e in _events(api, "Pod", "named-pod")}
        assert said == {("LimiterMissing", str(impostor.pid))}
        assert impostor.poll() is None and renamed.poll() is None, "the default policy only reports it"


def test_a_process_no_claim_owns_is_reported_and_stopped_and_the_hosts_only_reported(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    """On a GPU shared by a limiter claim: a pod with no claim of this driver that reached the GPU anyway (the
    toolkit honoured its NVIDIA_VISIBLE_DEVICES) is told so and stopped; a process outside pods is reported,
    never signalled; an MPS server is the driver's own; the claim's own process is untouched."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = gpu_share(api, "owner", "4Gi", [opaque(limiter_config())])
    owned, sneaky, host, mps = sleeper(), sleeper(), sleeper(), sleeper()
    with (
        reaped(owned, sneaky, host, mps),
        prepared_agent(dirs, api, proc_root, claim) as (plugin, driver, _),
    ):
        pod_uid, cid = add_pod(api, "owner-pod", ["owner"])
        fake_proc(proc_root, owned.pid, pod_uid, cid, limiter=True)
        sneaky_uid, sneaky_cid = add_pod(api, "no-claim", [])
        fake_proc(proc_root, sneaky.pid, sneaky_uid, sneaky_cid, limiter=False)
        for pid, comm in ((host.pid, "python3"), (mps.pid, "nvidia-cuda-mps")):
            (proc_root / str(pid)).mkdir(parents=True)
            (proc_root / str(pid) / "cgroup").write_text("0::/system.slice/app.service\n")
            (proc_root / str(pid) / "comm").write_text(comm + "\n")
        driver.gpus[0].processes = {owned.pid: GiB, sneaky.pid: GiB, host.pid: GiB, mps.pid: 64 * MiB}
        monitor_of(plugin).watch_once()
        (event,) = _events(api, "Pod", "no-claim")
        assert event["reason"] == "ProcessWithoutClaim"
        assert "no claim prepared on this node owns it" in event["message"]
        assert sneaky.wait(timeout=30) == -signal.SIGTERM
        assert owned.poll() is None and host.poll() is None and mps.poll() is None
        reported = {
            (labels["pod"], labels["reason"])
            for labels, _ in scrape(plugin.http_port)["dra_gpu_watchdog_violations_total"]
        }
        assert reported == {("no-claim", "ProcessWithoutClaim"), ("", "ProcessWithoutClaim")}
        assert not _events(api, "ResourceClaim", "owner")
