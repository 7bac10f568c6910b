"""The node agent's usage monitor: every interval, who uses what on this node's GPUs.

For every prepared claim (the plugin's records, handed in as `PreparedClaims`, say which GPUs and
limits it holds) and every GPU it holds: memory in use (the limiter's region where the claim has one,
else the sum of its processes in NVML), compute busy time (NVML's per-process utilization, else the
limiter's measured launch time), time throttled and allocations refused (the limiter's region).
Processes are mapped to pod, container and claim through their cgroup and the node's pods (`placement`).
The figures feed the metrics and the watchdog.

Memory is watched more often than the rest (`watch_interval_s`, 1 s, able to run at 250 ms): every watch
reads NVML's per-process memory and hands the watchdog what is over a cap (`memory_caps`) or runs without the
limiter; at most every `floor_interval_s` it also publishes to each limiter claim its floor (`floors`), checks
the claims' activity files against the driver (`contradicted`) and feeds the compute hold (`compute_hold`).

One sampling pass reads the regions, NVML, the processes and the pods in an order that keeps their figures
consistent (the regions' counts before NVML): that order is `Monitor._sample`'s, and the jobs it calls on
keep their own state.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dra_gpu.config import WatchdogPolicy
from dra_gpu.limiter_abi.board import GPUS_DIR
from dra_gpu.limiter_abi.region import RegionDevice, SlotOwner, hand_back, read_region_slots
from dra_gpu.monitor.claim_files import ClaimFiles
from dra_gpu.monitor.compute_hold import ComputeHold
from dra_gpu.monitor.contradicted import Contradictions
from dra_gpu.monitor.elastic import ElasticLedger
from dra_gpu.monitor.figures import (
    LIMITER,
    ClaimFigures,
    ClaimHoldings,
    ClaimsView,
    ContainerFigures,
    Held,
    PreparedClaims,
    Snapshot,
)
from dra_gpu.monitor.floors import FloorPublisher
from dra_gpu.monitor.freezer import RECORDS_DIR, CgroupFreezer, FreezeRecords, freezer_of, namespace_root
from dra_gpu.monitor.memory_caps import MemoryCaps, Procs
from dra_gpu.monitor.nvml_usage import GpuProcesses, NvmlSampler
from dra_gpu.monitor.placement import Placed, Placement
from dra_gpu.monitor.pods import PodDirectory
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.monitor.watchdog import (
    CONTEXT_ALLOWANCE,
    LIMITER_ALLOWANCE,
    Reason,
    Violation,
    Watchdog,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_WATCH_INTERVAL_S",
    "FLOOR_INTERVAL_S",
    "ClaimFigures",
    "ClaimHoldings",
    "ContainerFigures",
    "Held",
    "Monitor",
    "PreparedClaims",
    "Snapshot",
]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
DEFAULT_WATCH_INTERVAL_S = 1.0
"""How often memory is watched (caps checked): the bound on what a forged record buys."""
FLOOR_INTERVAL_S = 1.0
"""At most how often a watch publishes the floors (each a read of the claim's region and a write of its floor
file): a faster watch checks caps, the floors follow at this pace."""


class Monitor:
    """Samples on its own thread; `snapshot` is replaced whole, so readers need no lock."""

    def __init__(
        self,
        prepared: PreparedClaims,
        claims_dir: Path,
        gpus: Callable[[], list[str]],
        pods: PodDirectory,
        watchdog: Watchdog,
        sampler: NvmlSampler | None = None,
        proc: ProcReader | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        context_allowance: int = CONTEXT_ALLOWANCE,
        watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S,
        limiter_allowance: int = LIMITER_ALLOWANCE,
        floor_interval_s: float = FLOOR_INTERVAL_S,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        limiter_library: Path | None = None,
    ) -> None:
        self._proc = proc or ProcReader()
        self.placement = Placement(self._proc, pods, limiter_library)
        self.caps = MemoryCaps(self.placement.violation, context_allowance, limiter_allowance)
        self.floor_interval_s = floor_interval_s
        self.cgroup_root = cgroup_root
        """The host's cgroup mount, where the claims' containers are frozen (`compute_hold`)."""
        self.hold = ComputeHold(
            self._freezer_of, records=FreezeRecords(Path(claims_dir).parent / RECORDS_DIR, cgroup_root)
        )
        self._cgroup_roots: dict[str, str] | None = None
        """Where the agent's cgroup namespace root is in the host's tree (`freezer.namespace_root`), found once."""
        self._floors_at = float("-inf")
        """When the floors were last published."""
        self._last_seen: tuple[list[ClaimHoldings], dict[str, dict[int, int | None]]] | None = None
        """What the last pass judged: the claims held and each GPU's processes with their bytes."""
        self._last_live: set[int] = set()
        self._pending = False
        """The last pass met a process of a pod the pod directory did not list yet."""
        self.watch_interval_s = watch_interval_s
        self._prepared = prepared
        self._claims_dir = claims_dir
        self._gpus = gpus
        self.watchdog = watchdog
        self._sampler = sampler
        self.interval_s = interval_s
        self.snapshot = Snapshot()
        self.samples = 0
        self.sampled_at = time.monotonic()
        """When the last sampling finished (or the monitor started): `stalled` reads it."""
        self._busy: dict[tuple[str, str], float] = {}
        self._container_busy: dict[tuple[str, str, str, str], float] = {}
        self._placed: dict[tuple[int, str], Placed] = {}
        """(pid, gpu) -> where the last pass placed the process (`Placement.place`)."""
        self._view = ClaimsView([])
        self._placed_for = self._view
        """The claims it was placed among."""
        self.floors = FloorPublisher(str(claims_dir))
        self.slots_reclaimed: dict[tuple[str, str], int] = {}
        """(namespace, claim) -> slots of the claim's region handed back because their process was gone."""
        self._elastic_dir = Path(claims_dir).parent / GPUS_DIR
        self._elastic = ElasticLedger(self._elastic_dir)
        self.files = ClaimFiles(str(claims_dir), str(self._elastic_dir))
        self.contradictions = Contradictions(self._elastic_dir, self.files, watchdog)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.on_stop: Callable[[], None] | None = None

    @property
    def context_allowance(self) -> int:
        """What NVML may count per process beyond what its claim was charged (context memory; see
        `CONTEXT_ALLOWANCE`)."""
        return self.caps.context_allowance

    @context_allowance.setter
    def context_allowance(self, value: int) -> None:
        self.caps.context_allowance = value

    @property
    def limiter_allowance(self) -> int:
        """What NVML may count for a limiter claim on a GPU beyond its cap, once per claim (LIMITER_ALLOWANCE)."""
        return self.caps.limiter_allowance

    @limiter_allowance.setter
    def limiter_allowance(self, value: int) -> None:
        self.caps.limiter_allowance = value

    @property
    def contradicted(self) -> dict[tuple[str, str], float]:
        """(claim uid, gpu) -> since when its activity file says busy while the driver sees it idle."""
        return self.contradictions.contradicted

    def idle_by_driver(self) -> set[tuple[str, str]]:
        """(claim uid, gpu) of the claims whose activity file the driver's figures contradict now."""
        return set(self.contradictions.contradicted)

    # -- lifecycle --
    def start(self) -> None:
        self.hold.records.thaw_left()  # what an agent killed mid-freeze left frozen: nothing is held yet
        self._thread = threading.Thread(target=self._loop, name="usage-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10)
            self._thread = None
        if self._sampler is not None:
            self._sampler.close()
        locked = self._lock.acquire(timeout=10)  # a hung sampling must not keep a claim frozen
        try:
            self.hold.close(time.monotonic())
            if locked:
                self.files.reopen()
                self.floors.reopen()
        finally:
            if locked:
                self._lock.release()
        if self.on_stop is not None:
            self.on_stop()

    def _loop(self) -> None:
        full_due = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= full_due:
                    full_due = now + self.interval_s
                    self.sample_once()
                else:
                    self.watch_once()
            except Exception:
                log.exception("usage sampling failed; retrying at the next interval")
            now = time.monotonic()
            wake = min(now + self.watch_interval_s, full_due)
            with self._lock:
                look = self.hold.next_look(now)
            self._stop.wait(max(0.0, (wake if look is None else min(wake, look)) - now))

    def stalled(self) -> str | None:
        """Why /healthz should fail: no sampling has finished for several intervals (a hung read, a hung
        NVML call), so no claim's usage is watched; None while samples keep coming."""
        late = time.monotonic() - self.sampled_at
        if self._thread is None or late <= max(3 * self.interval_s, 30.0):
            return None
        return f"the usage monitor has not finished a sample for {late:.0f} s"

    # -- one sampling --
    def sample_once(self) -> Snapshot:
        with self._lock:
            return self._sample(full=True)

    def watch_once(self) -> None:
        """Memory only: floors published, caps and the limiter's presence checked, the watchdog acts."""
        with self._lock:
            self._sample(full=False)

    def _sample(self, full: bool) -> Snapshot:
        prepared = self._prepared()
        if prepared != self._view.prepared:
            self._view = ClaimsView(prepared)
            self.files.reopen()  # a claim prepared again may have new files under the same name
            self.floors.reopen()
            self.files.retain({uid for uid, _ in self._view.held})
        elif full:
            self.files.reopen()  # a file replaced in place is read again within a sample
            self.floors.reopen()
        view = self._view
        held = view.held
        processes: dict[str, GpuProcesses] = {}
        floors_due = full or time.monotonic() >= self._floors_at + self.floor_interval_s
        # The regions' counts before NVML: memory freed in between is then in neither or in the count only.
        counts = (
            {uid: self.files.counts(uid) for uid in view.limited_claims}
            if self._sampler is not None and floors_due
            else {}
        )
        # GPU time is read with every full sample and floor, and at every watch while a claim is held back or
        # on its way there.
        busy_due = full or floors_due or self.hold.watching()
        if self._sampler is not None:
            gpus = self._gpus()
            processes = self._sampler.sample(gpus) if busy_due else self._sampler.memory(gpus)
        now = time.monotonic()
        self.hold.tick(now)
        seen = (prepared, {gpu: figures.memory for gpu, figures in processes.items()})
        if not busy_due and not self._pending and seen == self._last_seen:
            # Nothing the last pass judged has changed: the same claims, the same processes holding the same
            # bytes, each already mapped to its pod. Only the watchdog's due SIGKILLs are left to send.
            self.watchdog.handle(self.watchdog.active, self._last_live)
            return self.snapshot
        self._last_seen = seen
        snap = Snapshot()
        if full:
            for key, h in held.items():
                snap.claims[key] = ClaimFigures(h)
        violations: list[Violation] = []
        nvml_memory, live = self._place_all(
            view, processes, snap if full else None, floors_due, busy_due, violations
        )
        self._last_live = live
        if busy_due:
            violations += self._hold_compute(held, nvml_memory, processes, now)
            self.contradictions.check(view.limited, nvml_memory, processes)
        self.placement.forget(live)
        if floors_due:
            self.floors.publish(view.limited, nvml_memory, counts, processes)
            self._floors_at = time.monotonic()
        self.caps.note_growth(nvml_memory, processes)
        if not full:
            violations += self.caps.over_caps(held, nvml_memory)
            # What only a full sample finds stays active in between, and a claim held back stays so.
            carried = (Reason.MISMATCH,) if busy_due else (Reason.MISMATCH, Reason.COMPUTE)
            violations += [v for v in self.watchdog.active if v.reason in carried and v.pid in live]
            self.watchdog.handle(violations, live)
            return self.snapshot
        return self._finish(view, snap, nvml_memory, processes, violations, live)

    def _place_all(
        self,
        view: ClaimsView,
        processes: dict[str, GpuProcesses],
        snap: Snapshot | None,
        floors_due: bool,
        busy_due: bool,
        violations: list[Violation],
    ) -> tuple[dict[tuple[str, str], Procs], set[int]]:
        """Places every GPU process; per share, its processes with their bytes; and the PIDs NVML listed.

        A pass places a process where the last pass did while the claims are the same: a watch between floors
        reads nothing but NVML, a floor or a sample checks that each process is still the one placed (its
        start time: a PID reused is another process, placed anew). `snap`: a full sample's, whose containers'
        memory is added up here."""
        placement = self.placement
        reuse = self._placed if view is self._placed_for else {}
        placed: dict[tuple[int, str], Placed] = {}
        nvml_memory: dict[tuple[str, str], Procs] = {}
        live: set[int] = set()
        pending = False
        for gpu, figures in processes.items():
            busy_of = figures.busy_seconds if busy_due else None
            live.update(figures.memory)
            for pid, used in figures.memory.items():
                where = reuse.get((pid, gpu))
                if where is not None and floors_due and not placement.same_process(pid):
                    where = None
                if where is None:
                    placement.pending = False
                    where = placement.place(pid, gpu, view)
                    if placement.pending:
                        pending = True
                    else:
                        placed[(pid, gpu)] = where
                else:
                    placed[(pid, gpu)] = where
                if where.violations:
                    violations.extend(where.violations)
                key = where.key
                if key is None:
                    continue
                procs = nvml_memory.get(key)
                if procs is None:
                    procs = nvml_memory[key] = []
                procs.append((pid, used or 0, where.has_limiter))
                if snap is not None and where.owner is not None:
                    cfig = snap.containers.setdefault(where.container, (where.owner, ContainerFigures()))[1]
                    cfig.memory_used += used or 0
                if busy_of:
                    busy = busy_of.get(pid, 0.0)
                    if busy:
                        ckey = where.container
                        self._container_busy[ckey] = self._container_busy.get(ckey, 0.0) + busy
                        self._busy[key] = self._busy.get(key, 0.0) + busy
        self._placed, self._placed_for = placed, view
        self._pending = pending
        return nvml_memory, live

    def _finish(
        self,
        view: ClaimsView,
        snap: Snapshot,
        nvml_memory: dict[tuple[str, str], Procs],
        processes: dict[str, GpuProcesses],
        violations: list[Violation],
        live: set[int],
    ) -> Snapshot:
        """A full sample's figures per claim and container, from the regions and NVML; the watchdog acts."""
        held = view.held
        regions: dict[str, list[RegionDevice] | None] = {}
        candidates: dict[str, list[tuple[int, SlotOwner]]] = {}
        for uid in view.limited_claims:
            regions[uid], candidates[uid] = read_region_slots(f"{self._claims_dir}/{uid}/limiter")
        self._reclaim_slots(view, candidates)
        self.placement.reread_library()
        for key, fig in snap.claims.items():
            h = fig.held
            region = _device(regions.get(h.claim.uid), h.gpu) if h.sharing == LIMITER else None
            procs = nvml_memory.get(key, [])
            nvml_used = sum(p[1] for p in procs) if key[1] in processes else None
            fig.memory_used = region.used_bytes if region is not None else nvml_used
            if region is not None:
                fig.throttled_seconds, fig.refused = region.throttled_seconds, region.refused
            utilization = processes.get(key[1])
            if utilization is not None and utilization.utilization_known:
                fig.busy_seconds = self._busy.get(key, 0.0)
            elif region is not None:
                fig.busy_seconds = region.busy_seconds
            if region is not None and nvml_used is not None:
                mismatch = self.caps.mismatch(h, procs, region.used_bytes, nvml_used)
                if mismatch is not None:
                    violations.append(mismatch)
            if nvml_used is not None and procs:
                violations.extend(self.caps.over_cap(h, procs))

        for key, elastic in self._elastic.sample(list(view.limited), time.monotonic()).items():
            snap.claims[key].elastic = elastic

        for ckey, (_, cfig) in snap.containers.items():
            cfig.busy_seconds = self._container_busy.get(ckey, 0.0)
        self._busy = {k: v for k, v in self._busy.items() if k in held}
        self._container_busy = {k: v for k, v in self._container_busy.items() if (k[0], k[3]) in held}
        self.slots_reclaimed = {k: v for k, v in self.slots_reclaimed.items() if k in view.by_name}
        self.watchdog.retain({key: c.uid for key, c in view.by_name.items()})
        self.watchdog.handle(violations, live)
        self.snapshot = snap
        self.samples += 1
        self.sampled_at = time.monotonic()
        return snap

    def _freezer_of(self, pid: int) -> CgroupFreezer | None:
        text = self._proc.cgroup_text(pid)
        if text is None:
            return None
        if self._cgroup_roots is None and "/.." in text:  # the agent has a cgroup namespace of its own
            own = self._proc.cgroup_text(os.getpid())
            self._cgroup_roots = {} if own is None else namespace_root(own, os.getpid(), self.cgroup_root)
        return freezer_of(text, self.cgroup_root, self._cgroup_roots)

    def _hold_compute(
        self,
        held: dict[tuple[str, str], Held],
        nvml_memory: dict[tuple[str, str], Procs],
        processes: dict[str, GpuProcesses],
        now: float,
    ) -> list[Violation]:
        """Feeds each enforced claim's GPU time of this pass to the hold; ComputeOverCeiling for those it
        holds back (reported: the freeze is the action)."""
        usage: dict[tuple[str, str], tuple[float, float, list[int]]] = {}
        for key, h in held.items():
            figures = processes.get(h.gpu)
            if not h.enforced() or h.cores is None or figures is None or not figures.utilization_known:
                continue
            elastic = self.snapshot.claims[key].elastic if key in self.snapshot.claims else None
            ceiling = max(h.cores, elastic.ceiling) if elastic is not None else h.cores
            if ceiling >= 100:
                continue
            pids = [p[0] for p in nvml_memory.get(key, [])]
            busy = sum(figures.busy_seconds.get(pid, 0.0) for pid in pids)
            usage[key] = (ceiling / 100, busy, pids)
        self.hold.feed(now, usage)
        out = []
        for key, account in self.hold.accounts.items():
            if account.frozen_until is None and account.balance >= 0:
                continue
            h = held[key]
            for pid in sorted(p[0] for p in nvml_memory.get(key, [])):
                detail = (
                    f"the claim's GPU time is over its ceiling of {usage[key][0] * 100:g} % by more than "
                    f"{self.hold.margin * 100:g} points: its containers are frozen in a duty cycle (at most "
                    f"{self.hold.max_freeze_s:g} s at a time) until it has repaid what it took"
                )
                out.append(self.placement.violation(Reason.COMPUTE, pid, h, WatchdogPolicy.REPORT, detail))
        return out

    def _reclaim_slots(self, view: ClaimsView, candidates: dict[str, list[tuple[int, SlotOwner]]]) -> None:
        """Hands back the region slots of processes that are gone, in every limiter claim's region.

        The library frees a slot only for a process it can prove dead, which it cannot from another PID
        namespace: without this, every restarted pod or exited container of a claim shared by several pods
        would leave its memory charged for the claim's lifetime. The agent sees every process of the node
        (its proc root is the host's); /proc is scanned once per sampling, and only when a region has a
        slot whose lock no process holds (`candidates`: per limiter claim, from `read_region_slots`)."""
        if not any(candidates.values()):
            return
        index = self._proc.process_index()  # after the candidates were read: see `hand_back`
        for uid, slots in candidates.items():
            marked = hand_back(
                f"{self._claims_dir}/{uid}/limiter", [s for s in slots if index.alive(s[1]) is False]
            )
            if marked:
                claim = view.held_by_claim[uid][0].claim
                key = (claim.namespace, claim.name)
                self.slots_reclaimed[key] = self.slots_reclaimed.get(key, 0) + marked
                log.info(
                    "handed back the region slots of exited processes",
                    extra={"claim": f"{claim.namespace}/{claim.name}", "slots": marked},
                )


def _device(devices: list[RegionDevice] | None, gpu: str) -> RegionDevice | None:
    """The region's entry for the GPU (the library writes UUIDs as the driver reports them)."""
    if devices is None:
        return None
    wanted = gpu.lower().removeprefix("gpu-").removeprefix("mig-")
    return next(
        (d for d in devices if d.uuid.lower().removeprefix("gpu-").removeprefix("mig-") == wanted), None
    )
