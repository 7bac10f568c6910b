"""Limiter: our LD_PRELOAD library enforces the claim's memory and compute share in every process.

The library comes from a versioned file on the host (installed by the DaemonSet's init container)
and is mounted read-only; a per-claim state directory is mounted read-write so that all processes
of all pods of the claim count against one limit. Limits come from the consumed capacity, or from
the config where the API server has no consumable capacity. The environment is the contract the
native limiter reads (see native/limiter). ``DRAGPU_CORES_LIMIT`` applies to every GPU a process uses,
so a compute limit is refused in a claim that also has GPUs without a Limiter share.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_gpu.config import Strategy
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing._memory import memory_share
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share

CONTAINER_LIBRARY = "/usr/local/lib/dra-gpu/libdragpu-limiter.so.1"
CONTAINER_STATE_DIR = "/var/run/dra-gpu/limiter"


def memory_limit(share: Share, driver: str) -> int | None:
    """The claim-wide budget is the share's ceiling (`memoryLimit`, else the request)."""
    return memory_share(share, driver).limit


def cores_limit(share: Share, driver: str) -> int | None:
    config = share.config.sharing.limiter
    return share.amount("cores", driver, config.cores if config is not None else None)


class Limiter:
    name = "limiter"
    order = 40

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None  # limiter shares coexist with each other and with time-slicing

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        shares = plan.sharing(Strategy.LIMITER)
        if not shares:
            return
        library = node.limiter_library
        if not library.is_file():
            raise PrepareError(
                f"the limiter library {library} does not exist on this node; the plugin DaemonSet's init "
                f"container installs it (check --limiter-library / DRA_GPU_LIMITER_LIBRARY)",
                reason="limiter_missing",
            )
        state = node.claim_dir(plan.claim.uid) / "limiter"
        plan.hold("dir", f"dir:{state}", path=str(state), mode=0o777)
        edits = plan.claim_edits
        edits.add_mount(library, CONTAINER_LIBRARY, ["ro", "nosuid", "nodev", "bind"])
        edits.add_mount(state, CONTAINER_STATE_DIR, ["rw", "nosuid", "nodev", "bind"])
        edits.env["LD_PRELOAD"] = CONTAINER_LIBRARY
        edits.env["DRAGPU_LIMITER_STATE_DIR"] = CONTAINER_STATE_DIR

        memory: dict[str, int] = {}
        cores: dict[str, int] = {}
        for share in shares:
            uuid = share.gpu.uuid
            mem = memory_limit(share, node.driver)
            if mem is not None:
                memory[uuid] = memory.get(uuid, 0) + mem
            cpu = cores_limit(share, node.driver)
            if cpu is not None:
                cores[uuid] = cores.get(uuid, 0) + cpu
        if memory:
            edits.env["DRAGPU_MEMORY_LIMIT_BY_UUID"] = ",".join(f"{u}={b}" for u, b in memory.items())
            for gpu in plan.visible_gpus():
                if gpu.uuid in memory:
                    edits.env[f"DRAGPU_MEMORY_LIMIT_{plan.ordinal(gpu)}"] = str(memory[gpu.uuid])
        if cores:
            # One compute share for the whole claim: the smallest, so no GPU runs above its share.
            limit = min(max(min(cores.values()), 1), 100)
            limited = {s.gpu.uuid for s in shares}
            unlimited = [s for s in plan.shares if s.gpu.uuid not in limited]
            if limit < 100 and unlimited:
                # The variable throttles every GPU the process uses; one that is not a Limiter share
                # (a whole GPU, a time-sliced one) must not be slowed down to another GPU's share.
                other = unlimited[0]
                kind = "admin-access" if other.admin_access else other.strategy.value
                raise PrepareError(
                    f"claim {plan.claim.ref} has a Limiter share with a compute limit of {limit}% and also "
                    f"{other.device} ({kind}); the limiter applies one compute limit to every GPU a process "
                    f"uses, so it would throttle {other.device} too. Put the Limiter shares and the other "
                    f"GPUs in separate claims",
                    reason="invalid_config",
                )
            edits.env["DRAGPU_CORES_LIMIT"] = str(limit)


BACKEND = Limiter()
