"""Exclusive: the whole GPU to one claim (any number of its pods). Nothing to set up, only to refuse.

The scheduler should never put two claims on a GPU one of them holds exclusively, but a third-party
allocator or a stale allocation can; the plugin is the last line of defence against double use.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_gpu.config import Strategy
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share


class Exclusive:
    name = "exclusive"
    order = 10

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        if not others:
            return None
        if share.strategy == Strategy.EXCLUSIVE:
            other = others[0]
            return (
                f"GPU {share.device} ({share.gpu.uuid}) is already prepared for claim {other.claim} "
                f"({other.record.strategy} share); the Exclusive strategy needs the whole GPU"
            )
        holder = next((o for o in others if o.record.strategy == Strategy.EXCLUSIVE.value), None)
        if holder is not None:
            return (
                f"GPU {share.device} ({share.gpu.uuid}) is held exclusively by claim {holder.claim}; "
                f"a {share.strategy.value} share cannot be added to it"
            )
        return None

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        return None


BACKEND = Exclusive()
