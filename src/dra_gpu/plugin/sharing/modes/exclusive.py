"""Exclusive: the whole GPU to one claim (any number of its pods). Nothing to set up, only to refuse.

The scheduler should never put two claims on a GPU one of them holds exclusively, but a third-party
allocator or a stale allocation can; the plugin is the last line of defence against double use.
A result without a share id took the whole device, whatever its sharing strategy (only results on
multi-allocatable devices carry one), so it is refused beside any other claim as well.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_gpu.config.modes import takes_whole_gpu
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share


class Exclusive:
    name = "exclusive"
    order = 10

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        if not others:
            return None
        if takes_whole_gpu(share.strategy.value):
            other = others[0]
            return (
                f"GPU {share.device} ({share.gpu.uuid}) is already prepared for claim {other.claim} "
                f"({other.record.strategy} share); the {share.strategy.value} strategy needs the whole GPU"
            )
        if share.share_id is None:
            other = others[0]
            return (
                f"GPU {share.device} ({share.gpu.uuid}) is already prepared for claim {other.claim} "
                f"({other.record.strategy} share), but this claim was allocated the whole device (its "
                f"allocation result has no shareID): the device is allocated twice"
            )
        holder = next(
            (o for o in others if takes_whole_gpu(o.record.strategy) or o.record.shareId is None),
            None,
        )
        if holder is not None:
            how = "exclusively" if takes_whole_gpu(holder.record.strategy) else "as a whole device"
            return (
                f"GPU {share.device} ({share.gpu.uuid}) is held {how} by claim {holder.claim}; "
                f"a {share.strategy.value} share cannot be added to it"
            )
        return None

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        return None


BACKEND = Exclusive()
