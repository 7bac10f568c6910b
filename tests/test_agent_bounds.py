"""The node agent process stays up and answers the kubelet whatever a client makes it hold.

Each test runs the real agent process (`PluginProcess`) with the file limit a container gets from
containerd (soft 1,024), over real sockets, with a real slow client.
"""

from __future__ import annotations

import contextlib
import errno
import resource
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_harness import Alloc, Kubelet, PluginDirs, PluginProcess, add_claim, uid_of, write_snapshot

from dra_gpu.kube.fake import FakeKube

CONTAINERD_SOFT_NOFILE = 1024


def get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


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
        with flood(port, 1500):
            time.sleep(3)  # the agent accepts what it accepts
            assert open_files(pid) <= soft // 2, "connections are kept well under the file limit"
            answer = kubelet.prepare(claim)[uid_of(claim)]
            assert answer.error == "", answer.error
            status, body = get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            assert status == 200, body
            time.sleep(2)
            assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        flood_lines = len(plugin.log().splitlines()) - lines_before
        assert flood_lines < 50, f"{flood_lines} log lines in 5 s of flood:\n{plugin.log()[-3000:]}"
    finally:
        kubelet.close()
        code = plugin.terminate()
    assert code == 0, plugin.log()[-3000:]
