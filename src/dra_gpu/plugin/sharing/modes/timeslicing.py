"""TimeSlicing: the GPU-wide time-slice interval, and the claim's memory capped to what it was charged.

The interval is a setting of the physical GPU (`nvidia-smi compute-policy --set-timeslice`), so a
claim asking for a different interval than the one in force is refused rather than silently
changing it under the other claims; the setting returns to Default with the last claim.

Time-sliced and limiter claims share GPUs (both are `Shared`), and the scheduler charges each its
consumed `memory`. Without a cap, one time-sliced tenant could take the whole GPU from the capped
claims beside it, so a time-sliced claim gets the limiter's pooled memory budget of its consumed
`memory` (limits file and preload, as a limiter claim gets; no compute cap). Where that cannot be
had (no consumable capacity, no library), the share is recorded uncapped, and an uncapped
time-sliced share and a limiter share are never prepared on one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from dra_gpu.config import Strategy
from dra_gpu.host.gpu_commands import CommandError
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share, setup_failed
from dra_gpu.quantity import to_int

INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DETAIL = "interval"
CAP_DETAIL = "memoryCap"
"""Bytes of the limiter budget a time-sliced share got; absent: the share runs uncapped."""


def uncapped_notice(reason: str) -> str:
    return (
        f"this time-sliced claim has no memory cap ({reason}); the node will not place it on a GPU "
        f"that holds limiter claims, nor limiter claims beside it"
    )


def _has_memory(share: Share) -> bool:
    """Whether the scheduler charged the share `memory` (spelled `memory` or `<driver>/memory`)."""
    return any(name == "memory" or name.endswith("/memory") for name in share.consumed)


def _capped(share: Share, driver: str) -> int | None:
    consumed = share.capacity("memory", driver)
    return to_int(consumed) if consumed is not None else None


def interval_of(share: Share) -> str:
    config = share.config.sharing.timeSlicing
    return config.interval if config is not None else "Default"


class TimeSlicing:
    name = "timeslicing"
    order = 20

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        problem = self._uncapped_beside_limiter(share, others)
        if problem is not None or share.strategy != Strategy.TIME_SLICING:
            return problem
        wanted = interval_of(share)
        for other in others:
            current = other.record.detail.get(DETAIL)
            if other.record.strategy == Strategy.TIME_SLICING.value and current and current != wanted:
                return (
                    f"GPU {share.device} ({share.gpu.uuid}) is time-sliced with interval {current} for "
                    f"claim {other.claim}; this claim asks for {wanted}. The interval is GPU-wide: use "
                    f"the same interval as the claims already on the GPU, or another GPU"
                )
        return None

    @staticmethod
    def _uncapped_beside_limiter(share: Share, others: Sequence[Holder]) -> str | None:
        """An uncapped time-sliced share could take the memory a limiter share beside it is promised."""
        timeslice, limiter = Strategy.TIME_SLICING.value, Strategy.LIMITER.value
        mine = share.strategy
        if mine not in (Strategy.LIMITER, Strategy.TIME_SLICING):
            return None  # (the checks below are about these two only; a busy GPU has 50 others to look at)
        for other in others:
            record = other.record
            if mine == Strategy.LIMITER and record.strategy == timeslice and CAP_DETAIL not in record.detail:
                return (
                    f"GPU {share.device} ({share.gpu.uuid}) hosts claim {other.claim}, time-sliced without "
                    f"a memory cap, which could take the memory this limiter claim is promised; use another GPU"
                )
            # Without the library no limiter claim prepares, so only missing capacity leaves a new
            # time-sliced share uncapped beside one.
            if mine == Strategy.TIME_SLICING and record.strategy == limiter and not _has_memory(share):
                return (
                    f"GPU {share.device} ({share.gpu.uuid}) hosts limiter claim {other.claim}; this "
                    f"time-sliced claim has no consumed memory capacity to be capped to, so it could take "
                    f"that claim's memory; use another GPU"
                )
        return None

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        library = node.limiter_library.is_file()
        for share in plan.sharing(Strategy.TIME_SLICING):
            interval = interval_of(share)
            plan.detail(share, DETAIL, interval)
            memory = _capped(share, node.driver)
            if memory is None:
                plan.notice(uncapped_notice("the API server has no consumable capacity"))
            elif not library:
                plan.notice(uncapped_notice(f"the limiter library {node.limiter_library} is not installed"))
            else:
                plan.limit(share.gpu, memory)  # the limiter backend writes the files and the preload
                plan.detail(share, CAP_DETAIL, str(memory))
            plan.hold(
                "timeslice",
                f"timeslice:{share.gpu.uuid}",
                gpu=share.gpu.uuid,
                device=share.device,
                index=share.gpu.index,
                interval=interval,
            )


class TimeSliceSetting:
    kind = "timeslice"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        value = INTERVALS[str(hold.params["interval"])]
        try:
            node.commands.set_timeslice(int(hold.params["index"]), value)
        except CommandError as exc:
            raise setup_failed(
                f"setting the time-slice interval {hold.params['interval']} on GPU {hold.params['device']}",
                exc,
            ) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        if last:
            try:
                node.commands.set_timeslice(int(hold.params["index"]), INTERVALS["Default"])
            except CommandError as exc:
                raise setup_failed(
                    f"restoring the Default time-slice interval on GPU {hold.params['device']}", exc
                ) from None

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return True  # the driver offers no query; re-applied on every prepare instead

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        if f"{self.kind}:{gpu.uuid}" not in held:
            node.commands.set_timeslice(gpu.index, INTERVALS["Default"])


BACKEND = TimeSlicing()
HOLD_HANDLERS = (TimeSliceSetting(),)
