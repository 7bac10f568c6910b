"""A share's memory request (guaranteed) and limit (ceiling), the one place both are worked out.

The request is the consumed `memory` capacity (what the scheduler accounted for) or, without
consumable capacity, the config's `sharing.limiter.memory`. The limit is `sharing.limiter.memoryLimit`,
or the request where that is unset. A limit below the request is refused: the scheduler guaranteed
the request, so a lower ceiling would make the guarantee a lie.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.plan import Share
from dra_gpu.quantity import format_quantity


@dataclass(frozen=True)
class MemoryShare:
    request: int | None
    limit: int | None


def memory_share(share: Share, driver: str) -> MemoryShare:
    config = share.config.sharing.limiter
    request = share.amount("memory", driver, config.memory_bytes() if config is not None else None)
    limit = config.memory_limit_bytes() if config is not None else None
    if limit is None:
        return MemoryShare(request, request)
    if request is not None and limit < request:
        raise PrepareError(
            f"{share.device}: sharing.limiter.memoryLimit {format_quantity(limit)} is below the claim's memory "
            f"request {format_quantity(request)}; set memoryLimit to at least {format_quantity(request)} "
            f"or request less memory",
            reason="invalid_config",
        )
    return MemoryShare(request, limit)
