"""Kubelet-plugin latency and CPU: prepare+unprepare of one limiter-mode claim over gRPC, as the kubelet sees it.

The node agent runs in a process of its own on temporary directories (real unix sockets, real gRPC,
real CDI and checkpoint files; its API server is the in-memory fake, its GPUs simulated), and this
process acts as the kubelet. It prints the median and 99th percentile of one prepare+unprepare round
trip and the agent's CPU time per round trip (all its threads, read from /proc/PID/task/*/schedstat
before and after each call), then the claims per second that 16 concurrent callers get, each
preparing and unpreparing its own limiter claim (calls are serialised per node, so this measures the
lock's overhead and fairness, not parallelism). With `--prepared N` the agent first prepares N other
limiter claims (50 per GPU; `--gpus` GPUs) and keeps them while it measures: the goal is the same as
with none, because a call's work must not grow with the claims the node already has. With
`--scrapers K` the usage monitor is on (so every claim has its series) and the agent's /metrics page is
measured: its size, its series (and those per claim, by family) and the median time to render it, as
the agent renders it for a scrape (20 renders, nothing else asking); then the latency is measured twice,
first with nobody scraping and then with K clients scraping /metrics in a loop all along, whose
renders are printed too: the goal is the same p99 with and without them. `--ceiling C` gives the
claims of `--prepared` a class that grants a compute ceiling of C (elastic claims that may borrow idle
time up to C %, instead of fixed 1 % shares): the page with every claim elastic.

The CDI directory is put on a tmpfs (`/dev/shm`) where there is one, as `/var/run/cdi` is on a
node; the state directory (checkpoint, per-claim directories) stays on the disk, as on a node
(`--state-parent` puts it elsewhere). A prepare and its unprepare make and remove seven inodes in the
state directory; on an ext4 without a journal, the kernel's inode allocation skips every inode deleted
in the last 30 s, so at hundreds of round trips a second beside 2,000 claims' inodes most of the agent's
CPU goes to that search (`perf`: `find_inode_bit`, `recently_deleted`). A node prepares a few claims a
second on a journalled file system, where the search is off; `--state-parent /dev/shm` measures the
agent without it.

    .venv/bin/python bench/prepare.py [--runs 500] [--callers 16] [--seconds 5] [--prepared 0]
        [--gpus 8] [--scrapers 0] [--ceiling 0] [--state-parent /tmp]

At 2,000 claims: `--prepared 2000 --gpus 40 --scrapers 2` (and `--ceiling 100` for elastic claims).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import IO, Any

import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.node_agent import NodeAgent, NodeAgentConfig
from dra_gpu.proto import dra_v1, dra_v1_grpc

GOAL_P99_MS = 10.0
GOAL_CPU_MS = 3.0
NODE = "bench-node"
GPUS = 8
PER_GPU = 50
"""Claims of `--prepared` per GPU (each 1 % of its compute and 1 GiB)."""
MEASURED = {"memory": "2Gi", "cores": "5"}
"""What each measured claim consumes: 17 of them (one + 16 callers) take at most 15 % of a GPU."""
KEPT = {"memory": "1Gi", "cores": "1"}
"""What each claim of `--prepared` consumes: 50 per GPU take half of each."""
BATCH = 25
"""Claims per call while preparing `--prepared` (a pod's worth is a few; this only saves time)."""
GOAL_PAGE_BYTES = 1_000_000
GOAL_RENDER_MS = 50.0
RENDERS = 20
"""Renders of /metrics timed for the page's median render time."""


def limiter_claim(
    api: FakeKube,
    name: str,
    device: str,
    share: int,
    consumed: dict[str, str] = MEASURED,
    ceiling: int = 0,
) -> Any:
    """A limiter claim allocated `consumed` of `device`; `ceiling` (0: none) the compute ceiling its class
    grants."""
    created = api.create("ResourceClaim", builders.claim(name, "limiter"))
    sharing: dict[str, Any] = {"strategy": "Limiter"}
    if ceiling:
        sharing["limiter"] = {"compute": {"limit": ceiling}}
    params = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "sharing": sharing}
    result = builders.device_result(
        "gpu", DRIVER_NAME, NODE, device, share_id=f"00000000-0000-4000-8000-{share:012d}", consumed=consumed
    )
    allocated = builders.allocation(
        [result], [builders.opaque_config(DRIVER_NAME, params, source="FromClass")]
    )
    pod = {"resource": "pods", "name": f"{name}-pod", "uid": f"pod-{share}"}
    stored = api.update_status("ResourceClaim", builders.allocated_claim(created, allocated, pod))
    return dra_v1.Claim(
        namespace=objects.namespace(stored), name=objects.name(stored), uid=objects.uid(stored)
    )


def cycle(stub: Any, claim: Any) -> None:
    prepared = stub.NodePrepareResources(dra_v1.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
    if prepared.claims[claim.uid].error:
        raise RuntimeError(prepared.claims[claim.uid].error)
    unprepared = stub.NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45)
    if unprepared.claims[claim.uid].error:
        raise RuntimeError(unprepared.claims[claim.uid].error)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in nanoseconds (schedstat: exact, not in ticks)."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            with open(f"{task.path}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total


def rss_kib(pid: int) -> int:
    """The resident memory of `pid`, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def page_figures(registry: CollectorRegistry, renders: int) -> dict[str, Any]:
    """The /metrics page of `registry` as a scrape gets it: its size, its series (those with a claim label
    by family) and how long each of `renders` renders took (wall clock: the render holds the interpreter's
    lock all along; and the rendering thread's CPU time, which a loaded machine inflates less)."""
    took, cpu = [], []
    page = b""
    for _ in range(renders):
        started, cpu_started = time.perf_counter(), time.thread_time()
        page = generate_latest(registry)
        took.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
    series, per_claim = 0, Counter[str]()
    for family in text_string_to_metric_families(page.decode()):
        for sample in family.samples:
            series += 1
            if "claim" in sample.labels:
                per_claim[sample.name] += 1
    return {
        "bytes": len(page),
        "series": series,
        "per_claim": dict(per_claim),
        "render_s": took,
        "cpu_s": cpu,
    }


def serve(
    root: Path, cdi_dir: Path, claims: int, kept: int, gpus: int, monitor: bool, ceiling: int = 0
) -> int:
    """The agent's process: the agent, its API fake with `claims` limiter claims to measure with and
    `kept` more to prepare first, until stdin closes. A line `render` on stdin has it time the renders
    of its /metrics page into `page.json`."""
    logging.disable(logging.INFO)
    library = root / "lib" / "libdragpu-limiter.so.0.1.0"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"stand-in")
    api = FakeKube()
    config = NodeAgentConfig(
        node_name=NODE,
        state_dir=root / "state",
        cdi_dir=cdi_dir,
        registration_dir=root / "reg",
        plugins_dir=root / "plugins",
        limiter_library=library,
        nvidia_ctk_dirs=(),
        dev_root=root / "host",
        boot_id="bench",
        http_address="127.0.0.1:0",
        monitor_interval_s=5.0 if monitor else 0.0,
    )
    agent = NodeAgent(
        config, api, SimulatedInventory(f"{gpus}xH100-80GB", seed=NODE), SimulatedCommands(state_file=None)
    )
    agent.start()
    refs = [limiter_claim(api, f"bench-{i}", f"gpu-{i % gpus}", i) for i in range(claims)]
    others = [
        limiter_claim(api, f"kept-{i}", f"gpu-{i % gpus}", claims + i, KEPT, ceiling) for i in range(kept)
    ]
    ready = root / "claims.json"
    ready.with_suffix(".tmp").write_text(
        json.dumps(
            {
                "socket": str(config.service_socket),
                "http_port": agent.http_port,
                "pid": os.getpid(),
                "claims": [[c.namespace, c.name, c.uid] for c in refs],
                "kept": [[c.namespace, c.name, c.uid] for c in others],
            }
        )
    )
    ready.with_suffix(".tmp").rename(ready)
    try:
        for line in sys.stdin:  # until the benchmark closes our stdin
            if line.strip() == "render":
                page = root / "page.json"
                page.with_suffix(".tmp").write_text(
                    json.dumps(page_figures(agent.plugin.metrics.registry, RENDERS))
                )
                page.with_suffix(".tmp").rename(page)
    finally:
        agent.stop(grace_s=0)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="sequential prepare+unprepare round trips")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers for the throughput run")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the throughput run")
    parser.add_argument(
        "--prepared", type=int, default=0, help="other claims to prepare first and keep while measuring"
    )
    parser.add_argument("--gpus", type=int, default=GPUS, help="simulated GPUs of the node")
    parser.add_argument(
        "--scrapers",
        type=int,
        default=0,
        help="clients scraping /metrics in a loop (the latency is also measured without them first)",
    )
    parser.add_argument(
        "--ceiling", type=int, default=0, help="the compute ceiling the claims of --prepared may borrow up to"
    )
    parser.add_argument(
        "--state-parent",
        type=Path,
        default=Path("/tmp"),
        help="directory to make the agent's state directory in (default /tmp: on the disk)",
    )
    parser.add_argument("--serve", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.state_parent.is_dir():
        parser.error(f"--state-parent {args.state_parent}: no such directory; give an existing one")
    if args.serve:
        root, cdi, claims, kept, gpus, monitor, ceiling = args.serve
        return serve(Path(root), Path(cdi), int(claims), int(kept), int(gpus), monitor == "1", int(ceiling))
    if args.prepared > PER_GPU * args.gpus:
        parser.error(
            f"--prepared: at most {PER_GPU * args.gpus} ({PER_GPU} claims of 1 % on each of {args.gpus} GPUs); "
            f"give more --gpus"
        )

    root = Path(tempfile.mkdtemp(prefix="dg-bench-", dir=args.state_parent))
    tmpfs = Path("/dev/shm")
    cdi_root = Path(tempfile.mkdtemp(prefix="dg-bench-cdi-", dir=tmpfs if tmpfs.is_dir() else root))
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(root),
            str(cdi_root),
            str(args.callers + 1),
            str(args.prepared),
            str(args.gpus),
            "1" if args.scrapers else "0",
            str(args.ceiling),
        ],
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        ready = root / "claims.json"
        deadline = time.monotonic() + 60 + args.prepared
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                print("the plugin process did not start", file=sys.stderr)
                return 2
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        claims = [dra_v1.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in info["claims"]]
        kept = [dra_v1.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in info["kept"]]
        with grpc.insecure_channel(f"unix://{info['socket']}") as channel:
            stub = dra_v1_grpc.DRAPluginStub(channel)
            rss = rss_kib(info["pid"])
            prepare_kept(stub, kept)
            if kept:
                time.sleep(6 if args.scrapers else 0)  # a sampling of the usage monitor over them all
                grown = rss_kib(info["pid"]) - rss
                print(
                    f"  the agent's memory grew by {grown / 1024:.1f} MiB, {grown / len(kept):.1f} KiB a claim"
                )
            goals = True
            if args.scrapers:
                assert server.stdin is not None
                goals = report_page(root / "page.json", server.stdin, len(kept)) and goals
                goals = measure(stub, info["pid"], claims[0], claims[1:], args, 0) and goals
            with Scrapers(info["http_port"], args.scrapers) as scrapers:
                goals = measure(stub, info["pid"], claims[0], claims[1:], args, args.scrapers) and goals
            scrapers.report()
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cdi_root, ignore_errors=True)
    return 0 if goals else 1


def prepare_kept(stub: Any, kept: list[Any]) -> None:
    """Prepare the claims of `--prepared`, a batch per call, and say how long that took."""
    if not kept:
        return
    started = time.perf_counter()
    for first in range(0, len(kept), BATCH):
        batch = kept[first : first + BATCH]
        answer = stub.NodePrepareResources(dra_v1.NodePrepareResourcesRequest(claims=batch), timeout=600)
        errors = [answer.claims[c.uid].error for c in batch if answer.claims[c.uid].error]
        if errors:
            raise RuntimeError(f"preparing the claims to keep: {errors[0]}")
    print(f"{len(kept)} other claims prepared first, in {time.perf_counter() - started:.1f} s")


def report_page(path: Path, server: IO[str], claims: int) -> bool:
    """Have the agent's process time the renders of its /metrics page, and print its figures."""
    server.write("render\n")
    server.flush()
    deadline = time.monotonic() + 600
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the agent's process did not render its /metrics page")
        time.sleep(0.05)
    page = json.loads(path.read_text())
    per_claim = page["per_claim"]
    render_ms = 1000 * statistics.median(page["render_s"])
    print(
        f"/metrics at {claims} claims: {page['bytes'] / 1000:.0f} kB, {page['series']} series, "
        f"{sum(per_claim.values()) / max(claims, 1):.2f} per claim; render median {render_ms:.1f} ms "
        f"(min {1000 * min(page['render_s']):.1f}, max {1000 * max(page['render_s']):.1f}), CPU median "
        f"{1000 * statistics.median(page['cpu_s']):.1f} ms (goal: <= {GOAL_PAGE_BYTES / 1e6:g} MB, "
        f"<= {GOAL_RENDER_MS:g} ms)"
    )
    for name, count in sorted(per_claim.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {name}: {count}")
    return int(page["bytes"]) <= GOAL_PAGE_BYTES and render_ms <= GOAL_RENDER_MS


class Scrapers:
    """`count` clients scraping /metrics in a loop while the measurement runs."""

    def __init__(self, port: int, count: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._scrape) for _ in range(count)]
        self.scrapes = 0
        self.body = b""

    def _scrape(self) -> None:
        while not self.stop.is_set():
            request = urllib.request.Request(self.url, headers={"Accept-Encoding": "gzip"})  # as Prometheus
            with urllib.request.urlopen(request, timeout=30) as reply:
                body = reply.read()
                self.body = gzip.decompress(body) if reply.headers["Content-Encoding"] == "gzip" else body
            self.scrapes += 1

    def __enter__(self) -> Scrapers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def report(self) -> None:
        if not self.threads:
            return
        with urllib.request.urlopen(self.url, timeout=30) as reply:
            text = reply.read().decode()
        samples = dict(
            line.rsplit(" ", 1)
            for line in text.splitlines()
            if line.startswith("dra_gpu_metrics_render_seconds_") and not line.startswith("#")
        )
        count = float(samples.get("dra_gpu_metrics_render_seconds_count", 0))
        total = float(samples.get("dra_gpu_metrics_render_seconds_sum", 0))
        print(
            f"{len(self.threads)} clients scraped /metrics {self.scrapes} times meanwhile: "
            f"{len(self.body) / 1024:.0f} KiB, {count:.0f} renders of {1000 * total / max(count, 1):.0f} ms each"
        )


def measure(
    stub: Any, pid: int, single: Any, claims: list[Any], args: argparse.Namespace, scrapers: int
) -> bool:
    for _ in range(min(50, args.runs)):
        cycle(stub, single)  # warm up caches and connections
    samples, cpu = [], []
    for _ in range(args.runs):
        cpu_before = cpu_ns(pid)
        started = time.perf_counter()
        cycle(stub, single)
        samples.append((time.perf_counter() - started) * 1000)
        cpu.append((cpu_ns(pid) - cpu_before) / 1e6)
    median, p99 = statistics.median(samples), percentile(samples, 0.99)
    cpu_median, cpu_p99 = statistics.median(cpu), percentile(cpu, 0.99)
    print(
        f"prepare+unprepare of one limiter claim over gRPC ({args.runs} runs, "
        f"{args.prepared} other claims prepared, {scrapers} scrapers):"
    )
    print(f"  latency median {median:.2f} ms, p99 {p99:.2f} ms (goal: p99 < {GOAL_P99_MS:.0f} ms)")
    print(
        f"  agent CPU per call median {cpu_median:.2f} ms, p99 {cpu_p99:.2f} ms, mean "
        f"{statistics.fmean(cpu):.2f} ms (goal: median <= {GOAL_CPU_MS:.0f} ms)"
    )

    done = [0] * len(claims)
    failures: list[str] = []
    stop = threading.Event()
    barrier = threading.Barrier(len(claims) + 1)

    def caller(index: int) -> None:
        barrier.wait()
        while not stop.is_set():
            try:
                cycle(stub, claims[index])
            except (RuntimeError, grpc.RpcError) as exc:
                failures.append(str(exc))
                return
            done[index] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(claims))]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(args.seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    print(f"{len(claims)} concurrent callers for {elapsed:.1f} s:")
    print(
        f"  {sum(done) / elapsed:.0f} claims/s prepared and unprepared "
        f"(fewest per caller: {min(done)}, most: {max(done)})"
    )
    if failures:
        print(f"  {len(failures)} failures, first: {failures[0]}")
        return False
    return p99 < GOAL_P99_MS and cpu_median <= GOAL_CPU_MS


if __name__ == "__main__":
    sys.exit(main())
