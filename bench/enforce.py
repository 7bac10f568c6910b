"""The node's enforcement, measured on the fake driver and fake NVML with real processes.

Prints:
- memory: time from a process (run without the limiter, against the fake driver) taking its claim over the
  cap to its death by the agent's watch at 250 ms, over several runs;
- compute: for a process that bypasses the library and starts to run flat out under a 30 % claim while the
  agent already watches (its GPU work is its CPU time, as the fake NVML counts it), the time from its start
  to its first freeze and its share over each 10 s window after, over several runs (needs root and a
  freezer: cgroup v1 `freezer` or the v2 mount);
- watch CPU: the agent's CPU for the memory watch at 8 GPUs x 50 claims with the watch at 250 ms (floors
  and utilization once a second, a full sample every 5 s), when nothing changes and when every process's
  memory changes at every watch;
- honest throughput: work an honest process does while the agent watches 8 x 50 claims at 250 ms, over the
  same without the agent (an honest claim is never frozen: what is left is the watch's own CPU).

    .venv/bin/python bench/enforce.py [--runs 5] [--seconds 30] [--compute-watch-ms 1000]

(`--compute-watch-ms 1000`: the compute runs at the agent's default memory watch.)
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import monitor as monitor_bench  # bench/monitor.py: the 8 x 50 node
from fakes import fake_pynvml

from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.monitor import Monitor, NvmlSampler, PodDirectory
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.watchdog import Watchdog
from dra_gpu.plugin.checkpoint import Checkpoint, CheckpointStore, ClaimState, PreparedClaim, ShareRecord
from dra_gpu.plugin.holdings import prepared_holdings

GiB = 2**30
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "native" / "limiter" / "build"
UUID = "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000"
CGROUP = Path("/sys/fs/cgroup")
WATCH_S = 0.25


def one_claim_node(
    root: Path, memory: int, cores: int, procs: Path, watch_s: float = WATCH_S
) -> tuple[Monitor, FakeKube, Path, str, str]:
    """An agent's monitor holding one limiter claim (no watchdog policy: the node's default) on one GPU."""
    driver = fake_pynvml.FakeDriver(gpus=[fake_pynvml.FakeGpu(uuid=UUID)], process_dir=str(procs))
    fake_pynvml.install(driver)
    uid = "00000000-0000-4000-8000-00000000000b"
    checkpoint = Checkpoint()
    checkpoint.claims[uid] = PreparedClaim(
        uid=uid,
        namespace="bench",
        name="claim",
        state=ClaimState.PREPARE_COMPLETED,
        shares=[
            ShareRecord(
                device="gpu-0",
                gpu=UUID,
                strategy="Limiter",
                shareId=uid,
                detail={"memoryLimit": str(memory), "coresLimit": str(cores)},
            )
        ],
    )
    store = CheckpointStore(root / "checkpoint.json")
    store.save(checkpoint)
    api = FakeKube()
    container_id = secrets.token_hex(32)
    pod = api.create("Pod", builders.pod("pod", ["claim"], namespace="bench", node_name="node"))
    api.update_status("Pod", builders.with_container_ids(pod, {"main": f"containerd://{container_id}"}))
    proc = ProcReader(root / "proc")
    monitor = Monitor(
        prepared=prepared_holdings(store.load),
        claims_dir=root / "claims",
        gpus=lambda: [UUID],
        pods=PodDirectory(api, "node"),
        watchdog=Watchdog(api, "node", proc),
        sampler=NvmlSampler(fake_pynvml),
        proc=proc,
        interval_s=5.0,
        watch_interval_s=watch_s,
        cgroup_root=CGROUP,
    )
    return monitor, api, root / "proc", objects.uid(pod), container_id


def place(proc_root: Path, pid: int, pod_uid: str, container_id: str, extra: str = "") -> None:
    d = proc_root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(f"{extra}1:name=systemd:/kubepods/pod{pod_uid}/{container_id}\n")
    (d / "stat").write_bytes(Path(f"/proc/{pid}/stat").read_bytes())
    (d / "maps").write_text("")


def memory_catch(runs: int) -> list[float]:
    """Seconds from a bypassing process holding 2 GiB under a 1 GiB claim to its SIGKILL by the agent."""
    caught = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="dg-enforce-") as tmp:
            procs = Path(tmp) / "driver-processes"
            procs.mkdir()
            monitor, _, proc_root, pod_uid, cid = one_claim_node(Path(tmp), GiB, 50, procs)
            monitor.start()
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("DRAGPU_", "FAKE_CUDA_", "LD_PRELOAD"))
            }
            env.update(
                LD_LIBRARY_PATH=str(BUILD / "fake"),
                FAKE_CUDA_PROCESS_DIR=str(procs),
                CUDA_VISIBLE_DEVICES=UUID,
            )
            probe = f"read go; exec {BUILD / 'limiter-probe'} alloc {2 * GiB} 1 --hold"
            child = subprocess.Popen(
                ["sh", "-c", probe], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            assert child.stdin is not None and child.stdout is not None
            place(proc_root, child.pid, pod_uid, cid)
            child.stdin.write("go\n")
            child.stdin.flush()
            while child.stdout.readline().strip() != "holding":
                pass
            over = time.monotonic()
            child.wait(timeout=60)
            caught.append(time.monotonic() - over)
            monitor.stop()
            fake_pynvml.install(None)
    return caught


def compute_share(seconds: float, watch_s: float = WATCH_S) -> tuple[float | None, list[float]]:
    """When a process that starts to run flat out under a 30 % claim is first frozen (seconds after it started),
    and the share it reaches over each 10 s window after."""
    base = freezer_base()
    assert base is not None
    name = f"dra-gpu-bench-{secrets.token_hex(4)}"
    path = base / name
    path.mkdir()
    line = f"7:freezer:/{name}\n" if base.name == "freezer" else f"0::/{name}\n"
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import sys\nsys.stdin.readline()\nwhile True: pass"], stdin=subprocess.PIPE
    )
    try:
        (path / "cgroup.procs").write_text(str(spinner.pid))
        with tempfile.TemporaryDirectory(prefix="dg-enforce-") as tmp:
            procs = Path(tmp) / "driver-processes"
            procs.mkdir()
            monitor, _, proc_root, pod_uid, cid = one_claim_node(Path(tmp), 4 * GiB, 30, procs, watch_s)
            place(proc_root, spinner.pid, pod_uid, cid, extra=line)
            driver = fake_pynvml._driver
            assert driver is not None
            hz = os.sysconf("SC_CLK_TCK")

            def cpu() -> float:
                fields = Path(f"/proc/{spinner.pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / hz

            monitor.start()
            # The agent already watches the node when the process starts to spin (on the GPU, as the fake
            # driver counts it): caught is from then to its first freeze, wherever the watch's cycle stood.
            time.sleep(1.0 + random.random())
            assert spinner.stdin is not None
            start, cpu0 = time.monotonic(), cpu()
            driver.gpus[0].processes[spinner.pid] = GiB
            # sampled by the driver from here, as a real one samples every process it runs
            driver.gpus[0].runs_on_cpu[spinner.pid] = (round(cpu0 * hz), int(start * 1e6))
            spinner.stdin.write(b"go\n")
            spinner.stdin.flush()
            first = None
            windows = []
            mark, mark_cpu = start, cpu0
            while time.monotonic() - start < seconds:
                time.sleep(0.05)
                account = next(iter(monitor.hold.accounts.values()), None)
                if first is None and account is not None and account.freezes:
                    first = time.monotonic() - start
                    mark, mark_cpu = time.monotonic(), cpu()
                if first is not None and time.monotonic() - mark >= 10:
                    windows.append((cpu() - mark_cpu) / (time.monotonic() - mark))
                    mark, mark_cpu = time.monotonic(), cpu()
            monitor.stop()
            fake_pynvml.install(None)
        return first, windows
    finally:
        spinner.kill()
        spinner.wait()
        if base.name == "freezer":
            (path / "freezer.state").write_text("THAWED")
        else:
            (path / "cgroup.freeze").write_text("0")
        path.rmdir()


def freezer_base() -> Path | None:
    """Where the bench makes its cgroup: the v1 freezer's hierarchy, else the v2 mount beside it."""
    if os.geteuid() != 0:
        return None
    base = CGROUP / "freezer" if (CGROUP / "freezer").is_dir() else CGROUP / "unified"
    return base if base.is_dir() else None


def watch_cpu(rounds: int) -> tuple[float, float]:
    """Percent of one core for the watch at 250 ms at 8 x 50: nothing changing, and every process changing."""
    with tempfile.TemporaryDirectory(prefix="dg-monitor-") as tmp:
        monitor, _ = monitor_bench.build(Path(tmp), 8, 50)
        monitor.sample_once()
        monitor.watch_once()
        driver = fake_pynvml._driver
        assert driver is not None
        results = []
        for churn in (False, True):
            cpu = 0.0
            per_second = int(1 / WATCH_S)
            for r in range(rounds):
                for w in range(per_second):
                    if churn:
                        for gpu in driver.gpus:
                            gpu.processes = {pid: (used or 0) + 4096 for pid, used in gpu.processes.items()}
                    monitor._floors_at = (
                        0.0 if w == 0 else time.monotonic()
                    )  # floors and GPU time once a second
                    start = time.process_time()
                    monitor.watch_once()
                    cpu += time.process_time() - start
                if r % 5 == 0:
                    start = time.process_time()
                    monitor.sample_once()
                    cpu += time.process_time() - start
            results.append(100 * cpu / rounds)
        monitor.stop()
        fake_pynvml.install(None)
    return results[0], results[1]


def honest_ratio(seconds: float) -> float:
    """Work an honest process does while the agent watches 8 x 50 claims at 250 ms, over without."""
    work = [
        sys.executable,
        "-c",
        f"import time\nn=0\nend=time.monotonic()+{seconds}\nwhile time.monotonic()<end: n+=1\nprint(n)",
    ]

    def run() -> int:
        return int(subprocess.run(work, capture_output=True, text=True, check=True).stdout)

    alone = run()
    with tempfile.TemporaryDirectory(prefix="dg-monitor-") as tmp:
        monitor, _ = monitor_bench.build(Path(tmp), 8, 50)
        monitor.watch_interval_s = WATCH_S
        monitor.start()
        watched = run()
        monitor.stop()
        fake_pynvml.install(None)
    return watched / alone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=30.0, help="of each compute run")
    parser.add_argument(
        "--compute-watch-ms",
        type=float,
        default=WATCH_S * 1000,
        help="the memory watch during the compute runs",
    )
    args = parser.parse_args()
    caught = memory_catch(args.runs)
    print(
        f"memory: over the cap to killed (watch {WATCH_S * 1000:.0f} ms): median {statistics.median(caught):.2f} s, "
        f"max {max(caught):.2f} s over {len(caught)} runs (goal <= 1 s)"
    )
    if freezer_base() is None:
        print("compute: skipped (a real cgroup needs root, and a cgroup v1 freezer or the v2 mount)")
    else:
        caught, shares = [], []
        for _ in range(args.runs):
            first, windows = compute_share(args.seconds, args.compute_watch_ms / 1000)
            caught.append(float("inf") if first is None else first)
            shares += windows
        worst = max(shares, default=float("nan"))
        print(
            f"compute (watch {args.compute_watch_ms:.0f} ms): a process that starts to run flat out under a 30 % "
            f"claim, first frozen after: median "
            f"{statistics.median(caught):.2f} s, max {max(caught):.2f} s over {len(caught)} runs (goal <= 2 s); "
            f"share per 10 s window after: mean {100 * statistics.fmean(shares or [float('nan')]):.1f} %, worst "
            f"{100 * worst:.1f} % (goal <= ceiling + 2 points)"
        )
    steady, churn = watch_cpu(10)
    print(
        f"watch CPU at 8 GPUs x 50 claims, watch {WATCH_S * 1000:.0f} ms: {steady:.2f} % of one core when nothing "
        f"changes, {churn:.2f} % when every process's memory changes at every watch (goal < 2 %)"
    )
    print(f"honest throughput under the watch: {100 * honest_ratio(5.0):.1f} % of without (goal >= 99 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
