"""Where each GPU process of the node stands: whose share it counts against (its pod, container and claim,
through its cgroup and the node's pods), and what it breaks by being there at all (a GPU its container's
claims do not hold, a GPU no claim owns, a limiter claim's process without the limiter)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_gpu.config import WatchdogPolicy
from dra_gpu.monitor.figures import LIMITER, ClaimsView, Held
from dra_gpu.monitor.pods import PodDirectory, PodInfo
from dra_gpu.monitor.process_owner import PodRef, ProcReader, file_identity
from dra_gpu.monitor.watchdog import ClaimRef, Reason, Violation


@dataclass(frozen=True)
class Placed:
    """Where one process on one GPU stands, as a pass found it."""

    key: tuple[str, str] | None = None
    """(claim uid, gpu) of the share it counts against; None: none (another allocator's GPU, or it breaks a
    rule by being there)."""
    owner: Held | None = None
    container: tuple[str, str, str, str] = ("", "", "", "")
    """(claim uid, pod name, container, gpu)."""
    has_limiter: bool | None = None
    violations: tuple[Violation, ...] = ()


class Placement:
    """Places processes, and remembers what it found of each so that a process is read from /proc once."""

    def __init__(self, proc: ProcReader, pods: PodDirectory, limiter_library: Path | None) -> None:
        self._proc = proc
        self._pods = pods
        self.limiter_library = limiter_library
        """The library file the agent mounts into limiter claims' containers: a process has the limiter when it
        has mapped this file (its device and inode), whatever the file's name in the container."""
        self._library = None if limiter_library is None else file_identity(limiter_library)
        self.pending = False
        """A pass met a process of a pod the pod directory did not list yet (cleared by the caller)."""
        self._limiter_cache: dict[tuple[int, PodRef], bool | None] = {}
        self._seen_as: dict[int, tuple[PodInfo, PodRef, int | None]] = {}
        """pid -> its pod, cgroup and start time as this sampling saw them."""
        self._owners: dict[int, tuple[int | None, PodRef, PodInfo]] = {}
        """pid -> its start time, cgroup and pod, for the GPU processes found in a listed pod: a process never
        leaves its container's cgroup, so a watch reads /proc only for a process it has not seen; once a second
        (with the floors) it checks each one's start time, so a reused PID is found within a second (the kill
        checks pod, container and start time again before it signals)."""

    def reread_library(self) -> None:
        """The library file's identity again (replaced by an upgrade: a new file, a new identity)."""
        if self.limiter_library is not None:
            self._library = file_identity(self.limiter_library)

    def forget(self, live: set[int]) -> None:
        """Drops what it remembers of processes no longer on any GPU."""
        if len(self._limiter_cache) > len(live) or not {k[0] for k in self._limiter_cache} <= live:
            self._limiter_cache = {k: v for k, v in self._limiter_cache.items() if k[0] in live}
        if not self._seen_as.keys() <= live:
            self._seen_as = {k: v for k, v in self._seen_as.items() if k in live}
        if not self._owners.keys() <= live:
            self._owners = {k: v for k, v in self._owners.items() if k in live}

    def place(self, pid: int, gpu: str, view: ClaimsView) -> Placed:
        """Whose share a process on a GPU counts against, and what it breaks by being there at all."""
        held = view.held
        attributed = self._attribute(pid, view.by_name)
        if attributed is None:
            if gpu not in view.ours:
                return Placed()
            return Placed(
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
        if owner is None and gpu not in view.ours:
            return Placed()
        if owner is None:
            # The pod's strictest policy: any of its claims may ask to terminate such a process.
            policy = (
                WatchdogPolicy.TERMINATE
                if any(
                    h.acts() == WatchdogPolicy.TERMINATE for c in claims for h in view.held_by_claim[c.uid]
                )
                else WatchdogPolicy.REPORT
            )
            detail = "the container's claims do not hold this GPU"
            gpu_violation = Violation(
                Reason.GPU, pid, gpu, claims[0], pod, container, policy, detail, ref.container_id, start
            )
            return Placed(violations=(gpu_violation,))
        has_limiter = self._has_limiter(pid, ref) if owner.sharing == LIMITER else None
        self._seen_as[pid] = (pod, ref, start)
        violations: tuple[Violation, ...] = ()
        if has_limiter is False:
            detail = (
                "the claim's class enforces its share with the limiter, which this process has not loaded"
            )
            violations = (self.violation(Reason.LIMITER, pid, owner, owner.acts(), detail),)
        return Placed(
            (owner.claim.uid, gpu),
            owner,
            (owner.claim.uid, pod.name, container, gpu),
            has_limiter,
            violations,
        )

    def same_process(self, pid: int) -> bool:
        """Whether a process placed in a pod is still the one placed (not a reused PID); False for one outside."""
        known = self._owners.get(pid)
        if known is None or self._proc.start_time(pid) != known[0]:
            self._owners.pop(pid, None)
            return False
        return True

    def violation(self, reason: Reason, pid: int, h: Held, policy: WatchdogPolicy, detail: str) -> Violation:
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

    def _attribute(
        self, pid: int, by_name: dict[tuple[str, str], ClaimRef]
    ) -> tuple[PodInfo, PodRef, list[ClaimRef], int | None] | None:
        """The process's pod, cgroup reference, the pod's claims prepared here and its start time; None if not
        ours. A process seen before is checked to be still the one seen (its start time)."""
        known = self._owners.get(pid)
        if known is not None and self._proc.start_time(pid) != known[0]:
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
                self.pending = True  # a pod not listed yet: the next watch looks again, whatever NVML says
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

    def _has_limiter(self, pid: int, ref: PodRef) -> bool | None:
        key = (pid, ref)
        if key not in self._limiter_cache:
            self._limiter_cache[key] = self._proc.has_limiter(pid, self._library)
        return self._limiter_cache[key]
