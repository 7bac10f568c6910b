"""A claim's memory caps, judged from the driver's figures: which processes took a claim over its cap (newest
growth first), and a region that says less than NVML counts.

A claim over its memory cap by the driver's figure loses the processes that took it over, newest growth
first, until what is left fits. That is the default for a limiter claim (its policy unset, `Held.policy`
None): as the kernel's `memory.max` does, the node takes the memory back; a class whose watchdog policy is
Report only reports."""

from __future__ import annotations

from collections.abc import Callable, Container

from dra_gpu.config import WatchdogPolicy
from dra_gpu.monitor.figures import LIMITER, Held
from dra_gpu.monitor.watchdog import Reason, Violation

Procs = list[tuple[int, int, bool | None]]
"""A share's processes on its GPU: (pid, bytes NVML counts, whether it has the limiter)."""
MakeViolation = Callable[[Reason, int, Held, WatchdogPolicy, str], Violation]


class MemoryCaps:
    """Judges caps; remembers, per claim and GPU, in which watch each process last grew."""

    def __init__(self, violation: MakeViolation, context_allowance: int, limiter_allowance: int) -> None:
        self._violation = violation
        self.context_allowance = context_allowance
        """What NVML may count per process beyond what its claim was charged (context memory; see
        `CONTEXT_ALLOWANCE`)."""
        self.limiter_allowance = limiter_allowance
        """What NVML may count for a limiter claim on a GPU beyond its cap, once per claim (LIMITER_ALLOWANCE)."""
        self._watches = 0
        self._growth: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
        """(claim uid, gpu) -> pid -> (bytes NVML counted, the watch in which they last grew)."""

    def note_growth(self, nvml_memory: dict[tuple[str, str], Procs], answered: Container[str]) -> None:
        """Remembers, per claim and GPU, in which watch each process last grew (a new one grew now). `answered`:
        the GPUs NVML answered for (a share not in `nvml_memory` there has no processes left)."""
        self._watches += 1
        watch = self._watches
        growth = self._growth
        for key, procs in nvml_memory.items():
            before = growth.get(key)
            if before is None:
                growth[key] = {pid: (used, watch) for pid, used, _ in procs}
                continue
            now: dict[int, tuple[int, int]] = {}
            for pid, used, _ in procs:
                prev = before.get(pid)
                if prev is None or used > prev[0]:
                    now[pid] = (used, watch)
                else:
                    now[pid] = prev if used == prev[0] else (used, prev[1])
            growth[key] = now
        if len(growth) > len(nvml_memory):
            for key in [k for k in growth if k not in nvml_memory and k[1] in answered]:
                del growth[key]

    def over_caps(
        self, held: dict[tuple[str, str], Held], nvml_memory: dict[tuple[str, str], Procs]
    ) -> list[Violation]:
        """`over_cap` of every share with processes (`nvml_memory`: a pass's, per share): a share whose
        processes hold no more than its cap and the smallest allowance is passed over in a few operations."""
        out: list[Violation] = []
        least = min(self.limiter_allowance, self.context_allowance)
        for key, procs in nvml_memory.items():
            h = held[key]
            if h.memory_limit is None:
                continue
            used = procs[0][1] if len(procs) == 1 else sum(p[1] for p in procs)
            if used > h.memory_limit + least:
                out += self.over_cap(h, procs)
        return out

    def over_cap(self, h: Held, procs: Procs) -> list[Violation]:
        """MemoryOverLimit for the claim's offenders when NVML counts more than its cap and the allowance:
        once per claim under the limiter (its contexts are charged), per process without it (they are not)."""
        if h.memory_limit is None:
            return []
        used = sum(p[1] for p in procs)
        allowance = self.limiter_allowance if h.sharing == LIMITER else self.context_allowance * len(procs)
        if used <= h.memory_limit + allowance:
            return []
        return self._memory_offenders(h, procs, used, h.memory_limit + allowance)

    def mismatch(self, h: Held, procs: Procs, region: int, used: int) -> Violation | None:
        """The claim's region (which holds its processes' contexts) says less than NVML by more than the
        allowance per process: reported on its largest process, never acted on; None when it does not."""
        if not procs or used <= region + self.context_allowance * len(procs):
            return None
        pid = max(procs, key=lambda p: p[1])[0]
        detail = (
            f"the claim's limiter region accounts {region} bytes on this GPU but NVML counts {used} bytes for its "
            f"{len(procs)} processes, more than what their contexts may hold beyond their charge "
            f"({self.context_allowance} bytes each) explains"
        )
        return self._violation(Reason.MISMATCH, pid, h, WatchdogPolicy.REPORT, detail)

    def _memory_offenders(self, h: Held, procs: Procs, used: int, allowed: int) -> list[Violation]:
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
