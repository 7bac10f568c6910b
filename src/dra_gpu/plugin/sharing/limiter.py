"""Limiter: our preloaded library enforces the claim's memory budget and compute share in every process.

The library comes from a versioned file on the host (installed by the DaemonSet's init container)
and is mounted read-only; the host file ``ld.so.preload`` naming it is mounted at the container's
``/etc/ld.so.preload``, so the library loads in every process whatever the image's environment. Each
claim has its own directory in the container, ``/run/dra-gpu/claims/<claim-uid>/``, with

- ``limits``: the claim's budgets, one ``device=`` line per GPU (read-only; written by the agent
  before the CDI spec; the format is in docs/memory-isolation.md);
- ``limiter/``: the accounting state shared by all processes of all pods of the claim (read-write),

so a container using several claims keeps every claim's limits. Budgets come from Limiter shares
(their consumed capacity, or the config where the API server has no consumable capacity) and from
other backends that pool a claim's memory (MPS, ``Plan.limit``).

Libraries that predate the limits file read the environment, which the spec still sets for them
(``LD_PRELOAD``, ``DRAGPU_LIMITER_STATE_DIR``, ``DRAGPU_MEMORY_LIMIT_BY_UUID``,
``DRAGPU_CORES_LIMIT``); there, ``DRAGPU_CORES_LIMIT`` applies to every GPU a process uses, so a
compute limit is refused in a claim that also has GPUs without a Limiter share.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dra_gpu.config import Strategy
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing._memory import memory_share
from dra_gpu.plugin.sharing.plan import DeviceLimit, Holder, NodeContext, Plan, Share

CONTAINER_LIBRARY = "/usr/local/lib/dra-gpu/libdragpu-limiter.so.1"
CONTAINER_CLAIMS_ROOT = "/run/dra-gpu/claims"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
LIMITS_FILE = "limits"
STATE_DIR = "limiter"
PRELOAD_FILE = "ld.so.preload"
LIMITS_VERSION = 1


def memory_limit(share: Share, driver: str) -> int | None:
    """The claim-wide budget is the share's ceiling (`memoryLimit`, else the request)."""
    return memory_share(share, driver).limit


def cores_limit(share: Share, driver: str) -> int | None:
    config = share.config.sharing.limiter
    return share.amount("cores", driver, config.cores if config is not None else None)


def container_claim_dir(claim_uid: str) -> str:
    return f"{CONTAINER_CLAIMS_ROOT}/{claim_uid}"


def limits_text(plan: Plan, limits: dict[str, DeviceLimit]) -> str:
    """The claim's limits file (format version 1)."""
    lines = [
        f"version={LIMITS_VERSION}",
        f"claim={plan.claim.ref}",
        f"state={container_claim_dir(plan.claim.uid)}/{STATE_DIR}",
    ]
    for uuid, limit in limits.items():
        memory = "unlimited" if limit.memory is None else str(limit.memory)
        lines.append(f"device={uuid} memory={memory} cores={limit.cores}")
    return "\n".join(lines) + "\n"


class Limiter:
    name = "limiter"
    order = 40

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None  # limiter shares coexist with each other and with time-slicing

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        shares = plan.sharing(Strategy.LIMITER)
        cores: dict[str, int] = {}
        for share in shares:
            cpu = cores_limit(share, node.driver)
            if cpu is not None:
                cores[share.gpu.uuid] = cores.get(share.gpu.uuid, 0) + cpu
            plan.limit(share.gpu, memory_limit(share, node.driver), cpu if cpu is not None else 100)
        if not plan.limits:
            return
        library = node.limiter_library
        if not library.is_file():
            if not shares:  # only pooled budgets of another mode: that mode's own limits still hold
                plan.notice(
                    "the limiter library is not installed on this node, so the claim's memory limit "
                    "holds per process, not for the claim as a whole"
                )
                return
            raise PrepareError(
                f"the limiter library {library} does not exist on this node; the plugin DaemonSet's init "
                f"container installs it (check --limiter-library / DRA_GPU_LIMITER_LIBRARY)",
                reason="limiter_missing",
            )
        self._files(plan, node, library)
        self._legacy_env(plan, shares, cores)

    @staticmethod
    def _files(plan: Plan, node: NodeContext, library: Path) -> None:
        claim_dir = node.claim_dir(plan.claim.uid)
        inside = container_claim_dir(plan.claim.uid)
        state, limits, preload = claim_dir / STATE_DIR, claim_dir / LIMITS_FILE, claim_dir / PRELOAD_FILE
        plan.hold("dir", f"dir:{state}", path=str(state), mode=0o777)
        plan.hold(
            "file", f"file:{limits}", path=str(limits), content=limits_text(plan, plan.limits), mode=0o444
        )
        plan.hold("file", f"file:{preload}", path=str(preload), content=CONTAINER_LIBRARY + "\n", mode=0o444)
        edits = plan.claim_edits
        edits.add_mount(library, CONTAINER_LIBRARY, ["ro", "nosuid", "nodev", "bind"])
        edits.add_mount(limits, f"{inside}/{LIMITS_FILE}", ["ro", "nosuid", "nodev", "bind"])
        edits.add_mount(state, f"{inside}/{STATE_DIR}", ["rw", "nosuid", "nodev", "bind"])
        edits.add_mount(preload, CONTAINER_PRELOAD, ["ro", "nosuid", "nodev", "bind"])

    @staticmethod
    def _legacy_env(plan: Plan, shares: list[Share], cores: dict[str, int]) -> None:
        edits = plan.claim_edits
        edits.env["LD_PRELOAD"] = CONTAINER_LIBRARY
        edits.env["DRAGPU_LIMITER_STATE_DIR"] = f"{container_claim_dir(plan.claim.uid)}/{STATE_DIR}"
        memory = {u: lim.memory for u, lim in plan.limits.items() if lim.memory is not None}
        if memory:
            edits.env["DRAGPU_MEMORY_LIMIT_BY_UUID"] = ",".join(f"{u}={b}" for u, b in memory.items())
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
