"""Limiter: our preloaded library enforces the claim's memory budget and compute share in every process.

The library comes from a versioned file on the host (installed by the DaemonSet's init container)
and is mounted read-only; the host file ``ld.so.preload`` naming it is mounted at the container's
``/etc/ld.so.preload``, so the library loads in every process whatever the image's environment. Each
claim has its own directory in the container, ``/run/dra-gpu/claims/<claim-uid>/``, with

- ``limits``: the claim's budgets, one ``device=`` line per GPU (read-only; written by the agent
  before the CDI spec; the format is in docs/memory-isolation.md);
- ``limiter/``: the accounting state shared by all processes of all pods of the claim: a read-only
  directory holding the region file the agent made, mounted read-write (``limiter_region.py``), and,
  for each GPU where its compute share is below 100 %, its activity file, mounted read-write;
- ``/run/dra-gpu/gpus/<gpu-uuid>/``: that GPU's arbitration directory, read-only: the agent's board
  and every claim's activity file (``arbitration.py``; elastic compute),

so a container using several claims keeps every claim's limits. Budgets come from Limiter shares
(their consumed capacity, or the config where the API server has no consumable capacity) and from
other backends that pool a claim's memory (MPS, ``Plan.limit``). The spec sets no limiter
environment: variables are container-wide, so a second claim's values would overwrite the first's
(the library lets ``DRAGPU_*`` only lower a limit that a limits file sets; an image's own
``LD_PRELOAD`` is kept). ``host_environment`` gives a process outside any container (the demo,
gpu-check) the same limits through the environment, as the library reads them there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from dra_gpu.config import Strategy
from dra_gpu.limiter_abi.board import ACTIVITY_SUFFIX
from dra_gpu.limiter_abi.limits import (
    CONTAINER_CLAIMS_ROOT,
    CONTAINER_GPUS_ROOT,
    CONTAINER_LIBRARY,
    CONTAINER_PRELOAD,
    DEFAULT_PRIORITY,
    LIMITS_FILE,
    PRELOAD_FILE,
    STATE_DIR,
    DeviceLine,
    LimitsError,
    render,
)
from dra_gpu.limiter_abi.limits import (
    container_claim_dir as container_claim_dir,
)
from dra_gpu.limiter_abi.region import REGION_FILE
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing._memory import memory_share
from dra_gpu.plugin.sharing.modes import arbitration
from dra_gpu.plugin.sharing.plan import DeviceLimit, Holder, NodeContext, Plan, Share


def memory_limit(share: Share, driver: str) -> int | None:
    """The claim-wide budget is the share's ceiling (`memoryLimit`, else the request)."""
    return memory_share(share, driver).limit


def cores_limit(share: Share, driver: str) -> int | None:
    config = share.config.sharing.limiter
    return share.amount("cores", driver, config.cores if config is not None else None)


def compute_of(share: Share) -> tuple[int | None, str]:
    """The share's compute ceiling as configured (None: its floor) and its priority class."""
    config = share.config.sharing.limiter
    compute = config.compute if config is not None else None
    if compute is None:
        return None, DEFAULT_PRIORITY.value
    return compute.limit, compute.priority.value


def limits_text(plan: Plan, limits: dict[str, DeviceLimit]) -> str:
    """The claim's limits file (`limiter_abi.limits.render`), or PrepareError for what the library would
    refuse: a claim prepared with a file the library does not load would have every allocation refused."""
    claim = plan.claim
    lines = {
        uuid: DeviceLine(memory=limit.memory, cores=limit.cores, top=limit.top, priority=limit.priority)
        for uuid, limit in limits.items()
    }
    try:
        return render(claim.uid, claim.namespace, claim.name, lines)
    except LimitsError as exc:
        raise PrepareError(exc.message, reason=exc.reason) from None


def host_environment(limits_text: str, library: str, state_dir: str) -> dict[str, str]:
    """The environment that gives a process outside a container the limits of a claim's limits file.

    `library` and `state_dir` are the host paths of the library and of the claim's state directory.
    One compute share for all GPUs (the variable applies to every GPU): the smallest.
    """
    memory: list[str] = []
    cores: list[int] = []
    for line in limits_text.splitlines():
        if not line.startswith("device="):
            continue
        fields = dict(part.split("=", 1) for part in line.split())
        if fields.get("memory", "unlimited") != "unlimited":
            memory.append(f"{fields['device']}={fields['memory']}")
        cores.append(int(fields.get("cores", "100")))
    env = {"LD_PRELOAD": library, "DRAGPU_LIMITER_STATE_DIR": state_dir}
    if memory:
        env["DRAGPU_MEMORY_LIMIT_BY_UUID"] = ",".join(memory)
    if cores and min(cores) < 100:
        env["DRAGPU_CORES_LIMIT"] = str(min(cores))
    return env


def host_environment_of(mounts: Iterable[tuple[str, str]]) -> dict[str, str]:
    """`host_environment` of the claims whose files a container's mounts (container path, host path)
    bring; empty without the limiter. Several claims: their device lines together."""
    by_container = dict(mounts)
    library = by_container.get(CONTAINER_LIBRARY)
    texts: list[str] = []
    state = ""
    for container_path, host_path in by_container.items():
        if container_path.startswith(CONTAINER_CLAIMS_ROOT + "/") and container_path.endswith(
            "/" + LIMITS_FILE
        ):
            texts.append(Path(host_path).read_text(encoding="utf-8"))
            state = state or by_container.get(container_path[: -len(LIMITS_FILE)] + STATE_DIR, "")
    if library is None or not texts:
        return {}
    return host_environment("\n".join(texts), library, state)


class Limiter:
    name = "limiter"
    order = 40

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None  # limiter shares coexist with each other and with time-slicing

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        shares = plan.sharing(Strategy.LIMITER)
        for share in shares:
            cpu = cores_limit(share, node.driver)
            ceiling, priority = compute_of(share)
            floor = cpu if cpu is not None else 100
            # A class's ceiling below the floor a claim's capacity asks for is raised to it: the floor is
            # what the scheduler guaranteed (a claim's own config cannot: admission refuses it).
            plan.limit(share.gpu, memory_limit(share, node.driver), floor, ceiling, priority)
        self._one_compute_share(plan, shares)
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

    @staticmethod
    def _one_compute_share(plan: Plan, shares: list[Share]) -> None:
        """The library throttles a process on every GPU it uses to the smallest compute share of its
        claims' devices: a GPU of the claim without a Limiter share must not be slowed down to it."""
        limited = {s.gpu.uuid for s in shares}
        capped = [plan.limits[u].cores for u in limited if plan.limits[u].cores < 100]
        unlimited = [s for s in plan.shares if s.gpu.uuid not in limited]
        if capped and unlimited:
            other = unlimited[0]
            kind = "admin-access" if other.admin_access else other.strategy.value
            raise PrepareError(
                f"claim {plan.claim.ref} has a Limiter share with a compute limit of {min(capped)}% and also "
                f"{other.device} ({kind}); the limiter applies one compute limit to every GPU a process "
                f"uses, so it would throttle {other.device} too. Put the Limiter shares and the other "
                f"GPUs in separate claims",
                reason="invalid_config",
            )

    @staticmethod
    def _files(plan: Plan, node: NodeContext, library: Path) -> None:
        claim_dir = str(node.claim_dir(plan.claim.uid))
        inside = container_claim_dir(plan.claim.uid)
        state, limits = os.path.join(claim_dir, STATE_DIR), os.path.join(claim_dir, LIMITS_FILE)
        preload = os.path.join(claim_dir, PRELOAD_FILE)
        # The agent's region (limiter_region.py): the directory is read-only in the container and the file
        # a mount of its own, so a container cannot unlink, replace or add to what the claim accounts in.
        region = os.path.join(state, REGION_FILE)
        plan.hold("dir", f"dir:{state}", path=str(state), mode=0o755)
        plan.hold("region", f"region:{region}", path=str(region), gpus=",".join(plan.limits))
        plan.hold(
            "file", f"file:{limits}", path=str(limits), content=limits_text(plan, plan.limits), mode=0o444
        )
        plan.hold("file", f"file:{preload}", path=str(preload), content=CONTAINER_LIBRARY + "\n", mode=0o444)
        edits = plan.claim_edits
        edits.add_mount(library, CONTAINER_LIBRARY, ["ro", "nosuid", "nodev", "bind"])
        edits.add_mount(limits, f"{inside}/{LIMITS_FILE}", ["ro", "nosuid", "nodev", "bind"])
        edits.add_mount(state, f"{inside}/{STATE_DIR}", ["ro", "nosuid", "nodev", "bind"])
        edits.add_mount(region, f"{inside}/{STATE_DIR}/{REGION_FILE}", ["rw", "nosuid", "nodev", "bind"])
        edits.add_mount(preload, CONTAINER_PRELOAD, ["ro", "nosuid", "nodev", "bind"])
        Limiter._arbitration(plan, node, state, f"{inside}/{STATE_DIR}")

    @staticmethod
    def _arbitration(plan: Plan, node: NodeContext, state: str, inside_state: str) -> None:
        """Elastic compute: each GPU where the claim's compute share is below 100 % has it on its board.
        The GPU's directory is read-only in the container and the claim's own activity file a read-write
        mount of its own, so its processes can write that file and no other claim's, nor the board."""
        for uuid, limit in plan.limits.items():
            if limit.cores >= 100:
                continue
            # Under the GPU's lock: the board lists every claim on the GPU with the floor it was given.
            problem = arbitration.over_floors(node, uuid, plan.claim.uid, limit.cores)
            if problem is not None:
                raise PrepareError(
                    f"ResourceClaim {plan.claim.ref}: GPU {uuid}: {problem}; free a claim on it or lower "
                    f"this claim's cores",
                    reason="over_capacity",
                )
            name = uuid + ACTIVITY_SUFFIX
            link = os.path.join(state, name)
            plan.hold(
                arbitration.KIND,
                arbitration.hold_key(uuid, plan.claim.uid),
                gpu=uuid,
                claim=plan.claim.uid,
                floor=limit.cores,
                ceiling=limit.top,
                priority=limit.priority,
                link=str(link),
            )
            edits = plan.claim_edits
            edits.add_mount(
                arbitration.gpu_dir(node, uuid),
                f"{CONTAINER_GPUS_ROOT}/{uuid}",
                ["ro", "nosuid", "nodev", "bind"],
            )
            edits.add_mount(link, f"{inside_state}/{name}", ["rw", "nosuid", "nodev", "bind"])


BACKEND = Limiter()
