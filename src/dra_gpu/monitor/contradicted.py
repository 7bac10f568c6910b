"""Claims whose activity file the driver's figures contradict: a claim whose file says it wants the GPU now
while the driver saw its processes run nothing since the last read. Its word then holds no one back: the agent
marks it on its GPU's board, where the library reads it (`publish_marks`), until the driver sees it run again."""

from __future__ import annotations

import time
from pathlib import Path

from dra_gpu.monitor.claim_files import ClaimFiles
from dra_gpu.monitor.elastic import publish_marks
from dra_gpu.monitor.figures import Held
from dra_gpu.monitor.memory_caps import Procs
from dra_gpu.monitor.nvml_usage import GpuProcesses
from dra_gpu.monitor.watchdog import Reason, Watchdog


class Contradictions:
    """`contradicted`: (claim uid, gpu) -> since when (monotonic) the driver contradicts its activity file."""

    def __init__(self, boards_dir: Path, files: ClaimFiles, watchdog: Watchdog) -> None:
        self._boards_dir = boards_dir
        self._files = files
        self._watchdog = watchdog
        self.contradicted: dict[tuple[str, str], float] = {}

    def check(
        self,
        limited: dict[tuple[str, str], Held],
        nvml_memory: dict[tuple[str, str], Procs],
        processes: dict[str, GpuProcesses],
    ) -> None:
        """Checks every limiter share (`limited`) whose GPU's utilization NVML answered for; a claim newly
        contradicted gets a Warning event; the boards are marked with exactly the claims contradicted now."""
        now_ns = time.monotonic_ns()
        found: dict[tuple[str, str], float] = {}
        for key, h in limited.items():
            figures = processes.get(h.gpu)
            if figures is None or not figures.utilization_known:
                continue
            busy = figures.busy_seconds
            if busy and any(busy.get(p[0], 0.0) > 0 for p in nvml_memory.get(key, ())):
                continue  # it runs: whatever it says of itself stands
            activity = self._files.activity(h.gpu, h.claim.uid)
            if activity is None or activity.demand_until_ns <= now_ns:
                continue
            found[key] = self.contradicted.get(key, time.monotonic())
            if key not in self.contradicted:
                self._watchdog.claim_event(
                    h.claim,
                    Reason.ACTIVITY,
                    f"the claim's activity file says it wants GPU {h.gpu} now, but the driver saw its processes run "
                    "nothing there since the last look: its word holds no other claim back",
                )
        self.contradicted = found
        marks: dict[str, set[str]] = {h.gpu: set() for h in limited.values()}
        for uid, gpu in found:
            marks[gpu].add(uid)
        publish_marks(self._boards_dir, marks)
