"""The watchdog: processes that escape their claim's share are reported, and terminated where asked.

Three ways out of a share, all seen through NVML and the process's cgroup:

- `MemoryOverLimit`: the claim's processes on a GPU use more memory than the claim was given (plus an
  allowance per process for the CUDA context, which NVML counts and the limiter does not);
- `GpuNotAllocated`: a process of a pod with claims of this driver uses a GPU none of them holds;
- `LimiterMissing`: a process of a Limiter claim runs without the limiter library mapped (a static
  binary, a program that skips the dynamic loader, a container started before the CDI edits).

Each new violation becomes a Warning event on the claim and on the pod and a metric. Under the
class's `watchdog.policy: Terminate` the offending process is killed, after its cgroup is read once
more and still names the same pod, so a process of another claim is never touched.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from dra_gpu.config import WatchdogPolicy
from dra_gpu.controller.events import EventRecorder
from dra_gpu.kube import KubeAPI
from dra_gpu.monitor.cgroup import ProcReader
from dra_gpu.monitor.pods import PodInfo

log = logging.getLogger(__name__)

COMPONENT = "dra-gpu-kubelet-plugin"
CONTEXT_ALLOWANCE = 512 * 2**20
"""Memory NVML counts for a process's CUDA context and the limiter never charges."""


class Reason(StrEnum):
    MEMORY = "MemoryOverLimit"
    GPU = "GpuNotAllocated"
    LIMITER = "LimiterMissing"


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


def _claim_object(claim: ClaimRef) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"uid": claim.uid, "namespace": claim.namespace, "name": claim.name},
    }


def _pod_object(pod: PodInfo) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"uid": pod.uid, "namespace": pod.namespace, "name": pod.name},
    }


class Watchdog:
    """Acts once per (process, reason, GPU); remembers what it saw until the process is gone."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        proc: ProcReader,
        kill: Callable[[int, int], None] = os.kill,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._events = EventRecorder(api, node_name, clock, component=COMPONENT)
        self._proc = proc
        self._kill = kill
        self._seen: set[tuple[int, Reason, str]] = set()
        self.violations_total: dict[tuple[str, str, str, str, str], int] = {}
        """(namespace, claim, pod, gpu, reason) -> violations seen."""
        self.terminated_total: dict[tuple[str, str, str, str, str], int] = {}
        self.active: list[Violation] = []

    def handle(self, violations: list[Violation], live_pids: set[int]) -> None:
        self._seen = {key for key in self._seen if key[0] in live_pids}
        self.active = violations
        killed: set[int] = set()  # one process may break several rules at once: one kill, one count
        for v in violations:
            key = (v.pid, v.reason, v.gpu)
            if key in self._seen:
                continue
            self._seen.add(key)
            labels = (v.claim.namespace, v.claim.name, v.pod.name, v.gpu, v.reason.value)
            self.violations_total[labels] = self.violations_total.get(labels, 0) + 1
            where = f"container {v.container or '?'} of pod {v.pod.namespace}/{v.pod.name}"
            message = f"process {v.pid} in {where} on GPU {v.gpu}: {v.detail}"
            if v.policy == WatchdogPolicy.TERMINATE:
                if v.pid in killed:
                    message += "; the process was terminated (watchdog policy Terminate)"
                elif self._terminate(v):
                    killed.add(v.pid)
                    self.terminated_total[labels] = self.terminated_total.get(labels, 0) + 1
                    message += "; the process was terminated (watchdog policy Terminate)"
                else:
                    message += "; it could not be terminated"
            log.warning(
                "process escapes its share",
                extra={"reason": v.reason.value, "claim": v.claim.name, "detail": message},
            )
            self._events.record(_claim_object(v.claim), "Warning", v.reason.value, message)
            self._events.record(_pod_object(v.pod), "Warning", v.reason.value, message)

    def _terminate(self, v: Violation) -> bool:
        ref = self._proc.pod_of(v.pid)
        if ref is None or ref.pod_uid != v.pod.uid:
            return False  # gone, or the pid now belongs to someone else
        try:
            self._kill(v.pid, signal.SIGKILL)
        except OSError as exc:
            log.warning("cannot terminate the process", extra={"pid": v.pid, "error": str(exc)})
            return False
        return True

    def retain(self, claims: dict[tuple[str, str], str]) -> None:
        """Drop the series and event state of claims ((namespace, name) -> uid) no longer prepared."""
        for table in (self.violations_total, self.terminated_total):
            for key in [k for k in table if (k[0], k[1]) not in claims]:
                del table[key]
        self._events.retain(set(claims.values()) | {v.pod.uid for v in self.active})
