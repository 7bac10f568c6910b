"""The node agent process stays up and answers the kubelet whatever a client makes it hold.

Each test runs the real agent process (`PluginProcess`) with the file limit a container gets from
containerd (soft 1,024), over real sockets, with a real slow client.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import (
    NODE,
    PROFILE,
    Alloc,
    Kubelet,
    PluginDirs,
    PluginProcess,
    add_claim,
    running_plugin,
    share_claim,
    uid_of,
    write_snapshot,
)
from waiting import wait_for

from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.checkpoint import CheckpointStore
from dra_gpu.proto import dra_v1, dra_v1_grpc
from dra_gpu.slices import publisher

CONTAINERD_SOFT_NOFILE = 1024


@contextlib.contextmanager
def small_disk(path: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path`: a disk that a test can fill up or make read-only."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0750", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs as the state disk (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def failing(url: str, what: str) -> bytes:
    """The body of the first 503 that `url` answers (waiting for it)."""

    def unhealthy() -> tuple[int, bytes] | None:
        answer = get(url, timeout=5)
        return answer if answer[0] == 503 else None

    answer = wait_for(unhealthy, what=what)
    assert answer is not None  # wait_for returns only a truthy answer
    return answer[1]


def fill(path: Path) -> Path:
    """Fill the file system of `path` to the last byte; the filler file is returned."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def accept_queue(port: int) -> int | None:
    """Connections waiting in the accept queue of the listening socket on `port` (its `rx_queue` in
    /proc/net/tcp); None when nothing listens there."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            return int(queues.split(":")[1], 16)
    return None


def accepted_all(held: list[socket.socket], port: int) -> bool:
    """Whether every connection of the flood is through the handshake and the agent accepted each."""
    poller = select.poll()  # (select takes no descriptor above 1,023)
    for sock in held:
        poller.register(sock, select.POLLOUT)
    return len(poller.poll(0)) == len(held) and accept_queue(port) == 0


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc/PID/limits")


@contextlib.contextmanager
def flood(port: int, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections that never send a byte (a slow client), opened without waiting on any."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:  # this process needs the files for its side of the connections
        if hard != resource.RLIM_INFINITY and hard < count + 256:
            pytest.skip(f"this process may open only {hard} files; the flood needs {count + 256}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (count + 256, hard))
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex(("127.0.0.1", port))
            assert code in (0, errno.EINPROGRESS), errno.errorcode.get(code, code)
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("raisable", [False, True], ids=["hard-1024", "hard-above"])
def test_a_connection_flood_never_costs_the_kubelet_a_prepare_nor_the_agent_its_liveness(
    dirs: PluginDirs, raisable: bool
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if raisable else CONTAINERD_SOFT_NOFILE
    if raisable and hard <= CONTAINERD_SOFT_NOFILE:
        pytest.skip("this process's own hard open-file limit is 1,024: no higher one to give the agent")
    api = FakeKube()
    claim = add_claim(api, "flooded", [Alloc(device="gpu-0")])
    snapshot = dirs.root / "cluster.json"
    write_snapshot(api, snapshot)
    plugin = PluginProcess(
        dirs,
        snapshot,
        extra_args=("--http-address", "127.0.0.1:0"),
        nofile=(CONTAINERD_SOFT_NOFILE, hard),
    ).start()
    assert plugin.process is not None
    pid = plugin.process.pid
    port = int((dirs.root / "http-port").read_text())
    kubelet = Kubelet(dirs.registration_dir)
    try:
        kubelet.register()
        soft, _ = limits(pid)
        if hard > CONTAINERD_SOFT_NOFILE:
            assert soft == hard, "the agent raises its soft limit to the hard one at start"
        lines_before = len(plugin.log().splitlines())
        with flood(port, 1500) as held:
            wait_for(lambda: accepted_all(held, port), what="the agent to have taken every connection")
            assert open_files(pid) <= soft // 2, "connections are kept well under the file limit"
            answer = kubelet.prepare(claim)[uid_of(claim)]
            assert answer.error == "", answer.error
            status, body = get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            assert status == 200, body
            assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        flood_lines = len(plugin.log().splitlines()) - lines_before
        assert flood_lines < 50, f"{flood_lines} log lines for a flood of 1,500:\n{plugin.log()[-3000:]}"
    finally:
        kubelet.close()
        code = plugin.terminate()
    assert code == 0, plugin.log()[-3000:]


SLOW_NVIDIA_SMI = """#!/bin/sh
sleep 0.5
"""


def slow_tools(dirs: PluginDirs, seconds: float = 0.5) -> tuple[str, ...]:
    """`serve` options: GPU commands run as processes, `nvidia-smi` taking `seconds` a call."""
    smi = dirs.root / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nsleep {seconds}\n")
    smi.chmod(0o755)
    return ("--mps-control", "true", "--nvidia-smi", str(smi))


LONG = {"interval": "Long"}


def timeslice_claims(api: FakeKube, count: int, gpus: int = 2) -> list[dict[str, Any]]:
    """Time-sliced claims: each prepare runs `nvidia-smi compute-policy` once, one at a time per GPU."""
    return [
        share_claim(api, f"ts-{i}", "TimeSlicing", device=f"gpu-{i % gpus}", share=i, timeSlicing=LONG)
        for i in range(count)
    ]


def test_health_is_never_queued_behind_a_burst_of_prepares_with_a_slow_nvidia_smi(dirs: PluginDirs) -> None:
    """A reboot storm: 48 pods' prepares at once, each waiting on a slow `nvidia-smi` (0.5 s a call,
    one call at a time per GPU: 12 s for all). Liveness must hold all along."""
    api = FakeKube()
    claims = [
        share_claim(
            api, f"ts-{i}", "TimeSlicing", device=f"gpu-{i % 2}", share=i, cores="2", timeSlicing=LONG
        )
        for i in range(48)
    ]
    snapshot = dirs.root / "cluster.json"
    write_snapshot(api, snapshot)
    smi = dirs.root / "nvidia-smi"
    smi.write_text(SLOW_NVIDIA_SMI)
    smi.chmod(0o755)
    plugin = PluginProcess(
        dirs,
        snapshot,
        extra_args=("--http-address", "127.0.0.1:0", "--mps-control", "true", "--nvidia-smi", str(smi)),
    ).start()
    port = int((dirs.root / "http-port").read_text())
    kubelet = Kubelet(dirs.registration_dir, timeout_s=120)
    failures: list[str] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            try:
                status, body = get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                if status != 200:
                    failures.append(body.decode(errors="replace"))
            except OSError as exc:
                failures.append(str(exc))
            done.wait(0.25)

    try:
        kubelet.register()
        prober = threading.Thread(target=probe)
        prober.start()
        with ThreadPoolExecutor(max_workers=48) as pool:
            answers = list(pool.map(lambda c: kubelet.prepare(c)[uid_of(c)], claims))
        done.set()
        prober.join()
        assert [a.error for a in answers] == [""] * 48
        assert failures == [], f"{len(failures)} failed probes, first: {failures[0]}"
    finally:
        done.set()
        kubelet.close()
        code = plugin.terminate()
    assert code == 0, plugin.log()[-3000:]


def test_healthz_fails_while_the_state_disk_is_full_or_read_only_and_recovers(dirs: PluginDirs) -> None:
    snapshot = dirs.root / "cluster.json"
    write_snapshot(FakeKube(), snapshot)
    with small_disk(dirs.state_dir):
        plugin = PluginProcess(dirs, snapshot, extra_args=("--http-address", "127.0.0.1:0")).start()
        url = f"http://127.0.0.1:{(dirs.root / 'http-port').read_text()}/healthz"
        try:
            assert get(url, timeout=5)[0] == 200
            filler = fill(dirs.state_dir)
            body = failing(url, "503 when full")
            assert b"is full" in body, body
            filler.unlink()
            wait_for(lambda: get(url, timeout=5)[0] == 200, what="200 once there is room again")
            subprocess.run(["mount", "-o", "remount,ro", str(dirs.state_dir)], check=True)
            body = failing(url, "503 when ro")
            assert b"cannot be written: Read-only file system" in body, body
            subprocess.run(["mount", "-o", "remount,rw", str(dirs.state_dir)], check=True)
            wait_for(lambda: get(url, timeout=5)[0] == 200, what="200 once writable again")
        finally:
            code = plugin.terminate()
        assert code == 0, plugin.log()[-3000:]


class HangingTimeslice(SimulatedCommands):
    """`nvidia-smi compute-policy` that does not return until the test lets it."""

    def __init__(self, state_file: Path) -> None:
        super().__init__(state_file=state_file)
        self.release = threading.Event()

    def set_timeslice(self, gpu_index: int, value: int) -> None:
        self.release.wait(60)
        super().set_timeslice(gpu_index, value)


def test_healthz_fails_while_the_kubelets_calls_make_no_progress_and_recovers(dirs: PluginDirs) -> None:
    api = FakeKube()
    claim = share_claim(api, "ts", "TimeSlicing", cores="2", timeSlicing=LONG)
    commands = HangingTimeslice(dirs.simulated_state)
    with running_plugin(
        dirs, api, commands=commands, http_address="127.0.0.1:0", lock_timeout_s=0.25
    ) as agent:
        url = f"http://127.0.0.1:{agent.http_port}/healthz"
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(kubelet.prepare, claim)
            body = failing(url, "503 when stuck")
            assert b"none has finished a claim" in body, body
            commands.release.set()
            assert answer.result(timeout=30)[uid_of(claim)].error == ""
        wait_for(lambda: get(url, timeout=5)[0] == 200, what="200 once the call finished")
        kubelet.close()


class HangingSliceList(FakeKube):
    """An API server whose list of ResourceSlices does not answer until the test lets it."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def list(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "ResourceSlice":
            self.release.wait(60)
        return super().list(kind, *args, **kwargs)


def test_healthz_fails_while_the_slice_publisher_is_stuck(
    dirs: PluginDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = HangingSliceList()
    original = publisher.SlicePublisher.stuck
    monkeypatch.setattr(publisher.SlicePublisher, "stuck", lambda self, after_s=0.5: original(self, after_s))
    with running_plugin(
        dirs,
        api,
        http_address="127.0.0.1:0",
        publish_slices=True,
        inventory=SimulatedInventory(PROFILE, seed=NODE),
    ) as agent:
        url = f"http://127.0.0.1:{agent.http_port}/healthz"
        body = failing(url, "503 when stuck")
        assert b"publishing the ResourceSlices has not returned" in body, body
        api.release.set()
        wait_for(lambda: get(url, timeout=5)[0] == 200, what="200 once it returned")


def test_a_cancelled_call_stops_starting_claims(dirs: PluginDirs) -> None:
    """The kubelet gives up on a 60-claim call (its pod deleted, say): the agent does not go on to all."""
    api = FakeKube()
    claims = timeslice_claims(api, 60, gpus=1)
    snapshot = dirs.root / "cluster.json"
    write_snapshot(api, snapshot)
    plugin = PluginProcess(dirs, snapshot, extra_args=slow_tools(dirs, 0.2)).start()
    kubelet = Kubelet(dirs.registration_dir)
    try:
        kubelet.register()
        stub = dra_v1_grpc.DRAPluginStub(kubelet.channel())
        request = dra_v1.NodePrepareResourcesRequest(
            claims=[
                dra_v1.Claim(namespace="default", name=c["metadata"]["name"], uid=uid_of(c)) for c in claims
            ]
        )
        call = stub.NodePrepareResources.future(request, timeout=120)
        wait_for(lambda: len(dirs.spec_files()) >= 3, what="the call to have prepared a few claims")
        call.cancel()
        at_cancel = len(dirs.spec_files())
        # The call logs its cancellation once it has stopped going through its claims.
        wait_for(lambda: "the call was cancelled" in plugin.log(), what="the call to stop starting claims")
        after = len(dirs.spec_files())
        assert after <= at_cancel + 1, f"{at_cancel} claims prepared when cancelled, {after} once it stopped"
    finally:
        kubelet.close()
        code = plugin.terminate()
    assert code == 0, plugin.log()[-3000:]


def limiter_claims(api: FakeKube, count: int) -> list[dict[str, Any]]:
    return [share_claim(api, f"lim-{i}", device=f"gpu-{i % 2}", share=i) for i in range(count)]


def test_the_agent_starts_on_a_full_state_disk_with_a_journal_pending_and_unprepares_to_free_it(
    dirs: PluginDirs,
) -> None:
    api = FakeKube()
    claims = limiter_claims(api, 6)
    snapshot = dirs.root / "cluster.json"
    write_snapshot(api, snapshot)
    with small_disk(dirs.state_dir):
        first = PluginProcess(dirs, snapshot).start()
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert {a.error for a in kubelet.prepare(*claims).values()} == {""}
        kubelet.close()
        first.kill_group()  # the journal is not folded into the snapshot
        assert (dirs.state_dir / "checkpoint.json.journal").stat().st_size > 0
        filler = fill(dirs.state_dir)
        plugin = PluginProcess(dirs, snapshot).start()  # exited with ENOSPC before
        try:
            kubelet = Kubelet(dirs.registration_dir)
            kubelet.register()
            assert kubelet.unprepare(*claims[:3]) == {uid_of(c): "" for c in claims[:3]}
            assert set(dirs.checkpoint().claims) == {uid_of(c) for c in claims[3:]}
            filler.unlink()
            assert kubelet.unprepare(*claims[3:]) == {uid_of(c): "" for c in claims[3:]}
            kubelet.close()
        finally:
            code = plugin.terminate()
        assert code == 0, plugin.log()[-3000:]
        assert "could not fold the checkpoint's journal" in plugin.log()
        assert dirs.checkpoint().claims == {} and dirs.claim_dirs() == []
        assert not (dirs.state_dir / "checkpoint.json.journal").exists(), (
            "folded at stop, once there was room"
        )


def test_memory_per_claim_is_not_kept_once_the_claim_is_gone(dirs: PluginDirs) -> None:
    """Lock entries and event entries of every claim ever seen, and a second copy of every record for
    the usage monitor, made the agent grow with the claims it has seen, not with what it holds."""
    api = FakeKube()
    claims = limiter_claims(api, 40)
    failing = [add_claim(api, f"nowhere-{i}", [Alloc(device="gpu-7")]) for i in range(150)]
    with running_plugin(dirs, api, monitor_interval_s=60) as agent:
        preparer = agent.plugin.preparer
        preparer.core.events._max_remembered = 50  # the bound, small enough to reach here
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        for claim in claims:
            assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        monitor = agent.monitor
        assert monitor is not None
        # The monitor reads the preparer's records through the agent's `prepared_holdings` and keeps no
        # store (no second copy of each record) of its own.
        assert {h.claim.uid for h in monitor._prepared()} == {uid_of(c) for c in claims}
        assert not any(isinstance(v, CheckpointStore) for v in vars(monitor).values()), "held once"
        assert kubelet.unprepare(*claims) == {uid_of(c): "" for c in claims}
        for start in range(0, len(failing), 50):  # claims that fail: each posts events (claim and pod)
            answers = kubelet.prepare(*failing[start : start + 50])
            assert all("gpu-7" in a.error for a in answers.values()), answers
        assert len(api.objects("Event")) >= 2 * len(failing)
        kubelet.close()
        assert preparer.core.gpu_locks._locks == {}, "no lock entry for a claim nobody is working on"
        assert len(preparer.core.events._last) <= 50
