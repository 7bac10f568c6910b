"""The HTTP endpoint stays answerable: a flood of connections never makes a 1 s health probe fail, idle and
unfinished connections are closed, `/metrics` runs on a bounded pool beside the health checks (never in
front of them), and the listen backlog is a real one."""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from plugin_harness import PluginDirs, PluginProcess, running_plugin, write_snapshot
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from waiting import wait_for

from dra_gpu.http_endpoint import HttpServer, bool_check
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin import health


def get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Slow:
    """A collector that takes `seconds` to collect, as a registry with many series can."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def collect(self) -> Iterator[Any]:
        time.sleep(self.seconds)
        yield GaugeMetricFamily("slow_metric", "slow to collect", value=1)


@pytest.fixture
def server() -> Iterator[HttpServer]:
    registry = CollectorRegistry()
    registry.register(Slow(1.0))
    http = HttpServer(
        "127.0.0.1:0",
        registry,
        {"/healthz": bool_check(lambda: True), "/readyz": lambda: (False, "not yet")},
        workers=2,
        queue_size=4,
        read_timeout_s=0.5,
        write_timeout_s=2.0,
    )
    http.start()
    yield http
    http.stop()


def test_a_flood_of_200_connections_never_fails_a_1s_health_probe_of_the_real_agent(dirs: PluginDirs) -> None:
    snapshot = dirs.root / "cluster.json"
    write_snapshot(FakeKube(), snapshot)
    plugin = PluginProcess(dirs, snapshot, extra_args=("--http-address", "127.0.0.1:0")).start()
    port = int((dirs.root / "http-port").read_text())
    base = f"http://127.0.0.1:{port}"
    held: list[socket.socket] = []
    stop = threading.Event()
    metrics: list[int] = []
    try:
        for i in range(100):  # connections that send nothing, or half a request
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)

        def scrape() -> None:
            while not stop.is_set():
                try:
                    metrics.append(get(f"{base}/metrics", timeout=15)[0])
                except OSError:
                    metrics.append(0)

        scrapers = [threading.Thread(target=scrape) for _ in range(100)]
        for thread in scrapers:
            thread.start()
        failures: list[str] = []
        probes = 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            for path in ("/healthz", "/readyz"):
                probes += 1
                try:
                    status, body = get(f"{base}{path}", timeout=1.0)  # a kubelet probe's default timeout
                    if status != 200:
                        failures.append(f"{path}: {status} {body!r}")
                except OSError as exc:
                    failures.append(f"{path}: {exc}")
            time.sleep(0.05)
        stop.set()
        for thread in scrapers:
            thread.join(30)
        assert failures == [], f"{len(failures)} of {probes} probes failed: {failures[:3]}"
        assert metrics and set(metrics) <= {200, 503}, "every scrape is answered, at worst 'busy' at once"
        assert 200 in metrics
    finally:
        stop.set()
        for sock in held:
            sock.close()
        assert plugin.terminate() == 0, plugin.log()


def test_idle_and_unfinished_connections_are_closed_without_a_thread_each(server: HttpServer) -> None:
    threads = threading.active_count()
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(50)]
    for sock in socks[::2]:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished
    assert threading.active_count() == threads, "no thread per connection"
    for sock in socks:  # recv waits for the server's close, up to the socket's 5 s timeout
        assert sock.recv(100) == b"", "closed after the read timeout"
        sock.close()
    assert get(f"http://127.0.0.1:{server.port}/healthz", timeout=1)[0] == 200


def test_health_checks_never_wait_behind_metrics(server: HttpServer) -> None:
    base = f"http://127.0.0.1:{server.port}"
    results: list[int] = []
    scrapes = [
        threading.Thread(target=lambda: results.append(get(f"{base}/metrics", 10)[0])) for _ in range(10)
    ]
    for thread in scrapes:
        thread.start()
    # Two workers busy for a second each, four scrapes waiting, the rest answered 503 at once.
    wait_for(lambda: results.count(503) == 4, what="the scrapes beyond the queue refused")
    assert get(f"{base}/healthz", timeout=1) == (200, b"ok\n")
    assert get(f"{base}/readyz", timeout=1) == (503, b"not yet\n")
    assert get(f"{base}/nothing", timeout=1)[0] == 404
    assert 200 not in results, "answered while every scrape still waited: not queued behind them"
    for thread in scrapes:
        thread.join(15)
    assert sorted(results) == [200] * 6 + [503] * 4


def test_the_listen_backlog_is_a_real_one(server: HttpServer) -> None:
    if shutil.which("ss") is None:
        pytest.skip("no ss to read the listening socket's backlog")
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    backlog = int(out[2])  # State Recv-Q Send-Q: Send-Q of a listening socket is its backlog
    assert backlog >= 128, out


def test_the_agents_healthz_answers_from_its_last_probe_while_a_probe_hangs(
    dirs: PluginDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_plugin(dirs, FakeKube(), http_address="127.0.0.1:0") as plugin:
        base = f"http://127.0.0.1:{plugin.http_port}"
        assert get(f"{base}/healthz", timeout=1)[0] == 200

        release = threading.Event()

        def hanging(*args: Any, **kwargs: Any) -> tuple[bool, str]:
            release.wait(30)
            return True, "late"

        monkeypatch.setattr(health, "probe", hanging)  # the gRPC probe now hangs in the background
        try:  # answered while the probe hangs: from the last probe, not behind this one
            assert get(f"{base}/healthz", timeout=1)[0] == 200
            dirs.service_socket.unlink()
            status, body = get(f"{base}/healthz", timeout=1)
            assert status == 503 and b"dra.sock does not exist" in body
        finally:
            release.set()


EXHAUSTED_SERVER = """
import logging, os, resource, sys, time
from prometheus_client import CollectorRegistry, Counter
from dra_gpu.http_endpoint import HttpServer, bool_check
from dra_gpu.logs import setup_logging

setup_logging("info", "text")
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
http = HttpServer("127.0.0.1:0", CollectorRegistry(), {"/healthz": bool_check(lambda: True)})
http.start()
taken = []
while True:  # the process's other work has taken every file
    try:
        taken.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
print(http.port, flush=True)
sys.stdin.readline()  # until the test has flooded it for a while
for fd in taken:
    os.close(fd)
print("freed", flush=True)
sys.stdin.readline()
http.stop()
"""


def test_a_listener_out_of_files_rests_instead_of_spinning_and_listens_again() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", EXHAUSTED_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    try:
        port = int(server.stdout.readline())
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        time.sleep(3)  # accept fails with EMFILE all along
        server.stdin.write("\n")
        server.stdin.flush()
        assert server.stdout.readline().strip() == "freed"
        status, body = get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert (status, body) == (200, b"ok\n"), "the listener accepts again once files are free"
        for sock in socks:
            sock.close()
        server.stdin.write("\n")
        server.stdin.flush()
        assert server.wait(timeout=20) == 0
        lines = server.stderr.read().splitlines()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    accept_lines = [line for line in lines if "accept failed" in line]
    assert 1 <= len(accept_lines) <= 2, f"{len(accept_lines)} log lines in 3 s:\n" + "\n".join(lines[:5])


def test_scrapers_in_a_loop_share_renders_so_metrics_cost_a_bounded_share_of_the_agent() -> None:
    registry = CollectorRegistry()
    counter = Counter("scrapes_seen", "changes between scrapes", registry=registry)
    registry.register(Slow(0.02))  # a registry with many series: 20 ms a render
    http = HttpServer("127.0.0.1:0", registry, {}, workers=2)
    http.start()
    try:
        url = f"http://127.0.0.1:{http.port}/metrics"
        answers: list[int] = []

        def scrape() -> None:
            for _ in range(3):
                answers.append(get(url, timeout=10)[0])

        scrapers = [threading.Thread(target=scrape) for _ in range(4)]
        for thread in scrapers:
            thread.start()
        for thread in scrapers:
            thread.join(30)
        assert answers == [200] * 12
        renders = registry.get_sample_value("dra_gpu_metrics_render_seconds_count")
        assert renders is not None and renders <= 4, f"{renders} renders for 12 scrapes"

        counter.inc()  # an answer is rendered after its request: it shows what changed before
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})  # as Prometheus asks
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.headers["Content-Encoding"] == "gzip"
            text = gzip.decompress(reply.read())
        assert b"slow_metric 1.0" in text and b"scrapes_seen_total 1.0" in text
    finally:
        http.stop()
