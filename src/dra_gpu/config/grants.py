"""What a DeviceClass grants the limiter shares of its claims: the most priority, compute ceiling and memory
ceiling a claim may have. Only an admin writes a DeviceClass, so only an admin grants them.

A class grants what its own GpuConfig sets in `sharing.limiter`:

- `compute.priority`: the highest class in the GPU's arbitration (`besteffort` < `standard` < `latency`);
  unset, `standard`;
- `compute.limit`: the highest compute ceiling; unset, the claim's floor (its `cores`: a fixed share);
- `memoryLimit`: the highest memory ceiling; unset, the memory the scheduler charged the request (its
  consumed `memory` capacity).

A class's ceiling below what the scheduler charged a claim (its `cores`, its `memory`) is raised to that
charge: a claim always may use what it was charged. A claim's own config may ask for less, never more;
what it leaves out it takes from its class (a claim of a `latency` class that writes only a `memoryLimit`
stays `latency`). The node refuses a claim asking for more (`effective`), and the claim admission policy
refuses it at creation (`manifests/admission.py`) by the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gpu.config.base import ConfigError
from dra_gpu.config.claim import ComputeConfig, GpuConfig, LimiterConfig
from dra_gpu.limiter_abi.limits import DEFAULT_PRIORITY, PRIORITY_ORDER, Priority
from dra_gpu.quantity import format_quantity

RANK = {p: rank for rank, p in enumerate(reversed(Priority))}
"""Priorities from the lowest (`PRIORITY_ORDER`); a claim may have its class's or a lower one."""


@dataclass(frozen=True)
class Grant:
    """The most a class gives a claim's limiter share; None where the class sets nothing (see above)."""

    priority: Priority = DEFAULT_PRIORITY
    compute_limit: int | None = None
    memory_limit: int | None = None


def grant_of(class_config: GpuConfig | None) -> Grant:
    """What a class's GpuConfig (None: the class has none of this driver) grants."""
    limiter = class_config.sharing.limiter if class_config is not None else None
    if limiter is None:
        return Grant()
    compute = limiter.compute
    return Grant(
        priority=compute.priority if compute is not None else DEFAULT_PRIORITY,
        compute_limit=compute.limit if compute is not None else None,
        memory_limit=limiter.memory_limit_bytes(),
    )


def _asked(limiter: LimiterConfig) -> tuple[Priority | None, int | None, int | None]:
    """What the claim's own limiter section sets of what classes grant (None where it leaves it out)."""
    compute = limiter.compute
    priority = compute.priority if compute is not None and "priority" in compute.model_fields_set else None
    limit = compute.limit if compute is not None else None
    return priority, limit, limiter.memory_limit_bytes()


def excess(limiter: LimiterConfig, grant: Grant, floor: int, charged: int | None) -> str | None:
    """What the claim's limiter section asks beyond `grant`, as the part of a line after the claim's name;
    None when it asks for no more. `floor` is the share's cores, `charged` the memory the scheduler charged
    the request (None where the request names no memory: it holds the whole GPU's)."""
    priority, limit, memory_limit = _asked(limiter)
    if priority is not None and RANK[priority] > RANK[grant.priority]:
        return (
            f"sharing.limiter.compute.priority {priority.value} is above what its class grants "
            f"({grant.priority.value}; {PRIORITY_ORDER}): ask for {grant.priority.value} or lower"
        )
    granted = grant.compute_limit is not None and grant.compute_limit >= floor
    top = grant.compute_limit if granted and grant.compute_limit is not None else floor
    if limit is not None and limit > top:
        why = (
            "its compute.limit" if granted else "the share's cores: the class grants no higher compute.limit"
        )
        return f"sharing.limiter.compute.limit {limit} is above what its class grants ({top}, {why}): ask for at most {top}"
    if memory_limit is not None and charged is not None:
        granted = grant.memory_limit is not None and grant.memory_limit >= charged
        ceiling = grant.memory_limit if granted and grant.memory_limit is not None else charged
        if memory_limit > ceiling:
            why = (
                "its memoryLimit"
                if granted
                else "what the request is charged: the class grants no higher memoryLimit"
            )
            return (
                f"sharing.limiter.memoryLimit {limiter.memoryLimit} is above what its class grants "
                f"({format_quantity(ceiling)}, {why}): ask for at most {format_quantity(ceiling)}"
            )
    return None


def effective(
    config: GpuConfig,
    class_config: GpuConfig | None,
    class_name: str,
    floor: int,
    charged: int | None,
    request: int | None,
) -> GpuConfig:
    """The share's config with what its class grants filled in where the claim's limiter section leaves it
    out; ConfigError (one line naming the class) where the claim asks for more than the class grants, or for
    a ceiling below its floor (which the limiter would drop; a class's such ceiling is raised to the floor).

    `request` is the share's memory request (charged or configured): a class's `memoryLimit` below it is
    not taken (the ceiling is then the request)."""
    limiter = config.sharing.limiter
    if limiter is None:
        return config
    grant = grant_of(class_config)
    asked = limiter.compute.limit if limiter.compute is not None else None
    if asked is not None and asked < floor and config != class_config:
        raise ConfigError(
            f"sharing.limiter.compute.limit {asked} is below the share's floor {floor} (its cores; a request that "
            f"names no cores is charged all 100): raise compute.limit, ask for fewer cores, or leave it out"
        )
    refused = excess(limiter, grant, floor, charged)
    if refused is not None:
        raise ConfigError(f"DeviceClass {class_name}: {refused}, or use a class that grants more")
    priority, limit, memory_limit = _asked(limiter)
    ceiling = limit if limit is not None else grant.compute_limit
    compute = ComputeConfig.model_validate(
        {"priority": priority if priority is not None else grant.priority}
        | ({} if ceiling is None else {"limit": ceiling})
    )
    update: dict[str, object] = {}
    before = limiter.compute or ComputeConfig()
    if (compute.limit, compute.priority) != (before.limit, before.priority):
        update["compute"] = compute
    inherited = grant.memory_limit
    if memory_limit is None and inherited is not None and (request is None or inherited >= request):
        update["memoryLimit"] = str(inherited)
    if not update:
        return config
    sharing = config.sharing.model_copy(update={"limiter": limiter.model_copy(update=update)})
    return config.model_copy(update={"sharing": sharing})
