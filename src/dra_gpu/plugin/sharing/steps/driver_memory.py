"""Driver memory limits: the NVIDIA driver (615+) caps each container's cgroup, not our preload library.

For the Limiter shares of a GPU whose node can (``GpuInfo.memory_isolation == "driver"``, see
``inventory.capabilities``), the claim's CDI spec gets, per GPU:

- a ``createRuntime`` hook, ``dra-gpu cdi-hook set-memory-limits``, that sets the soft limit (the
  request, guaranteed) and the hard limit (the ceiling) on the container's own cgroup before the
  workload starts; the runtime refuses the container if that fails;
- a ``poststop`` hook, ``dra-gpu cdi-hook clear-memory-limits``, that clears the soft limit so that
  the ancestors' ``dmem.min`` does not keep the reservation; unprepare clears whatever is left.

The limiter stays on as well: a cgroup limit is per container, while the limiter's budget is pooled
over every process of every pod of the claim (see docs/memory-isolation.md).

``DRA_GPU_MEMORY_LIMIT_HOOK=toolkit`` uses the NVIDIA Container Toolkit's
``nvidia-cdi-hook apply-cuda-memory-limits`` instead (``NVIDIA_GPU_MEMORY_REQUEST``/``_LIMIT`` in MiB);
it limits every GPU of the container alike and has no teardown step, so it is only accepted for a
claim with one GPU. The hook runs in the runtime's namespace on the host, not in the plugin's
container: which executable it is, and whether the host has it, is decided at start
(``capabilities.find_limit_hook``); a node without one publishes its GPUs as ``limiter``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence, Set
from pathlib import Path

from cdi.spec import Hook
from dra_gpu.config import Strategy
from dra_gpu.host.memory_hook import HookError, clear_recorded
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.capabilities import HOOK_KIND_ENV, LimitHook, MemoryIsolation, find_limit_hook
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing._memory import memory_share
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share, setup_failed

HOLD_KIND = "memory-limits"
MIB = 2**20
HOOK_TIMEOUT_S = 30


def limit_hook(node: NodeContext) -> LimitHook:
    """The hook decided at start; looked up now where the node was built without one."""
    hook = node.limit_hook or find_limit_hook(node.driver_root, node.driver_root_host_path)
    if hook.problem:
        raise PrepareError(hook.problem, reason="setup_failed")
    return hook


def record_dir(node: NodeContext, claim_uid: str) -> Path:
    return node.claim_dir(claim_uid) / "memory-limits"


class DriverMemory:
    name = "driver-memory"
    order = 45

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None  # limits are per container cgroup; they coexist with every other share

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        shares = [
            s
            for s in plan.sharing(Strategy.LIMITER)
            if s.gpu.memory_isolation == MemoryIsolation.DRIVER.value
        ]
        by_gpu: dict[str, list[Share]] = {}
        for share in shares:
            by_gpu.setdefault(share.gpu.uuid, []).append(share)
        limits: dict[str, tuple[Share, int, int]] = {}
        for uuid, group in by_gpu.items():
            amounts = [memory_share(s, node.driver) for s in group]
            if any(a.request is None or a.limit is None for a in amounts):
                continue  # no memory cap asked for on this GPU: nothing for the driver to enforce
            soft = sum(a.request or 0 for a in amounts)
            hard = sum(a.limit or 0 for a in amounts)
            limits[uuid] = (group[0], soft, hard)
        if not limits:
            return
        hook = limit_hook(node)
        if hook.kind == "toolkit":
            self._toolkit(plan, limits, hook.path)
            return
        executable = hook.path
        base = record_dir(node, plan.claim.uid)
        plan.hold(HOLD_KIND, f"{HOLD_KIND}:{plan.claim.uid}", dir=str(base))
        for uuid, (first, soft, hard) in limits.items():
            records = str(base / uuid)
            edits = plan.edits(first)
            edits.hooks.append(
                Hook(
                    hook_name="createRuntime",
                    path=executable,
                    args=[
                        "dra-gpu",
                        "cdi-hook",
                        "set-memory-limits",
                        "--record-dir",
                        records,
                        "--limit",
                        f"{uuid}={soft}:{hard}",
                    ],
                    timeout=HOOK_TIMEOUT_S,
                )
            )
            edits.hooks.append(
                Hook(
                    hook_name="poststop",
                    path=executable,
                    args=["dra-gpu", "cdi-hook", "clear-memory-limits", "--record-dir", records],
                    timeout=HOOK_TIMEOUT_S,
                )
            )
            plan.detail(first, "memoryLimits", f"soft={soft},hard={hard}")

    @staticmethod
    def _toolkit(plan: Plan, limits: dict[str, tuple[Share, int, int]], executable: str) -> None:
        if len(plan.visible_gpus()) != 1:
            raise PrepareError(
                f"claim {plan.claim.ref}: the toolkit's apply-cuda-memory-limits hook applies one limit to every "
                f"GPU of the container, so it serves claims with one GPU only; unset {HOOK_KIND_ENV} to use "
                f"dra-gpu's own hook",
                reason="invalid_config",
            )
        ((first, soft, hard),) = limits.values()
        edits = plan.edits(first)
        edits.env["NVIDIA_GPU_MEMORY_REQUEST"] = str(soft // MIB)
        edits.env["NVIDIA_GPU_MEMORY_LIMIT"] = str(hard // MIB)
        edits.hooks.append(
            Hook(
                hook_name="createRuntime",
                path=executable,
                args=["nvidia-cdi-hook", "apply-cuda-memory-limits"],
            )
        )


class MemoryLimitRecords:
    """The claim's record directory; on release, clears the limits a poststop hook did not clear."""

    kind = HOLD_KIND

    def apply(self, hold: Hold, node: NodeContext) -> None:
        try:
            Path(str(hold.params["dir"])).mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise setup_failed("creating the memory-limit record directory", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        base = Path(str(hold.params["dir"]))
        problems: list[str] = []
        try:
            for directory in sorted(p for p in base.glob("*") if p.is_dir()):
                problems += clear_recorded(directory)
        except HookError as exc:
            problems.append(str(exc))
        if problems:
            raise PrepareError(
                f"clearing the driver memory limits of the claim's containers: {'; '.join(problems)}",
                reason="setup_failed",
            )
        shutil.rmtree(base, ignore_errors=True)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return Path(str(hold.params["dir"])).is_dir()

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


BACKEND = DriverMemory()
HOLD_HANDLERS = (MemoryLimitRecords(),)
