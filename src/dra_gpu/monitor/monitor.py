"""The node agent's usage monitor: every interval, who uses what on this node's GPUs.

For every prepared claim (the plugin's records, handed in as `PreparedClaims`, say which GPUs and
limits it holds) and every GPU it holds: memory in use (the limiter's region where the claim has one,
else the sum of its processes in NVML), compute busy time (NVML's per-process utilization, else the
limiter's measured launch time), time throttled and allocations refused (the limiter's region).
Processes are mapped to pod, container and claim through their cgroup and the node's pods. The figures
feed the metrics and the watchdog.

Memory is watched more often than the rest (`watch_interval_s`, 1 s, able to run at 250 ms): every watch
reads NVML's per-process memory and hands the watchdog what is over a cap or runs without the limiter; at most
every `floor_interval_s` it also publishes to each limiter claim its floor - what the driver says the claim's
processes hold on each GPU, which the library never lets the claim's account fall below - so a claim that
forged its region's records gains nothing past one watch.

A claim over its memory cap by the driver's figure loses the processes that took it over, newest growth
first, until what is left fits (`_memory_offenders`). That is the default for a limiter claim (its policy
unset, `Held.policy` None): as the kernel's `memory.max` does, the node takes the memory back; a class whose
watchdog policy is Report only reports, Terminate also stops what `LimiterMissing` and `GpuNotAllocated` find.

Longer than 500 lines: one sampling pass reads the regions, NVML, the processes and the pods in an
order that keeps their figures consistent (regions before NVML); split, that order would be spread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dra_gpu.config import Strategy, WatchdogPolicy
from dra_gpu.limiter_abi.board import GPUS_DIR, activity_name, read_activity
from dra_gpu.limiter_abi.region import (
    FLOOR_FILE,
    RegionDevice,
    floor_uuids,
    hand_back,
    read_region,
    region_counts,
    unlocked_slots,
    write_floor,
)
from dra_gpu.monitor.compute_hold import ComputeHold
from dra_gpu.monitor.elastic import ElasticFigures, ElasticLedger, publish_marks
from dra_gpu.monitor.freezer import RECORDS_DIR, CgroupFreezer, FreezeRecords, freezer_of, namespace_root
from dra_gpu.monitor.nvml_usage import GpuProcesses, NvmlSampler
from dra_gpu.monitor.pods import PodDirectory, PodInfo
from dra_gpu.monitor.process_owner import PodRef, ProcReader, file_identity
from dra_gpu.monitor.watchdog import (
    CONTEXT_ALLOWANCE,
    LIMITER_ALLOWANCE,
    ClaimRef,
    Reason,
    Violation,
    Watchdog,
)

log = logging.getLogger(__name__)

_LIMITER = Strategy.LIMITER.value

DEFAULT_INTERVAL_S = 5.0
DEFAULT_WATCH_INTERVAL_S = 1.0
"""How often memory is watched (caps checked): the bound on what a forged record buys."""
FLOOR_INTERVAL_S = 1.0
"""At most how often a watch publishes the floors (each a read of the claim's region and a write of its floor
file): a faster watch checks caps, the floors follow at this pace."""


@dataclass(frozen=True)
class Held:
    """What one claim holds of one GPU (several shares of a GPU in one claim add up)."""

    claim: ClaimRef
    gpu: str
    sharing: str
    memory_limit: int | None
    cores: int | None
    policy: WatchdogPolicy | None
    """None: the class set none, and the node's default holds (a limiter claim's caps enforced, the rest
    reported)."""

    def enforced(self) -> bool:
        """Whether the node takes back memory over this share's cap (and throttles compute over its ceiling)."""
        if self.policy is None:
            return self.sharing == _LIMITER
        return self.policy == WatchdogPolicy.TERMINATE

    def acts(self) -> WatchdogPolicy:
        """The policy for what is not over a cap (LimiterMissing, GpuNotAllocated): Terminate only if asked."""
        return WatchdogPolicy.TERMINATE if self.policy == WatchdogPolicy.TERMINATE else WatchdogPolicy.REPORT


@dataclass
class ClaimFigures:
    held: Held
    memory_used: int | None = None
    busy_seconds: float = 0.0
    throttled_seconds: float | None = None
    """None without a limiter region: nothing throttles or refuses for the claim."""
    refused: int | None = None
    elastic: ElasticFigures | None = None
    """None unless the claim is on its GPU's arbitration board (a limiter share below 100 %)."""


@dataclass
class ContainerFigures:
    memory_used: int = 0
    busy_seconds: float = 0.0


@dataclass
class Snapshot:
    claims: dict[tuple[str, str], ClaimFigures] = field(default_factory=dict)
    """(claim uid, gpu) -> figures."""
    containers: dict[tuple[str, str, str, str], tuple[Held, ContainerFigures]] = field(default_factory=dict)
    """(claim uid, pod name, container, gpu) -> figures."""


@dataclass(frozen=True)
class ClaimHoldings:
    """A claim prepared on this node, as the monitor sees it: which claim, and what it holds of each GPU."""

    claim: ClaimRef
    held: tuple[Held, ...]


class _ClaimsView:
    """The claims prepared, as each pass looks them up (made again only when they change)."""

    def __init__(self, prepared: list[ClaimHoldings]) -> None:
        self.prepared = prepared
        self.held = {(h.claim.uid, h.gpu): h for c in prepared for h in c.held}
        self.held_by_claim = {c.claim.uid: c.held for c in prepared}
        self.by_name = {(c.claim.namespace, c.claim.name): c.claim for c in prepared}
        self.ours = {gpu for _, gpu in self.held}
        """The GPUs this driver holds claims on: a GPU of another allocator (the device plugin, say) is not
        ours to judge."""


@dataclass(frozen=True)
class _Placed:
    """Where one process on one GPU stands, as a pass found it."""

    key: tuple[str, str] | None = None
    """(claim uid, gpu) of the share it counts against; None: none (another allocator's GPU, or it breaks a
    rule by being there)."""
    owner: Held | None = None
    container: tuple[str, str, str, str] = ("", "", "", "")
    """(claim uid, pod name, container, gpu)."""
    has_limiter: bool | None = None
    violations: tuple[Violation, ...] = ()


PreparedClaims = Callable[[], list[ClaimHoldings]]
"""What the node agent hands the monitor: the claims prepared on this node now (the plugin's records,
read through `dra_gpu.plugin.holdings`), so that the monitor needs nothing of the plugin's."""


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
        self.context_allowance = context_allowance
        self.limiter_allowance = limiter_allowance
        """What NVML may count for a limiter claim on a GPU beyond its cap, once per claim (LIMITER_ALLOWANCE)."""
        self.floor_interval_s = floor_interval_s
        self.cgroup_root = cgroup_root
        """The host's cgroup mount, where the claims' containers are frozen (`compute_hold`)."""
        self.hold = ComputeHold(
            self._freezer_of, records=FreezeRecords(Path(claims_dir).parent / RECORDS_DIR, cgroup_root)
        )
        self._cgroup_roots: dict[str, str] | None = None
        """Where the agent's cgroup namespace root is in the host's tree (`freezer.namespace_root`), found once."""
        self.limiter_library = limiter_library
        """The library file the agent mounts into limiter claims' containers: a process has the limiter when it
        has mapped this file (its device and inode), whatever the file's name in the container."""
        self._library = None if limiter_library is None else file_identity(limiter_library)
        self._floors_at = float("-inf")
        """When the floors were last published."""
        self._watches = 0
        self._growth: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
        self._last_seen: tuple[list[ClaimHoldings], dict[str, dict[int, int | None]]] | None = None
        """What the last pass judged: the claims held and each GPU's processes with their bytes."""
        self._last_live: set[int] = set()
        self._pending = False
        """The last pass met a process of a pod the pod directory did not list yet."""
        """(claim uid, gpu) -> pid -> (bytes NVML counted, the watch in which they last grew)."""
        self.watch_interval_s = watch_interval_s
        """What NVML may count per process beyond what its claim was charged (context memory; see
        `CONTEXT_ALLOWANCE`)."""
        self._prepared = prepared
        self._claims_dir = claims_dir
        self._gpus = gpus
        self._pods = pods
        self.watchdog = watchdog
        self._sampler = sampler
        self._proc = proc or ProcReader()
        self.interval_s = interval_s
        self.snapshot = Snapshot()
        self.samples = 0
        self.sampled_at = time.monotonic()
        """When the last sampling finished (or the monitor started): `stalled` reads it."""
        self._busy: dict[tuple[str, str], float] = {}
        self._container_busy: dict[tuple[str, str, str, str], float] = {}
        self._limiter_cache: dict[tuple[int, PodRef], bool | None] = {}
        self._seen_as: dict[int, tuple[PodInfo, PodRef, int | None]] = {}
        """pid -> its pod, cgroup and start time as this sampling saw them."""
        self._placed: dict[tuple[int, str], _Placed] = {}
        """(pid, gpu) -> where the last pass placed the process (`_place`)."""
        self._view = _ClaimsView([])
        self._placed_for = self._view
        """The claims it was placed among."""
        self._owners: dict[int, tuple[int | None, PodRef, PodInfo]] = {}
        """pid -> its start time, cgroup and pod, for the GPU processes found in a listed pod: a process never
        leaves its container's cgroup, so a watch reads /proc only for a process it has not seen; once a second
        (with the floors) it checks each one's start time, so a reused PID is found within a second (the kill
        checks pod, container and start time again before it signals)."""
        self._floors: dict[str, tuple[list[str], dict[str, tuple[int, int]]]] = {}
        """claim uid -> the floor file's GPUs and what was last published there (written again only on change)."""
        self.slots_reclaimed: dict[tuple[str, str], int] = {}
        """(namespace, claim) -> slots of the claim's region handed back because their process was gone."""
        self._elastic_dir = Path(claims_dir).parent / GPUS_DIR
        self._elastic = ElasticLedger(self._elastic_dir)
        self.contradicted: dict[tuple[str, str], float] = {}
        """(claim uid, gpu) -> since when its activity file says busy while the driver sees it idle."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.on_stop: Callable[[], None] | None = None

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
            self._stop.wait(max(0.0, min(self.watch_interval_s, full_due - time.monotonic())))

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
            self._view = _ClaimsView(prepared)
        view = self._view
        held = view.held
        processes: dict[str, GpuProcesses] = {}
        self._watches += 1
        floors_due = full or time.monotonic() >= self._floors_at + self.floor_interval_s
        # The regions' counts before NVML: memory freed in between is then in neither or in the count only.
        counts = (
            {
                h.claim.uid: region_counts(f"{self._claims_dir}/{h.claim.uid}/limiter")
                for h in held.values()
                if h.sharing == _LIMITER
            }
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
        self._pending = False
        held_by_claim, by_name, ours = view.held_by_claim, view.by_name, view.ours
        snap = Snapshot()
        if full:
            for key, h in held.items():
                snap.claims[key] = ClaimFigures(h)
        violations: list[Violation] = []
        nvml_memory: dict[tuple[str, str], list[tuple[int, int, bool | None]]] = {}
        live: set[int] = set()
        # A pass places a process where the last pass did while the claims are the same: a watch between floors
        # reads nothing but NVML, a floor or a sample checks that each process is still the one placed (its
        # start time: a PID reused is another process, placed anew).
        reuse = self._placed if view is self._placed_for else {}
        placed: dict[tuple[int, str], _Placed] = {}
        for gpu, figures in processes.items():
            for pid, used in figures.memory.items():
                live.add(pid)
                where = reuse.get((pid, gpu))
                if where is not None and floors_due and not self._same_process(pid):
                    where = None
                if where is None:
                    pending = self._pending
                    self._pending = False
                    where = self._place(pid, gpu, held, held_by_claim, by_name, ours)
                    if not self._pending:
                        placed[(pid, gpu)] = where
                    self._pending = self._pending or pending
                else:
                    placed[(pid, gpu)] = where
                violations.extend(where.violations)
                if where.key is None:
                    continue
                nvml_memory.setdefault(where.key, []).append((pid, used or 0, where.has_limiter))
                if full and where.owner is not None:
                    cfig = snap.containers.setdefault(where.container, (where.owner, ContainerFigures()))[1]
                    cfig.memory_used += used or 0
                if busy_due:
                    busy = figures.busy_seconds.get(pid, 0.0)
                    ckey = where.container
                    self._container_busy[ckey] = self._container_busy.get(ckey, 0.0) + busy
                    self._busy[where.key] = self._busy.get(where.key, 0.0) + busy
        self._placed, self._placed_for = placed, view
        self._last_live = live
        if busy_due:
            violations += self._hold_compute(held, nvml_memory, processes, now)
            self._check_activity(held, nvml_memory, processes)
        if len(self._limiter_cache) > len(live) or not {k[0] for k in self._limiter_cache} <= live:
            self._limiter_cache = {k: v for k, v in self._limiter_cache.items() if k[0] in live}
        if not self._seen_as.keys() <= live:
            self._seen_as = {k: v for k, v in self._seen_as.items() if k in live}
        if not self._owners.keys() <= live:
            self._owners = {k: v for k, v in self._owners.items() if k in live}
        if floors_due:
            self._publish_floors(held, nvml_memory, counts, processes)
            self._floors_at = time.monotonic()
        self._note_growth(nvml_memory, processes)
        if not full:
            for key, h in held.items():
                procs = nvml_memory.get(key, [])
                if key[1] in processes and procs:
                    violations.extend(self._over_cap(h, procs))
            # What only a full sample finds stays active in between, and a claim held back stays so.
            carried = (Reason.MISMATCH,) if busy_due else (Reason.MISMATCH, Reason.COMPUTE)
            violations += [v for v in self.watchdog.active if v.reason in carried and v.pid in live]
            self.watchdog.handle(violations, live)
            return self.snapshot

        self._reclaim_slots(list(held.values()))
        if self.limiter_library is not None:  # replaced by an upgrade: a new file, new identity
            self._library = file_identity(self.limiter_library)
        for key, fig in snap.claims.items():
            h = fig.held
            region = self._region(h) if h.sharing == _LIMITER else None
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
            allowance = self.context_allowance * len(procs)
            if (
                region is not None
                and nvml_used is not None
                and procs
                and nvml_used > region.used_bytes + allowance
            ):
                violations.append(self._mismatch(h, procs, region.used_bytes, nvml_used))
            if nvml_used is not None and procs:
                violations.extend(self._over_cap(h, procs))

        limited = [key for key, h in held.items() if h.sharing == _LIMITER]
        for key, elastic in self._elastic.sample(limited, time.monotonic()).items():
            snap.claims[key].elastic = elastic

        for ckey, (_, cfig) in snap.containers.items():
            cfig.busy_seconds = self._container_busy.get(ckey, 0.0)
        self._busy = {k: v for k, v in self._busy.items() if k in held}
        self._container_busy = {k: v for k, v in self._container_busy.items() if (k[0], k[3]) in held}
        self.slots_reclaimed = {k: v for k, v in self.slots_reclaimed.items() if k in by_name}
        self.watchdog.retain({key: c.uid for key, c in by_name.items()})
        self.watchdog.handle(violations, live)
        self.snapshot = snap
        self.samples += 1
        self.sampled_at = time.monotonic()
        return snap

    def _place(
        self,
        pid: int,
        gpu: str,
        held: dict[tuple[str, str], Held],
        held_by_claim: dict[str, tuple[Held, ...]],
        by_name: dict[tuple[str, str], ClaimRef],
        ours: set[str],
    ) -> _Placed:
        """Whose share a process on a GPU counts against, and what it breaks by being there at all."""
        attributed = self._attribute(pid, by_name, verify=True)
        if attributed is None:
            if gpu not in ours:
                return _Placed()
            return _Placed(
                violations=tuple(self._unowned(pid, gpu, [h for h in held.values() if h.gpu == gpu]))
            )
        pod, ref, claims, start = attributed
        container = pod.container(ref.container_id)
        # The container's own claims: another container of the pod may hold this GPU by another claim.
        mine = (
            [c for c in claims if c.name in pod.container_claims[container]]
            if container in pod.container_claims
            else claims
        )
        owner = next((held[(c.uid, gpu)] for c in mine if (c.uid, gpu) in held), None)
        if owner is None and gpu not in ours:
            return _Placed()
        if owner is None:
            # The pod's strictest policy: any of its claims may ask to terminate such a process.
            policy = (
                WatchdogPolicy.TERMINATE
                if any(h.acts() == WatchdogPolicy.TERMINATE for c in claims for h in held_by_claim[c.uid])
                else WatchdogPolicy.REPORT
            )
            detail = "the container's claims do not hold this GPU"
            gpu_violation = Violation(
                Reason.GPU, pid, gpu, claims[0], pod, container, policy, detail, ref.container_id, start
            )
            return _Placed(violations=(gpu_violation,))
        has_limiter = self._has_limiter(pid, ref) if owner.sharing == _LIMITER else None
        self._seen_as[pid] = (pod, ref, start)
        violations: tuple[Violation, ...] = ()
        if has_limiter is False:
            detail = (
                "the claim's class enforces its share with the limiter, which this process has not loaded"
            )
            violations = (self._violation(Reason.LIMITER, pid, owner, owner.acts(), detail),)
        return _Placed(
            (owner.claim.uid, gpu),
            owner,
            (owner.claim.uid, pod.name, container, gpu),
            has_limiter,
            violations,
        )

    def _unowned(self, pid: int, gpu: str, on_gpu: list[Held]) -> list[Violation]:
        """ProcessWithoutClaim for a process on a GPU this driver holds claims on that none of them owns: in a
        pod, stopped under the strictest policy of those claims (the node's default enforces: the GPU is
        theirs); outside pods (the host's, the admin's) only reported. An MPS control daemon's server, which
        MPS claims share, is the driver's own."""
        ref = self._proc.pod_of(pid)
        start = self._proc.start_time(pid)
        if ref is None:
            if self._proc.command(pid) == "nvidia-cuda-mps":  # comm is at most 15 characters
                return []
            pod = PodInfo("", "", "", {}, frozenset())
            where, policy = "outside any pod", WatchdogPolicy.REPORT
        else:
            pod = self._pods.lookup(ref.pod_uid, ref.container_id) or PodInfo(
                ref.pod_uid, "", "", {}, frozenset()
            )
            where = (
                f"pod {pod.namespace}/{pod.name}"
                if pod.name
                else f"pod {ref.pod_uid} (not on this node's list)"
            )
            enforced = any(h.enforced() or h.acts() == WatchdogPolicy.TERMINATE for h in on_gpu)
            policy = WatchdogPolicy.TERMINATE if enforced else WatchdogPolicy.REPORT
        detail = (
            f"a process {where} uses this GPU, which this driver shares among its claims, and no claim prepared "
            "on this node owns it"
        )
        claim = ClaimRef("", pod.namespace, "")
        container = pod.container(ref.container_id) if ref is not None else ""
        cid = ref.container_id if ref is not None else ""
        return [Violation(Reason.UNOWNED, pid, gpu, claim, pod, container, policy, detail, cid, start)]

    def _check_activity(
        self,
        held: dict[tuple[str, str], Held],
        nvml_memory: dict[tuple[str, str], list[tuple[int, int, bool | None]]],
        processes: dict[str, GpuProcesses],
    ) -> None:
        """A claim whose activity file says it wants the GPU now while the driver saw its processes run nothing
        since the last read is `contradicted` (with a Warning event on the claim when it starts): its word holds
        no one back. The agent marks it on its GPU's board, where the library reads it (`publish_marks`), until
        the driver sees it run again; `idle_by_driver()` says the same."""
        now_ns = time.monotonic_ns()
        found: dict[tuple[str, str], float] = {}
        for key, h in held.items():
            figures = processes.get(h.gpu)
            if h.sharing != Strategy.LIMITER.value or figures is None or not figures.utilization_known:
                continue
            if any(figures.busy_seconds.get(p[0], 0.0) > 0 for p in nvml_memory.get(key, [])):
                continue  # it runs: whatever it says of itself stands
            activity = read_activity(Path(f"{self._elastic_dir}/{h.gpu}/{activity_name(h.claim.uid)}"))
            if activity is None or activity.demand_until_ns <= now_ns:
                continue
            found[key] = self.contradicted.get(key, time.monotonic())
            if key not in self.contradicted:
                self.watchdog.claim_event(
                    h.claim,
                    Reason.ACTIVITY,
                    f"the claim's activity file says it wants GPU {h.gpu} now, but the driver saw its processes run "
                    "nothing there since the last look: its word holds no other claim back",
                )
        self.contradicted = found
        marks: dict[str, set[str]] = {
            h.gpu: set() for h in held.values() if h.sharing == Strategy.LIMITER.value
        }
        for uid, gpu in found:
            marks.setdefault(gpu, set()).add(uid)
        publish_marks(self._elastic_dir, marks)

    def idle_by_driver(self) -> set[tuple[str, str]]:
        """(claim uid, gpu) of the claims whose activity file the driver's figures contradict now."""
        return set(self.contradicted)

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
        nvml_memory: dict[tuple[str, str], list[tuple[int, int, bool | None]]],
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
                out.append(self._violation(Reason.COMPUTE, pid, h, WatchdogPolicy.REPORT, detail))
        return out

    def _attribute(
        self, pid: int, by_name: dict[tuple[str, str], ClaimRef], verify: bool
    ) -> tuple[PodInfo, PodRef, list[ClaimRef], int | None] | None:
        """The process's pod, cgroup reference, the pod's claims prepared here and its start time; None if not
        ours. `verify`: check that a process seen before is still the one seen (its start time)."""
        known = self._owners.get(pid)
        if known is not None and verify and self._proc.start_time(pid) != known[0]:
            known = None  # the PID was reused: another process
        if known is None:
            start = self._proc.start_time(pid)
            ref = self._proc.pod_of(pid)
            if ref is None:
                self._owners.pop(pid, None)
                return None  # not in a pod (the host, an MPS server): not ours to judge
            pod = self._pods.lookup(ref.pod_uid, ref.container_id)
            if pod is None:
                self._owners.pop(pid, None)
                self._pending = True  # a pod not listed yet: the next watch looks again, whatever NVML says
                return None
            known = (start, ref, pod)
            if not ref.container_id or ref.container_id in pod.containers:
                self._owners[pid] = known  # else its container is not listed yet: asked again next time
            else:
                self._owners.pop(pid, None)
        start, ref, pod = known
        claims = [by_name[(pod.namespace, n)] for n in sorted(pod.claims) if (pod.namespace, n) in by_name]
        if not claims:
            return None  # a pod without claims of this driver on this node
        return pod, ref, claims, start

    def _same_process(self, pid: int) -> bool:
        """Whether a process placed in a pod is still the one placed (not a reused PID); False for one outside."""
        known = self._owners.get(pid)
        if known is None or self._proc.start_time(pid) != known[0]:
            self._owners.pop(pid, None)
            return False
        return True

    def _has_limiter(self, pid: int, ref: PodRef) -> bool | None:
        key = (pid, ref)
        if key not in self._limiter_cache:
            self._limiter_cache[key] = self._proc.has_limiter(pid, self._library)
        return self._limiter_cache[key]

    def _reclaim_slots(self, held: list[Held]) -> None:
        """Hands back the region slots of processes that are gone, in every limiter claim's region.

        The library frees a slot only for a process it can prove dead, which it cannot from another PID
        namespace: without this, every restarted pod or exited container of a claim shared by several pods
        would leave its memory charged for the claim's lifetime. The agent sees every process of the node
        (its proc root is the host's); /proc is scanned once per sampling, and only when a region has a
        slot whose lock no process holds."""
        claims = {h.claim.uid: h.claim for h in held if h.sharing == _LIMITER}
        candidates = {uid: unlocked_slots(f"{self._claims_dir}/{uid}/limiter") for uid in claims}
        if not any(candidates.values()):
            return
        index = self._proc.process_index()  # after the candidates were read: see `hand_back`
        for uid, slots in candidates.items():
            marked = hand_back(
                f"{self._claims_dir}/{uid}/limiter", [s for s in slots if index.alive(s[1]) is False]
            )
            if marked:
                claim = claims[uid]
                key = (claim.namespace, claim.name)
                self.slots_reclaimed[key] = self.slots_reclaimed.get(key, 0) + marked
                log.info(
                    "handed back the region slots of exited processes",
                    extra={"claim": f"{claim.namespace}/{claim.name}", "slots": marked},
                )

    def _region(self, h: Held) -> RegionDevice | None:
        devices = read_region(f"{self._claims_dir}/{h.claim.uid}/limiter")
        if devices is None:
            return None
        wanted = h.gpu.lower().removeprefix("gpu-").removeprefix("mig-")
        return next(
            (d for d in devices if d.uuid.lower().removeprefix("gpu-").removeprefix("mig-") == wanted), None
        )

    def _publish_floors(
        self,
        held: dict[tuple[str, str], Held],
        nvml_memory: dict[tuple[str, str], list[tuple[int, int, bool | None]]],
        counts: dict[str, dict[str, int]],
        processes: dict[str, GpuProcesses],
    ) -> None:
        """Writes each limiter claim's floor: per GPU NVML answered for, what its processes hold (a process
        whose figure NVML cannot tell adds nothing: a floor is what is known), and the region's count before."""
        floors: dict[str, dict[str, tuple[int, int]]] = {}
        for key, h in held.items():
            if h.sharing != _LIMITER or h.gpu not in processes:
                continue
            known = sum(p[1] for p in nvml_memory.get(key, []))
            region = _by_uuid(counts.get(h.claim.uid, {}), h.gpu)
            floors.setdefault(h.claim.uid, {})[h.gpu] = (known, region)
        for uid, figures in floors.items():
            path = f"{self._claims_dir}/{uid}/limiter/{FLOOR_FILE}"
            uuids, published = self._floors.get(uid) or (floor_uuids(path), {})
            if figures == published:
                continue  # unchanged: an allocation waiting for a new sample is decided on this one anyway
            if write_floor(path, figures, uuids):
                self._floors[uid] = (uuids, figures)
            else:
                self._floors.pop(uid, None)
        claims = {uid for uid, _ in held}
        self._floors = {uid: v for uid, v in self._floors.items() if uid in claims}

    def _note_growth(
        self,
        nvml_memory: dict[tuple[str, str], list[tuple[int, int, bool | None]]],
        processes: dict[str, GpuProcesses],
    ) -> None:
        """Remembers, per claim and GPU, in which watch each process last grew (a new one grew now)."""
        for key, procs in nvml_memory.items():
            before = self._growth.get(key, {})
            now: dict[int, tuple[int, int]] = {}
            for pid, used, _ in procs:
                prev = before.get(pid)
                now[pid] = (used, self._watches if prev is None or used > prev[0] else prev[1])
            self._growth[key] = now
        for key in [k for k in self._growth if k not in nvml_memory and k[1] in processes]:
            del self._growth[key]

    def _over_cap(self, h: Held, procs: list[tuple[int, int, bool | None]]) -> list[Violation]:
        """MemoryOverLimit for the claim's offenders when NVML counts more than its cap and the allowance:
        once per claim under the limiter (its contexts are charged), per process without it (they are not)."""
        if h.memory_limit is None:
            return []
        used = sum(p[1] for p in procs)
        allowance = self.limiter_allowance if h.sharing == _LIMITER else self.context_allowance * len(procs)
        if used <= h.memory_limit + allowance:
            return []
        return self._memory_offenders(h, procs, used, h.memory_limit + allowance)

    def _memory_offenders(
        self, h: Held, procs: list[tuple[int, int, bool | None]], used: int, allowed: int
    ) -> list[Violation]:
        """The processes that took the claim over its cap: newest growth first (the larger first within one
        watch), as many as it takes for what is left to fit."""
        growth = self._growth.get((h.claim.uid, h.gpu), {})
        order = sorted(procs, key=lambda p: (growth.get(p[0], (0, 0))[1], p[1]), reverse=True)
        culprits = []
        left = used
        for proc in order:
            if left <= allowed:
                break
            culprits.append(proc)
            left -= proc[1]
        out = []
        policy = WatchdogPolicy.TERMINATE if h.enforced() else WatchdogPolicy.REPORT
        for pid, mine, _ in culprits:
            detail = (
                f"the claim uses {used} bytes of GPU memory on this GPU, over its limit of {h.memory_limit} "
                f"bytes and the {allowed - (h.memory_limit or 0)} bytes allowed beyond it; this process holds "
                f"{mine} bytes and grew last"
            )
            out.append(self._violation(Reason.MEMORY, pid, h, policy, detail))
        return out

    def _mismatch(
        self, h: Held, procs: list[tuple[int, int, bool | None]], region: int, used: int
    ) -> Violation:
        """The claim's region (which holds its processes' contexts) says less than NVML by more than the
        allowance per process: reported on its largest process, never acted on."""
        pid = max(procs, key=lambda p: p[1])[0]
        detail = (
            f"the claim's limiter region accounts {region} bytes on this GPU but NVML counts {used} bytes for its "
            f"{len(procs)} processes, more than what their contexts may hold beyond their charge "
            f"({self.context_allowance} bytes each) explains"
        )
        return self._violation(Reason.MISMATCH, pid, h, WatchdogPolicy.REPORT, detail)

    def _violation(self, reason: Reason, pid: int, h: Held, policy: WatchdogPolicy, detail: str) -> Violation:
        """A violation of claim share `h` by `pid`, in the pod and container this pass saw it in."""
        pod, ref, start = self._seen_as[pid]
        return Violation(
            reason,
            pid,
            h.gpu,
            h.claim,
            pod,
            pod.container(ref.container_id),
            policy,
            detail,
            ref.container_id,
            start,
        )


def _by_uuid(counts: dict[str, int], gpu: str) -> int:
    """The count of the region's entry for gpu (the library writes UUIDs as the driver reports them)."""
    if gpu in counts:
        return counts[gpu]
    wanted = gpu.lower()
    return next((v for u, v in counts.items() if u.lower() == wanted), 0)
