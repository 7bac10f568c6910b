"""The checks, in the order they run. Each takes the `Context` and returns one or more `Result`s."""

from __future__ import annotations

from collections.abc import Callable

from gpucheck.checks import (
    colocation,
    compute,
    elastic,
    enforce,
    frameworks,
    gpu_settings,
    inventory,
    memory,
    mig,
    nodepath,
    overhead,
    serving,
)
from gpucheck.context import Context
from gpucheck.report import Result

Check = Callable[[Context], "Result | list[Result]"]

CHECKS: tuple[tuple[str, Check], ...] = (
    ("inventory", inventory.inventory),
    ("limiter.cap", memory.cap_precision),
    ("limiter.view", memory.views),
    ("limiter.pooled", memory.pooled),
    ("limiter.shared", memory.shared),
    ("limiter.family", memory.families),
    ("framework", frameworks.frameworks),
    ("serving", serving.serving),
    ("compute.baseline", compute.baseline),
    ("compute", compute.accuracy),
    ("compute.elastic.floors", elastic.floors),
    ("compute.elastic.alone", elastic.alone),
    ("compute.elastic.reclaim", elastic.reclaim),
    ("compute.colocation", colocation.colocation),
    ("memory.enforce", enforce.memory),
    ("compute.enforce", enforce.compute),
    ("enforce.node-settings", enforce.node_settings),
    ("overhead", overhead.overhead),
    ("gpu.compute-mode", gpu_settings.compute_mode),
    ("gpu.timeslice", gpu_settings.timeslice),
    ("mps", gpu_settings.mps),
    ("nodepath", nodepath.nodepath),
    ("mig", mig.mig_cycle),
)
