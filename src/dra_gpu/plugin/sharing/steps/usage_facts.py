"""Usage facts: records each share's memory and compute limits and watchdog policy in the checkpoint.

Not an enforcement mechanism: the node agent's monitor (`dra_gpu.monitor`) reads these details to
put use beside allocation and to judge what escapes a share. A share without a share id took the
whole GPU: its limits are the GPU's.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_gpu.config import Strategy, WatchdogPolicy
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share
from dra_gpu.quantity import to_int

MEMORY = "memoryLimit"
CORES = "coresLimit"
WATCHDOG = "watchdog"


def _configured(share: Share) -> tuple[int | None, int | None]:
    sharing = share.config.sharing
    if sharing.limiter is not None:
        return sharing.limiter.memory_bytes(), sharing.limiter.cores
    if sharing.mps is not None:
        memory = sharing.mps.defaultPinnedDeviceMemoryLimit
        return (to_int(memory) if memory is not None else None), sharing.mps.defaultActiveThreadPercentage
    return None, None


def watchdog_policy(share: Share) -> WatchdogPolicy | None:
    """The class's policy; a claim's own config may make it stricter (Terminate), never looser. None where the
    class sets none: the node's default then holds (a limiter claim's memory cap and compute ceiling enforced,
    the rest reported), which a claim cannot loosen to Report either."""
    policies = [c.watchdog.policy for c in (share.config, share.class_config) if c is not None and c.watchdog]
    if WatchdogPolicy.TERMINATE in policies:
        return WatchdogPolicy.TERMINATE
    if share.class_config is not None and share.class_config.watchdog is not None:
        return share.class_config.watchdog.policy
    return None


class UsageFacts:
    name = "usage-facts"
    order = 90

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        for share in plan.shares:
            if share.admin_access:
                continue
            memory: int | None
            cores: int | None
            if share.share_id is None or share.strategy == Strategy.EXCLUSIVE:
                memory, cores = share.gpu.memory_bytes, 100
            else:
                configured_memory, configured_cores = _configured(share)
                memory = share.amount("memory", node.driver, configured_memory)
                cores = share.amount("cores", node.driver, configured_cores)
            if memory is not None:
                plan.detail(share, MEMORY, str(memory))
            if cores is not None:
                plan.detail(share, CORES, str(cores))
            policy = watchdog_policy(share)
            if policy is not None:
                plan.detail(share, WATCHDOG, policy.value)


BACKEND = UsageFacts()
