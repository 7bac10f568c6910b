"""Node agent usage monitor: CPU cost at 8 GPUs x 50 claims, as a percentage of one core.

Builds a node as the agent sees it: 400 prepared Limiter claims in the checkpoint (50 per GPU), each
with its limiter region file, a pod per claim in the API fake, one GPU process per pod in fake NVML
(with utilization samples) and its `/proc/<pid>/cgroup` and `maps`. Then it times the monitor's
samplings (checkpoint, regions, NVML, cgroups, watchdog), the memory watches between them (NVML's
per-process memory, cgroups, each claim's floor written, the watchdog) and the scrapes of /metrics, and
prints the CPU they take at the default sampling and watch intervals and a 15 s scrape interval. Goal:
under 2 % of a core.

    .venv/bin/python bench/monitor.py [--gpus 8] [--claims-per-gpu 50] [--rounds 20]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import fake_pynvml

from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi import region as layout
from dra_gpu.monitor import DEFAULT_INTERVAL_S, Monitor, MonitorCollector, NvmlSampler, PodDirectory
from dra_gpu.monitor.monitor import DEFAULT_WATCH_INTERVAL_S
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.watchdog import Watchdog
from dra_gpu.plugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimState,
    PreparedClaim,
    ShareRecord,
)
from dra_gpu.plugin.holdings import prepared_holdings
from dra_gpu.plugin.sharing.modes.limiter_region import make_region

GOAL_PERCENT = 2.0
SCRAPE_INTERVAL_S = 15.0
GiB = 2**30


def write_region(path: Path, uuid: str, used: int) -> int:
    """A claim's region as the agent makes it (`make_region`), with one device and one process slot holding
    `used` bytes as a limited process would fill them in; the returned descriptor holds the slot's lock, as
    the process would. Bench only."""
    path.mkdir(parents=True, exist_ok=True)
    region = path / layout.REGION_FILE
    make_region(region)
    fd = os.open(region, os.O_RDWR)
    device = bytearray(layout._DEV_BYTES)
    device[: len(uuid)] = uuid.encode()
    struct.pack_into("=I", device, layout._READY_AT, 1)
    struct.pack_into("=q", device, layout._USED_AT, used)
    os.pwrite(fd, bytes(device), layout._DEVS_AT)
    slot = bytearray(layout.SLOT_BYTES)
    layout._SLOT_OWNER.pack_into(slot, 0, layout.SLOT_OWNED, os.getpid(), 0, 0)
    struct.pack_into("=q", slot, layout._SLOT_USED_AT, used)
    os.pwrite(fd, bytes(slot), layout.SLOTS_AT)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(layout._FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 1, 1, 0))
    return fd


def build(root: Path, gpus: int, per_gpu: int) -> tuple[Monitor, CollectorRegistry]:
    api = FakeKube()
    driver = fake_pynvml.FakeDriver(
        gpus=[fake_pynvml.FakeGpu(uuid=f"GPU-{g:08x}-0000-4000-8000-000000000000") for g in range(gpus)]
    )
    fake_pynvml.install(driver)
    checkpoint = Checkpoint()
    proc_root = root / "proc"
    held: list[int] = []  # the slot locks of the claims' "processes", held while the bench runs
    pid = 10000
    for g, gpu in enumerate(driver.gpus):
        for c in range(per_gpu):
            name = f"claim-{g}-{c}"
            claim_uid = f"{g:08x}-{c:04x}-4000-8000-000000000000"
            checkpoint.claims[claim_uid] = PreparedClaim(
                uid=claim_uid,
                namespace="bench",
                name=name,
                state=ClaimState.PREPARE_COMPLETED,
                shares=[
                    ShareRecord(
                        device=f"gpu-{g}",
                        gpu=gpu.uuid,
                        strategy="Limiter",
                        shareId=claim_uid,
                        detail={"memoryLimit": str(GiB), "coresLimit": "2", "watchdog": "Report"},
                    )
                ],
            )
            held.append(write_region(root / "claims" / claim_uid / "limiter", gpu.uuid, GiB // 2))
            layout.make_floor(root / "claims" / claim_uid / "limiter" / layout.FLOOR_FILE, [gpu.uuid])
            pod = api.create("Pod", builders.pod(f"pod-{g}-{c}", [name], namespace="bench", node_name="node"))
            container_id = f"{pid:064x}"
            api.update_status(
                "Pod", builders.with_container_ids(pod, {"main": f"containerd://{container_id}"})
            )
            uid = objects.uid(pod)
            d = proc_root / str(pid)
            d.mkdir(parents=True)
            (d / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n"
            )
            (d / "maps").write_text(
                "7f00-7f01 r-xp 0 08:01 2 /usr/local/lib/dra-gpu/libdragpu-limiter.so.1\n"
            )
            gpu.processes[pid] = GiB // 2 + 300 * 2**20
            pid += 1
    CheckpointStore(root / "checkpoint.json").save(checkpoint)
    proc = ProcReader(proc_root)
    monitor = Monitor(
        prepared=prepared_holdings(CheckpointStore(root / "checkpoint.json").load),
        claims_dir=root / "claims",
        gpus=lambda: [g.uuid for g in driver.gpus],
        pods=PodDirectory(api, "node"),
        watchdog=Watchdog(api, "node", proc),
        sampler=NvmlSampler(fake_pynvml),
        proc=proc,
    )
    registry = CollectorRegistry()
    registry.register(MonitorCollector(monitor))

    def release() -> None:
        for fd in held:
            os.close(fd)

    monitor.on_stop = release
    return monitor, registry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims-per-gpu", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dg-monitor-") as tmp:
        monitor, registry = build(Path(tmp), args.gpus, args.claims_per_gpu)
        monitor.sample_once()  # warm: the pod list, the limiter checks of new processes
        ts = 1_000_000
        sample_cpu = 0.0
        watch_cpu = 0.0
        scrape_cpu = 0.0
        for _ in range(args.rounds):
            ts += int(DEFAULT_INTERVAL_S * 1e6)
            for gpu in fake_pynvml._driver.gpus if fake_pynvml._driver else []:
                gpu.utilization = [(pid, ts, 20, 5) for pid in gpu.processes]
            start = time.process_time()
            monitor.sample_once()
            sample_cpu += time.process_time() - start
            start = time.process_time()
            monitor.watch_once()
            watch_cpu += time.process_time() - start
            start = time.process_time()
            body = generate_latest(registry)
            scrape_cpu += time.process_time() - start
        per_sample = sample_cpu / args.rounds
        per_watch = watch_cpu / args.rounds
        per_scrape = scrape_cpu / args.rounds
        watches = (DEFAULT_INTERVAL_S / DEFAULT_WATCH_INTERVAL_S - 1) / DEFAULT_INTERVAL_S  # per second
        percent = 100 * (
            per_sample / DEFAULT_INTERVAL_S + per_watch * watches + per_scrape / SCRAPE_INTERVAL_S
        )
        used = sum(f.memory_used or 0 for f in monitor.snapshot.claims.values())
        assert used == len(monitor.snapshot.claims) * GiB // 2, "every region's live slot was read"
        monitor.stop()
        claims = args.gpus * args.claims_per_gpu
        print(f"{args.gpus} GPUs x {args.claims_per_gpu} claims ({claims} claims, {claims} GPU processes)")
        print(f"sampling: {per_sample * 1000:.1f} ms CPU every {DEFAULT_INTERVAL_S:g} s")
        print(
            f"watch:    {per_watch * 1000:.1f} ms CPU every {DEFAULT_WATCH_INTERVAL_S:g} s between samplings"
        )
        print(f"scrape:   {per_scrape * 1000:.1f} ms CPU every {SCRAPE_INTERVAL_S:g} s ({len(body)} bytes)")
        families = Counter(
            line.split(b"{", 1)[0].split(b" ", 1)[0].decode()
            for line in body.splitlines()
            if line and not line.startswith(b"#")
        )
        print(f"          {sum(families.values())} series, by family:")
        for name, count in sorted(families.items(), key=lambda item: (-item[1], item[0])):
            print(f"            {name}: {count}")
        print(f"agent CPU for usage monitoring: {percent:.2f} % of one core (goal < {GOAL_PERCENT:g} %)")
        return 0 if percent < GOAL_PERCENT else 1


if __name__ == "__main__":
    sys.exit(main())
