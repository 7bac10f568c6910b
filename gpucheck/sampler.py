"""NVML's utilisation of the GPU, sampled while a measurement runs: what `nvidia-smi` would show.

A second opinion next to the busy fraction on the GPU's own clock (NVML counts a sample period as
busy when any kernel ran in it, so it reads high for short kernels). Optional: without NVML, or on
any NVML error, there is simply no figure.
"""

from __future__ import annotations

import threading
from typing import Any

PERIOD_S = 0.1


class UtilizationSampler:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-utilization", daemon=True)

    def __enter__(self) -> UtilizationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def mean(self, skip: int = 3) -> float | None:
        """Mean percent, leaving out `skip` samples at each end (start-up and wind-down)."""
        kept = self.samples[skip:-skip] if len(self.samples) > 2 * skip else []
        return sum(kept) / len(kept) if kept else None

    def _run(self) -> None:
        try:
            import pynvml  # type: ignore[import-not-found, unused-ignore]

            nvml: Any = pynvml
            nvml.nvmlInit()
        except Exception:
            return
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(self.uuid)
            while not self._stop.wait(PERIOD_S):
                self.samples.append(int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        except Exception:
            return
        finally:
            nvml.nvmlShutdown()
