"""The watchdog: processes that escape their claim's share are reported, and stopped where the policy says.

Its truth is the driver's: NVML's per-process memory, mapped to pods and containers through cgroups, never
the region a tenant can write. It acts only on GPUs this driver allocated. Three ways out of a share:

- `MemoryOverLimit`: the claim's processes on a GPU use more memory than the claim was given (plus the
  claim's allowance for what the driver loads unseen: see LIMITER_ALLOWANCE and CONTEXT_ALLOWANCE);
- `GpuNotAllocated`: a process of a pod with claims of this driver uses a GPU this driver allocated to
  another claim, and none of its container's claims holds;
- `LimiterMissing`: a process of a Limiter claim runs without the limiter library mapped (a static
  binary, a program that skips the dynamic loader, a container started before the CDI edits).
- `ProcessWithoutClaim`: a process on a GPU this driver holds claims on that no prepared claim owns (a pod
  with no claim that reached the GPU through `NVIDIA_VISIBLE_DEVICES`, a process outside any pod). Its
  claim is none (`ClaimRef.uid` empty); a process outside pods is only reported, never signalled.

A claim whose region says less than NVML by more than that allowance per process is reported as
`AccountingMismatch` (never terminated: the region is only evidence that someone rewrote it).

Each new violation becomes a Warning event on the claim and on the pod and a metric. A violation whose
policy is Terminate stops the offending process through a pidfd opened before its start time and container
are checked once more (a PID reused by another process is never signalled). Memory over a cap is killed at
once (SIGKILL, as the kernel's OOM killer does for `memory.max`: the memory is another claim's); anything
else gets SIGTERM, then SIGKILL if it is still there after the grace period. Which violations are Terminate
is the monitor's to say (`monitor.Monitor`): by default a limiter claim's memory over its cap is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from dra_gpu.config import WatchdogPolicy
from dra_gpu.kube import KubeAPI, builders
from dra_gpu.kube.events import EventRecorder
from dra_gpu.monitor.pods import PodInfo
from dra_gpu.monitor.process_owner import ProcReader

log = logging.getLogger(__name__)

COMPONENT = "dra-gpu-kubelet-plugin"
CONTEXT_ALLOWANCE = 2 * 2**30
"""What NVML may count for a process beyond what its claim was charged, per process
(`Monitor(context_allowance=)`). NVML's per-process usage includes the process's CUDA context. Under the
limiter the claim's limit C already holds each context, charged what the driver took for it (549 MB on an
H100), so the region and the limit compare like with like and this covers only what a context holds beyond
its charge: module code loaded later (a PyTorch process's context grows well past a bare one), a charge
measured while another process freed memory (then only the context's limits' memory). A claim without the
limiter (time-sliced, MPS) and a process that skipped it are charged no context at all: this covers a whole
one. 2 GiB is well above a bare context and a PyTorch one."""
LIMITER_ALLOWANCE = 256 * 2**20
"""What NVML may count for a limiter claim on a GPU beyond its cap: once per claim, not per process. The
limiter charged each context what the driver took, and the floor the monitor publishes holds the claim's
account at what NVML counts, so module code a process loads before the claim reaches its cap is charged
within one watch and only what the driver loads while the claim already sits at its cap shows above it.
Measured on an H100 (driver 580): a PyTorch process holds 612 MiB after its first tensor against the 524 MiB
its context was charged, 88 MiB of module code; 256 MiB holds that for two processes loading their first
kernels at the cap at once, with room to spare, and is half of what one process alone was allowed before."""
GRACE_S = 10.0
"""Between SIGTERM and SIGKILL."""
MEMORY_GRACE_S = 0.0
"""Between SIGTERM and SIGKILL for a process over its claim's memory cap: none, SIGKILL at once (the memory
is another claim's, and a process that traps SIGTERM would keep it for the grace period)."""


_STOPPED = {
    True: "the process was killed, as the kernel's OOM killer kills for memory.max: the node holds the claim to its "
    "memory limit (a DeviceClass with watchdog policy Report only reports)",
    False: "the process was terminated (watchdog policy Terminate)",
}


class Reason(StrEnum):
    MEMORY = "MemoryOverLimit"
    GPU = "GpuNotAllocated"
    LIMITER = "LimiterMissing"
    MISMATCH = "AccountingMismatch"
    COMPUTE = "ComputeOverCeiling"
    UNOWNED = "ProcessWithoutClaim"
    ACTIVITY = "ActivityContradicted"


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Violation:
    reason: Reason
    pid: int
    gpu: str
    claim: ClaimRef
    pod: PodInfo
    container: str
    policy: WatchdogPolicy
    detail: str
    container_id: str = ""
    start: int | None = None
    """The process's start time (/proc/<pid>/stat field 22) when seen: a reused PID is another process."""


def _claim_object(claim: ClaimRef) -> dict[str, object]:
    return builders.subject("ResourceClaim", claim.name, claim.namespace, claim.uid)


def _pod_object(pod: PodInfo) -> dict[str, object]:
    return builders.subject("Pod", pod.name, pod.namespace, pod.uid)


class PidfdSignals:
    """Signals through a pidfd: the process it was opened for, or none (ProcessLookupError)."""

    def open(self, pid: int) -> int:
        return os.pidfd_open(pid)

    def send(self, pidfd: int, sig: int) -> None:
        signal.pidfd_send_signal(pidfd, sig)

    def close(self, pidfd: int) -> None:
        os.close(pidfd)


class Watchdog:
    """Acts once per (process, reason, GPU); remembers what it saw until the process is gone."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        proc: ProcReader,
        signals: PidfdSignals | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        grace_s: float = GRACE_S,
        monotonic: Callable[[], float] = time.monotonic,
        memory_grace_s: float = MEMORY_GRACE_S,
    ) -> None:
        self._events = EventRecorder(api, node_name, clock, component=COMPONENT)
        self._proc = proc
        self._signals = signals or PidfdSignals()
        self.grace_s = grace_s
        self.memory_grace_s = memory_grace_s
        self._monotonic = monotonic
        self._stopping: dict[int, tuple[int, float]] = {}
        """pid -> (pidfd, when SIGKILL is due) of processes sent SIGTERM."""
        self._seen: set[tuple[int, Reason, str]] = set()
        self.violations_total: dict[tuple[str, str, str, str, str], int] = {}
        """(namespace, claim, pod, gpu, reason) -> violations seen."""
        self.terminated_total: dict[tuple[str, str, str, str, str], int] = {}
        self.active: list[Violation] = []

    def handle(self, violations: list[Violation], live_pids: set[int]) -> None:
        self._finish_stops()
        self._seen = {key for key in self._seen if key[0] in live_pids}
        self.active = violations
        killed: set[int] = set()  # one process may break several rules at once: one kill, one count
        for v in sorted(violations, key=lambda v: v.reason != Reason.MEMORY):  # memory: SIGKILL at once
            key = (v.pid, v.reason, v.gpu)
            if key in self._seen:
                continue
            self._seen.add(key)
            labels = (v.claim.namespace, v.claim.name, v.pod.name, v.gpu, v.reason.value)
            self.violations_total[labels] = self.violations_total.get(labels, 0) + 1
            where = (
                f"container {v.container or '?'} of pod {v.pod.namespace}/{v.pod.name}"
                if v.pod.name
                else (f"pod {v.pod.uid}" if v.pod.uid else "no pod")
            )
            message = f"process {v.pid} in {where} on GPU {v.gpu}: {v.detail}"
            if v.policy == WatchdogPolicy.TERMINATE and v.reason != Reason.MISMATCH:
                if v.pid in killed:
                    message += f"; {_STOPPED[v.reason == Reason.MEMORY]}"
                elif self._terminate(v):
                    killed.add(v.pid)
                    self.terminated_total[labels] = self.terminated_total.get(labels, 0) + 1
                    message += f"; {_STOPPED[v.reason == Reason.MEMORY]}"
                else:
                    message += "; it could not be terminated"
            log.warning(
                "process escapes its share",
                extra={"reason": v.reason.value, "claim": v.claim.name, "detail": message},
            )
            if v.claim.uid:
                self._events.record(_claim_object(v.claim), "Warning", v.reason.value, message)
            if v.pod.name:
                self._events.record(_pod_object(v.pod), "Warning", v.reason.value, message)

    def claim_event(self, claim: ClaimRef, reason: Reason, message: str) -> None:
        """A Warning event on the claim alone (what the claim says of itself, not one process's doing)."""
        log.warning("a claim's word contradicts the driver", extra={"claim": claim.name, "detail": message})
        self._events.record(_claim_object(claim), "Warning", reason.value, message)

    def _terminate(self, v: Violation) -> bool:
        if v.pid in self._stopping:
            return True
        try:
            pidfd = self._signals.open(v.pid)
        except OSError:
            return False  # gone
        # Checked after the pidfd is open: if this is still the process seen, the pidfd is it.
        ref = self._proc.pod_of(v.pid)
        same = (
            ref is not None
            and ref.pod_uid == v.pod.uid
            and ref.container_id == v.container_id
            and v.start is not None
            and self._proc.start_time(v.pid) == v.start
        )
        try:
            if same:
                grace = min(self.grace_s, self.memory_grace_s) if v.reason == Reason.MEMORY else self.grace_s
                if v.reason == Reason.MEMORY and grace <= 0:
                    self._signals.send(pidfd, signal.SIGKILL)
                    self._signals.close(pidfd)
                    return True
                self._signals.send(pidfd, signal.SIGTERM)
                self._stopping[v.pid] = (pidfd, self._monotonic() + grace)
                return True
        except OSError as exc:
            log.warning("cannot terminate the process", extra={"pid": v.pid, "error": str(exc)})
        self._signals.close(pidfd)
        return False

    def _finish_stops(self) -> None:
        """SIGKILL, through its pidfd, every process still there after its grace period."""
        now = self._monotonic()
        for pid, (pidfd, due) in list(self._stopping.items()):
            if now < due:
                continue
            del self._stopping[pid]
            with contextlib.suppress(ProcessLookupError):
                self._signals.send(pidfd, signal.SIGKILL)
            self._signals.close(pidfd)

    def retain(self, claims: dict[tuple[str, str], str]) -> None:
        """Drop the series and event state of claims ((namespace, name) -> uid) no longer prepared."""
        for table in (self.violations_total, self.terminated_total):
            for key in [k for k in table if (k[0], k[1]) not in claims and k[1]]:
                del table[key]
        self._events.retain(set(claims.values()) | {v.pod.uid for v in self.active})
