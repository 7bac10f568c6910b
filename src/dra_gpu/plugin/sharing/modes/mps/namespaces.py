"""MPS protocol 3: one control daemon and one named server per GPU, one namespace per claim, limits server-side.

On GPUs whose driver has MPS v3 (``GpuInfo.mps_namespaces``), an MPS claim does not get
client-side limits (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` are
the tenant's to change, and a bad pinned-memory key drops every limit). Instead:

- the first MPS claim on the GPU sets exclusive-process compute mode and starts the GPU's control
  daemon with protocol 3 and one server (``gpu``) allowed only that GPU;
- each claim gets a namespace on that server, named after the claim's UID, with its
  ``active_thread_percentage`` and ``pinned_memory_limit`` always set explicitly (a namespace
  without limits would get the whole GPU);
- the claim's containers mount only their namespace's directory (``<pipe>/gpu/<namespace>``) as
  ``CUDA_MPS_PIPE_DIRECTORY``, so the namespace socket is the only MPS socket they can reach.

A client with any other pipe directory finds no MPS socket and would run without MPS; exclusive-
process compute mode is what refuses it (the GPU's one context belongs to the MPS server). The
control commands follow NVIDIA's "module verb" MPS v3 interface; their exact spelling is isolated
in ``MpsV3Control`` (see docs/memory-isolation.md for what is verified).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence, Set
from fractions import Fraction
from pathlib import Path

from dra_gpu.config import Strategy
from dra_gpu.host.gpu_commands import CommandError, ComputeMode, GpuCommands
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.modes.mps.common import (
    CLIENT_MOUNT_OPTIONS,
    CONTAINER_PIPE_DIR,
    CONTAINER_SHM_DIR,
    MIB,
    claim_limits,
    set_compute_mode,
    uses_v3,
)
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share, setup_failed

SERVER = "gpu"


def v3_dir(state_dir: Path, gpu_uuid: str) -> Path:
    return state_dir / "mps-v3" / gpu_uuid


def namespace_name(claim_uid: str) -> str:
    return f"claim-{claim_uid}"


class MpsV3Control:
    """One GPU's daemon (the pipe directory selects it), driven through the node's `GpuCommands`:
    the driver root's `nvidia-cuda-mps-control`, with the driver's libraries and tools."""

    def __init__(self, commands: GpuCommands, pipe: Path, log_dir: Path) -> None:
        self.commands = commands
        self.pipe = pipe
        self.log_dir = log_dir

    def _run(self, *args: str, gpu: str | None = None, launcher: Sequence[str] = ()) -> str:
        return self.commands.run_mps_control(
            self.pipe, self.log_dir, args, gpu=gpu, protocol="3", launcher=launcher
        )

    def running(self) -> bool:
        try:
            self._run("server", "list")
        except CommandError:
            return False
        return True

    def start(self, gpu: str, launcher: Sequence[str] = ()) -> None:
        """`launcher`: `GpuCommands.mps_launcher`, which puts the daemon outside the agent."""
        self._run("-d", "-p", "3", gpu=gpu, launcher=launcher)
        self._run("server", "create", SERVER, "--allowed-devices", gpu)

    def quit(self) -> None:
        self._run("-q")

    def namespaces(self) -> list[str]:
        return self._run("namespace", "list", SERVER).split()

    def create_namespace(self, name: str, active_thread_percentage: int, pinned_memory_mib: int) -> None:
        if name not in self.namespaces():
            self._run("namespace", "create", SERVER, name)
        self._run("namespace", "set", SERVER, name, "active_thread_percentage", str(active_thread_percentage))
        self._run("namespace", "set", SERVER, name, "pinned_memory_limit", f"{pinned_memory_mib}M")

    def delete_namespace(self, name: str) -> None:
        if name in self.namespaces():
            self._run("namespace", "delete", SERVER, name)

    def namespace_dir(self, name: str) -> Path:
        return self.pipe / SERVER / name


class MpsV3:
    name = "mps-v3"
    order = 31

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None  # the MPS backend's rules (MPS shares only beside MPS shares) cover v3 too

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        shares = [s for s in plan.sharing(Strategy.MPS) if uses_v3(s)]
        if not shares:
            return
        gpu = shares[0].gpu
        if any(s.gpu.uuid != gpu.uuid for s in plan.shares):
            raise PrepareError(
                f"claim {plan.claim.ref} asks for MPS on {shares[0].device} and has other GPUs too; a CUDA process "
                f"that connects to an MPS server sees only that server's GPU, so an MPS claim must have exactly one GPU",
                reason="invalid_config",
            )
        base = v3_dir(node.state_dir, gpu.uuid)
        cores, memory = claim_limits(plan, gpu, shares, node.driver)
        percentage = min(max(cores if cores is not None else 100, 1), 100)
        mib = max(int(Fraction(memory if memory is not None else gpu.memory_bytes, MIB)), 1)
        namespace = namespace_name(plan.claim.uid)
        plan.hold("mps-v3", f"mps-v3:{gpu.uuid}", gpu=gpu.uuid, device=shares[0].device, dir=str(base))
        plan.hold(
            "mps-v3-namespace",
            f"mps-v3-namespace:{plan.claim.uid}",
            gpu=gpu.uuid,
            dir=str(base),
            namespace=namespace,
            activeThreadPercentage=percentage,
            pinnedMemoryMiB=mib,
        )
        pipe = base / "pipe" / SERVER / namespace
        plan.claim_edits.add_mount(pipe, CONTAINER_PIPE_DIR, ["ro", *CLIENT_MOUNT_OPTIONS])
        plan.claim_edits.add_mount(base / "shm", CONTAINER_SHM_DIR, ["rw", *CLIENT_MOUNT_OPTIONS])
        plan.claim_edits.env["CUDA_MPS_PIPE_DIRECTORY"] = CONTAINER_PIPE_DIR
        for share in shares:
            plan.detail(share, "mpsNamespace", namespace)


def _control(hold: Hold, node: NodeContext) -> MpsV3Control:
    base = Path(str(hold.params["dir"]))
    return MpsV3Control(node.commands, base / "pipe", base / "log")


class MpsV3Server:
    """The GPU's control daemon (protocol 3) and its server, in exclusive-process compute mode."""

    kind = "mps-v3"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        gpu, device = str(hold.params["gpu"]), str(hold.params["device"])
        base = Path(str(hold.params["dir"]))
        control = _control(hold, node)
        try:
            for path, mode in ((base / "pipe", 0o755), (base / "log", 0o755), (base / "shm", 0o755)):
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(mode)
        except OSError as exc:
            raise setup_failed(f"creating the MPS v3 directories for GPU {device}", exc) from None
        if control.running():
            return
        try:
            set_compute_mode(node.commands, gpu, ComputeMode.EXCLUSIVE_PROCESS)
            control.start(gpu, node.commands.mps_launcher(base / "shm"))
        except CommandError as exc:
            with contextlib.suppress(CommandError):
                set_compute_mode(node.commands, gpu, ComputeMode.DEFAULT)
            raise setup_failed(f"starting the MPS v3 server of GPU {device} ({gpu})", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        if not last:
            return
        gpu, device = str(hold.params["gpu"]), str(hold.params["device"])
        control = _control(hold, node)
        try:
            if control.running():
                control.quit()
            node.commands.release_mps_shm(Path(str(hold.params["dir"])) / "shm")
            set_compute_mode(node.commands, gpu, ComputeMode.DEFAULT)
        except CommandError as exc:
            raise setup_failed(f"stopping the MPS v3 daemon of GPU {device} ({gpu})", exc) from None
        shutil.rmtree(Path(str(hold.params["dir"])), ignore_errors=True)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return _control(hold, node).running()

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        if f"{self.kind}:{gpu.uuid}" in held:
            return
        base = v3_dir(node.state_dir, gpu.uuid)
        control = MpsV3Control(node.commands, base / "pipe", base / "log")
        if base.is_dir() and control.running():
            control.quit()
            set_compute_mode(node.commands, gpu.uuid, ComputeMode.DEFAULT)
        node.commands.release_mps_shm(base / "shm")
        shutil.rmtree(base, ignore_errors=True)


class MpsV3Namespace:
    """One claim's namespace with its server-side limits."""

    kind = "mps-v3-namespace"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        name = str(hold.params["namespace"])
        try:
            _control(hold, node).create_namespace(
                name, int(hold.params["activeThreadPercentage"]), int(hold.params["pinnedMemoryMiB"])
            )
        except CommandError as exc:
            raise setup_failed(f"creating MPS namespace {name} on GPU {hold.params['gpu']}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        control = _control(hold, node)
        if not control.running():
            return  # the daemon is gone, and its namespaces with it
        try:
            control.delete_namespace(str(hold.params["namespace"]))
        except CommandError as exc:
            raise setup_failed(f"deleting MPS namespace {hold.params['namespace']}", exc) from None

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        control = _control(hold, node)
        return control.running() and str(hold.params["namespace"]) in control.namespaces()

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # a namespace goes with its server


BACKEND = MpsV3()
HOLD_HANDLERS = (MpsV3Server(), MpsV3Namespace())
