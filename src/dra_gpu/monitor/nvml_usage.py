"""Per-process GPU figures from NVML: memory of running compute processes, and busy time.

Busy time comes from the driver's per-process utilization samples: each sample's SM utilization
over the time since the GPU's previous sample. `nvmlDeviceGetProcessesUtilizationInfo` (newer
drivers) is asked first, `nvmlDeviceGetProcessUtilization` where it is missing. The bindings size
the arrays themselves (NVML_ERROR_INSUFFICIENT_SIZE is handled there); NVML_ERROR_NOT_FOUND means no
sample newer than the timestamp given; NOT_SUPPORTED / FUNCTION_NOT_FOUND mean the GPU or driver has
no such figure, and it is left out rather than reported as zero.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_FUNCTION_NOT_FOUND = 13
_ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
_UTILIZATION_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")


@dataclass
class GpuProcesses:
    """One GPU at one sampling: host pid -> bytes (None: NVML cannot tell) and -> busy seconds since last."""

    memory: dict[int, int | None] = field(default_factory=dict)
    busy_seconds: dict[int, float] = field(default_factory=dict)
    utilization_known: bool = False


def _code(err: BaseException) -> int:
    return int(getattr(err, "value", -1))


class NvmlSampler:
    """Samples every GPU given by UUID. `nvml` is the pynvml module (or the tests' fake)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._nvml.nvmlInit()
        self._handles: dict[str, Any] = {}
        self._last_ts: dict[str, int] = {}
        self._utilization_call: dict[str, str | None] = {}

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            handle = self._handles[uuid] = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
        return handle

    def sample(self, uuids: list[str]) -> dict[str, GpuProcesses]:
        out: dict[str, GpuProcesses] = {}
        for uuid in uuids:
            try:
                out[uuid] = self._sample_gpu(uuid)
            except self._nvml.NVMLError as err:
                self._handles.pop(uuid, None)
                log.warning("cannot read the GPU's processes", extra={"gpu": uuid, "error": str(err)})
        return out

    def memory(self, uuids: list[str]) -> dict[str, GpuProcesses]:
        """Only the processes' memory (no utilization): the watchdog's fast pass."""
        out: dict[str, GpuProcesses] = {}
        for uuid in uuids:
            try:
                out[uuid] = self._memory_of(self._handle(uuid))
            except self._nvml.NVMLError as err:
                self._handles.pop(uuid, None)
                log.warning("cannot read the GPU's processes", extra={"gpu": uuid, "error": str(err)})
        return out

    def _sample_gpu(self, uuid: str) -> GpuProcesses:
        handle = self._handle(uuid)
        result = self._memory_of(handle)
        self._utilization(uuid, handle, result)
        return result

    def _memory_of(self, handle: Any) -> GpuProcesses:
        result = GpuProcesses()
        try:
            running = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError as err:
            if _code(err) not in _ABSENT:
                raise
            running = []
        for proc in running:
            used = getattr(proc, "usedGpuMemory", None)
            result.memory[int(proc.pid)] = None if used is None else int(used)
        return result

    def _utilization(self, uuid: str, handle: Any, result: GpuProcesses) -> None:
        candidates = (
            [self._utilization_call[uuid]] if uuid in self._utilization_call else list(_UTILIZATION_CALLS)
        )
        for name in candidates:
            if name is None:
                return
            function = getattr(self._nvml, name, None)
            if function is None:
                continue
            last = self._last_ts.get(uuid, 0)
            try:
                samples = function(handle, last)
            except self._nvml.NVMLError as err:
                if _code(err) == _NOT_FOUND:  # no sample since `last`: nothing ran, or too soon
                    self._utilization_call[uuid] = name
                    result.utilization_known = True
                    return
                if _code(err) in _ABSENT:
                    continue
                raise
            self._utilization_call[uuid] = name
            result.utilization_known = True
            by_time: dict[int, list[Any]] = {}
            for s in samples:
                by_time.setdefault(int(s.timeStamp), []).append(s)
            previous = last
            for ts in sorted(by_time):
                span = (ts - previous) / 1e6 if previous else 0.0  # the very first sample sets a baseline
                for s in by_time[ts]:
                    pid = int(s.pid)
                    result.busy_seconds[pid] = result.busy_seconds.get(pid, 0.0) + int(s.smUtil) / 100 * span
                previous = ts
            self._last_ts[uuid] = max([last, *(int(s.timeStamp) for s in samples)])
            return
        self._utilization_call[uuid] = None
