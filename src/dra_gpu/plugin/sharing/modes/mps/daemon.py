"""MPS protocol 2: one control daemon per GPU, shared by every MPS claim on it, each claim a client with limits.

The peers start one daemon per claim, which cannot serve fractional shares of one GPU to several
claims. Here the first MPS claim on a GPU sets exclusive-process compute mode and starts the GPU's
daemon; later claims join it; the last one stops it and restores the default compute mode. The
daemon is not a child of the node agent (see ``GpuCommands.mps_launcher``): it outlives agent restarts, and the next
agent adopts it (its pipe directory answers). Its /dev/shm is a size-bounded tmpfs that only its
clients (the MPS claims on that GPU) mount; the pipe directory is root's, not world-writable, and
mounted read-only into the clients.

A claim's limits come from its consumed `cores` and `memory` capacity or, without consumable
capacity, from the config's defaults:

- memory holds claim-wide: the claim's containers get the limiter with one pooled budget (the
  claim's limits file) for all their processes, plus ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` per process;
- compute does not: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the SMs of each client process, so
  N processes of the claim may together use up to N times the share. The claim gets an event saying so.

A CUDA process talks to one daemon (one ``CUDA_MPS_PIPE_DIRECTORY``), so an MPS claim spans one GPU.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence, Set
from fractions import Fraction
from pathlib import Path

from dra_gpu.config import Strategy
from dra_gpu.config.modes import may_meet, takes_whole_gpu
from dra_gpu.host.gpu_commands import CommandError, ComputeMode
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.modes.mps.common import (
    CLIENT_MOUNT_OPTIONS,
    CONTAINER_PIPE_DIR,
    CONTAINER_SHM_DIR,
    MIB,
    USER_DETAIL,
    claim_limits,
    run_as_user,
    set_compute_mode,
    undeclared_user_notice,
    user_conflict,
    uses_v3,
)
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share, setup_failed


def mps_dir(state_dir: Path, gpu_uuid: str) -> Path:
    return state_dir / "mps" / gpu_uuid


class Mps:
    name = "mps"
    order = 30

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        mine = share.strategy.value
        shared = [o for o in others if not takes_whole_gpu(o.record.strategy)]
        apart = [o for o in shared if not may_meet(mine, o.record.strategy)]
        if share.strategy == Strategy.MPS:
            problem = user_conflict(share, shared)
            if problem is not None:
                return problem
            other = next(iter(apart), None)
            if other is not None:
                return (
                    f"GPU {share.device} ({share.gpu.uuid}) hosts a {other.record.strategy} share of claim "
                    f"{other.claim}; MPS needs the GPU in exclusive-process mode, which would lock those "
                    f"processes out. Put MPS claims on GPUs that host only MPS shares"
                )
        elif not takes_whole_gpu(share.strategy.value):
            other = next((o for o in apart if o.record.strategy == Strategy.MPS.value), None)
            if other is not None:
                return (
                    f"GPU {share.device} ({share.gpu.uuid}) runs an MPS control daemon for claim "
                    f"{other.claim} in exclusive-process mode; a {share.strategy.value} share cannot run "
                    f"beside it"
                )
        return None

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        # v2 and v3 alike: both start one server per UID (v3: `server create --uid`).
        for share in plan.sharing(Strategy.MPS):
            user = run_as_user(share)
            if user is None:
                plan.notice(undeclared_user_notice())
            else:
                plan.detail(share, USER_DETAIL, str(user))
        # GPUs with MPS v3 namespaces are served by mps.namespaces (server-side limits).
        shares = [s for s in plan.sharing(Strategy.MPS) if not uses_v3(s)]
        if not shares:
            return
        gpus: dict[str, GpuInfo] = {s.gpu.uuid: s.gpu for s in shares}
        if len(gpus) > 1:
            names = ", ".join(sorted({s.device for s in shares}))
            raise PrepareError(
                f"claim {plan.claim.ref} asks for MPS on {len(gpus)} GPUs ({names}); a CUDA process "
                f"connects to one MPS control daemon, so an MPS claim must have exactly one GPU",
                reason="invalid_config",
            )
        gpu = next(iter(gpus.values()))
        others = sorted({s.device for s in plan.shares if s.gpu.uuid != gpu.uuid})
        if others:
            # The pipe directory is claim-wide, and an MPS client sees only its daemon's GPU: the
            # claim's other GPUs would silently vanish from every container of the claim.
            names = ", ".join(others)
            raise PrepareError(
                f"claim {plan.claim.ref} asks for MPS on {shares[0].device} and also has {names}; a CUDA "
                f"process that connects to an MPS control daemon sees only that daemon's GPU, so an MPS "
                f"claim must have exactly one GPU (put the other GPUs in a claim of their own)",
                reason="invalid_config",
            )
        base = mps_dir(node.state_dir, gpu.uuid)
        plan.hold("mps", f"mps:{gpu.uuid}", gpu=gpu.uuid, device=shares[0].device, dir=str(base))
        env = plan.claim_edits.env
        plan.claim_edits.add_mount(base / "pipe", CONTAINER_PIPE_DIR, ["ro", *CLIENT_MOUNT_OPTIONS])
        plan.claim_edits.add_mount(base / "shm", CONTAINER_SHM_DIR, ["rw", *CLIENT_MOUNT_OPTIONS])
        env["CUDA_MPS_PIPE_DIRECTORY"] = CONTAINER_PIPE_DIR
        cores, memory = claim_limits(plan, gpu, shares, node.driver)
        if cores is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(max(cores, 1), 100))
        if memory is not None:
            # An MPS client sees one GPU, its daemon's: ordinal 0.
            mib = max(int(Fraction(memory, MIB)), 1)
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"


class MpsDaemon:
    """The GPU's control daemon and its exclusive-process compute mode."""

    kind = "mps"

    @staticmethod
    def _dirs(hold: Hold) -> tuple[Path, Path, Path]:
        base = Path(str(hold.params["dir"]))
        return base, base / "pipe", base / "log"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        gpu, device = str(hold.params["gpu"]), str(hold.params["device"])
        base, pipe, log_dir = self._dirs(hold)
        commands = node.commands
        try:
            for path in (pipe, log_dir, base / "shm"):
                path.mkdir(parents=True, exist_ok=True)
                # Root's: clients connect to the daemon's sockets, and may not add or remove files.
                # (The shm directory gets the tmpfs's own mode, 1777, when the daemon starts.)
                path.chmod(0o755)
        except OSError as exc:
            raise setup_failed(f"creating the MPS directories for GPU {device}", exc) from None
        if commands.mps_daemon_running(gpu, pipe):
            return
        try:
            set_compute_mode(commands, gpu, ComputeMode.EXCLUSIVE_PROCESS)
        except CommandError as exc:
            raise setup_failed(
                f"setting GPU {device} ({gpu}) to exclusive-process compute mode", exc
            ) from None
        try:
            commands.start_mps_daemon(gpu, pipe, log_dir)
        except CommandError as exc:
            with contextlib.suppress(CommandError):  # release() retries it on unprepare
                set_compute_mode(commands, gpu, ComputeMode.DEFAULT)
            raise setup_failed(
                f"the MPS control daemon for GPU {device} ({gpu}) failed to start", exc
            ) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        if not last:
            return
        gpu, device = str(hold.params["gpu"]), str(hold.params["device"])
        base, pipe, _ = self._dirs(hold)
        try:
            node.commands.stop_mps_daemon(gpu, pipe)
        except CommandError as exc:
            raise setup_failed(f"stopping the MPS control daemon of GPU {device} ({gpu})", exc) from None
        try:
            set_compute_mode(node.commands, gpu, ComputeMode.DEFAULT)
        except CommandError as exc:
            raise setup_failed(f"restoring the default compute mode of GPU {device} ({gpu})", exc) from None
        shutil.rmtree(base, ignore_errors=True)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        _, pipe, _ = self._dirs(hold)
        return node.commands.mps_daemon_running(str(hold.params["gpu"]), pipe)

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        if f"{self.kind}:{gpu.uuid}" in held:
            return
        base = mps_dir(node.state_dir, gpu.uuid)
        if base.is_dir():
            node.commands.stop_mps_daemon(gpu.uuid, base / "pipe")
            set_compute_mode(node.commands, gpu.uuid, ComputeMode.DEFAULT)
            shutil.rmtree(base, ignore_errors=True)


BACKEND = Mps()
HOLD_HANDLERS = (MpsDaemon(),)
