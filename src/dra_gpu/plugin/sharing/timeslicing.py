"""TimeSlicing: the GPU-wide time-slice interval, shared by every time-sliced claim on the GPU.

The interval is a setting of the physical GPU (`nvidia-smi compute-policy --set-timeslice`), so a
claim asking for a different interval than the one in force is refused rather than silently
changing it under the other claims; the setting returns to Default with the last claim.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from dra_gpu.config import Strategy
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.commands import CommandError
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share, setup_failed

INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DETAIL = "interval"


def interval_of(share: Share) -> str:
    config = share.config.sharing.timeSlicing
    return config.interval if config is not None else "Default"


class TimeSlicing:
    name = "timeslicing"
    order = 20

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        if share.strategy != Strategy.TIME_SLICING:
            return None
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

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        for share in plan.sharing(Strategy.TIME_SLICING):
            interval = interval_of(share)
            plan.detail(share, DETAIL, interval)
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
