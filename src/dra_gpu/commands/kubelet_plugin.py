"""`dra-gpu kubelet-plugin`: the node agent a DaemonSet runs on every GPU node."""

from __future__ import annotations

import argparse
import logging
import re
import threading
from pathlib import Path

from dra_gpu import DRIVER_NAME
from dra_gpu.commands._exit import BAD_INPUT, fail
from dra_gpu.commands._process import stop_on_signals, wait_for_signal
from dra_gpu.config import ConfigError, NodeSharing
from dra_gpu.flags import add_bool_flag, add_flag, add_kubeconfig_flag, add_metrics_auth_flag
from dra_gpu.host.driver_root import load_nvml
from dra_gpu.host.gpu_commands import DEFAULT_MPS_SHM_BYTES
from dra_gpu.inventory import GpuInfo, InventoryError, open_inventory
from dra_gpu.inventory.capabilities import find_limit_hook
from dra_gpu.kube.client import KubeClient, KubeConfigError
from dra_gpu.node_agent import NodeAgent, NodeAgentConfig
from dra_gpu.plugin import DEFAULT_LIMITER_LIBRARY
from dra_gpu.plugin.checkpoint import CheckpointTooNew
from dra_gpu.quantity import parse_quantity, to_int

MIN_MPS_SHM_BYTES = 64 << 20
EXIT_NEWER_STATE = 3
"""Exit status when the node's state was written by a newer release (a rollback too far back)."""
POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")

NAME = "kubelet-plugin"
HELP = "run the node agent: kubelet registration, DRA prepare/unprepare, ResourceSlice publishing"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser, "--node-name", help="name of this node (the downward API's spec.nodeName)", unset="required"
    )
    add_flag(parser, "--driver-name", default=DRIVER_NAME, help="DRA driver name")
    add_flag(
        parser,
        "--registration-dir",
        default="/var/lib/kubelet/plugins_registry",
        type=Path,
        help="kubelet plugin registration directory (registration socket <dir>/<driver>-reg.sock, or "
        "<dir>/<driver>-<pod UID>-reg.sock with --pod-uid)",
    )
    add_flag(
        parser,
        "--plugins-dir",
        default="/var/lib/kubelet/plugins",
        type=Path,
        help="kubelet plugins directory (service socket <dir>/<driver>/dra.sock, or <dir>/<driver>/dra-<pod UID>.sock "
        "with --pod-uid)",
    )
    add_flag(
        parser, "--cdi-dir", default="/var/run/cdi", type=Path, help="directory for the claims' CDI specs"
    )
    add_flag(
        parser, "--state-dir", default="/var/lib/dra-gpu", type=Path, help="checkpoint and per-claim state"
    )
    add_flag(
        parser,
        "--gpu-backend",
        default="nvml",
        help="'nvml' for the node's GPUs, or 'simulated:PROFILE' (e.g. simulated:2xH100-80GB)",
    )
    add_flag(
        parser,
        "--limiter-library",
        default=str(DEFAULT_LIMITER_LIBRARY),
        type=Path,
        help="the limiter library on the host (a versioned file installed by the init container)",
    )
    add_flag(parser, "--sharing", default="*=Shared", help="per-GPU sharing modes, e.g. '*=Shared,0=MPS'")
    add_kubeconfig_flag(parser)
    add_flag(parser, "--http-address", default=":8080", help="HOST:PORT serving /healthz and /metrics")
    add_metrics_auth_flag(parser)
    add_flag(parser, "--dev-root", default="/", type=Path, help="where the host's /dev is visible, as '/'")
    add_flag(
        parser,
        "--monitor-interval",
        default=5.0,
        type=float,
        help="seconds between usage samplings and watchdog checks (0: no usage monitor)",
    )
    add_flag(
        parser,
        "--monitor-watch-interval",
        default=1.0,
        type=float,
        help="seconds between the memory watches in between samplings: each limiter claim's floor published, "
        "caps and the limiter's presence checked (at most --monitor-interval)",
    )
    add_flag(
        parser,
        "--watchdog-context-allowance",
        default="2Gi",
        help="GPU memory NVML may count per process beyond what the limiter charged (its CUDA context) before "
        "the watchdog reports MemoryOverLimit or AccountingMismatch (a quantity, e.g. 2Gi)",
    )
    add_flag(
        parser,
        "--watchdog-grace-period",
        default=10.0,
        type=float,
        help="seconds between the watchdog's SIGTERM and its SIGKILL of a process it terminates (policy "
        "Terminate); the SIGKILL comes at the first sampling after it",
    )
    add_flag(
        parser,
        "--proc-root",
        default="/proc",
        type=Path,
        help="the host's /proc (the agent runs with hostPID)",
    )
    add_flag(
        parser,
        "--cgroup-root",
        default="/sys/fs/cgroup",
        type=Path,
        help="the host's cgroup mount, where a claim over its compute ceiling has its containers frozen",
    )
    add_flag(
        parser,
        "--driver-root",
        default="/",
        type=Path,
        help="where the node's NVIDIA driver files (NVML, libcuda, nvidia-smi, MPS programs) are, as this "
        "process sees them (the DaemonSet mounts the host's root read-only there)",
    )
    add_flag(
        parser,
        "--driver-root-host-path",
        default=None,
        type=Path,
        help="the driver root as the host sees it, for the claims' CDI mounts",
        unset="--driver-root",
    )
    add_flag(
        parser,
        "--mps-shm-size",
        default=str(DEFAULT_MPS_SHM_BYTES),
        help="size of each MPS daemon's /dev/shm, a tmpfs shared by its clients (e.g. 1Gi)",
    )
    add_flag(
        parser,
        "--mps-cgroup",
        default=None,
        type=Path,
        help="cgroup-v2 directory the MPS daemons run in, so they are not charged to (or killed with) "
        "the agent's container",
        unset="the agent's own cgroup",
    )
    add_flag(
        parser,
        "--pod-uid",
        default=None,
        help="this agent's pod UID (the downward API's metadata.uid): the sockets carry it, so that two agents "
        "serve side by side during a rolling update with surge (kubelet 1.33+) and the kubelet uses the newest",
        unset="fixed socket names, one agent per node",
    )
    add_flag(
        parser,
        "--shutdown-grace-period",
        default=25.0,
        type=float,
        help="seconds the kubelet's calls in progress get to finish after SIGTERM (the registration socket is "
        "gone at once, so the kubelet sends new calls to the other agent of a rolling update)",
    )
    add_bool_flag(parser, "--publish-slices", default=True, help="publish this node's ResourceSlices")
    add_bool_flag(
        parser,
        "--mig-dynamic",
        default=False,
        help="let claims make MIG instances on this node's GPUs that are in MIG mode and have none (dynamic MIG)",
    )


def unknown_sharing_keys(sharing: NodeSharing, gpus: list[GpuInfo]) -> str:
    """What in `--sharing` names no GPU of this node ('' when all is well): a typo there would
    otherwise leave the GPU it meant in the default mode without a word."""
    known = {str(g.index) for g in gpus} | {g.uuid for g in gpus}
    missing = sorted(key for key in sharing.by_key if key not in known)
    if not missing:
        return ""
    present = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
    return f"no GPU {', '.join(missing)} on this node; its GPUs: {present}"


def _bytes(quantity: str) -> int:
    """A quantity flag's bytes (`2Gi`); -1 for what is not a quantity."""
    try:
        return to_int(parse_quantity(quantity))
    except (ValueError, ArithmeticError):
        return -1


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        return fail("--node-name (or DRA_GPU_NODE_NAME) is required")
    if args.monitor_interval < 0:
        return fail("--monitor-interval must be 0 (off) or a positive number of seconds")
    if not args.monitor_watch_interval > 0:
        return fail("--monitor-watch-interval must be a positive number of seconds")
    context_allowance = _bytes(args.watchdog_context_allowance)
    if context_allowance < 0:
        return fail(
            f"--watchdog-context-allowance {args.watchdog_context_allowance!r} must be a quantity of 0 "
            "or more (e.g. 2Gi)"
        )
    if args.pod_uid is not None and not POD_UID.fullmatch(args.pod_uid):
        return fail(
            f"--pod-uid {args.pod_uid[:80]!r} is not a pod UID (letters, digits and dashes, at most 64; "
            "set it from the downward API's metadata.uid)"
        )
    if not 0 <= args.shutdown_grace_period < float("inf"):
        return fail("--shutdown-grace-period must be 0 or a positive number of seconds")
    if not args.watchdog_grace_period >= 0 or args.watchdog_grace_period == float("inf"):
        return fail("--watchdog-grace-period must be 0 or a positive number of seconds")
    try:
        sharing = NodeSharing.parse(args.sharing)
    except ConfigError as exc:
        return fail(str(exc))
    mps_shm_bytes = _bytes(args.mps_shm_size)
    if mps_shm_bytes < MIN_MPS_SHM_BYTES:
        return fail(f"--mps-shm-size {args.mps_shm_size!r} must be a quantity of at least 64Mi (e.g. 1Gi)")
    if not args.driver_root.is_dir():
        return fail(f"--driver-root {args.driver_root} is not a directory")
    if args.gpu_backend == "nvml":
        try:
            load_nvml(args.driver_root)
        except (OSError, ImportError) as exc:
            return fail(f"cannot load NVML from the driver root {args.driver_root}: {exc}", 1)
    # The memory-limit hook runs on the host: a node where the host has none publishes `limiter`.
    limit_hook = find_limit_hook(args.driver_root, args.driver_root_host_path)
    try:
        inventory = open_inventory(
            args.gpu_backend,
            seed=args.node_name,
            hook_problem=limit_hook.problem,
            mig_dynamic=args.mig_dynamic,
        )
    except InventoryError as exc:
        # Anything but NVML failed on what was given (an unknown backend, a bad profile): bad input.
        return fail(
            f"--gpu-backend {args.gpu_backend}: {exc}", 1 if args.gpu_backend == "nvml" else BAD_INPUT
        )
    if unknown := unknown_sharing_keys(sharing, inventory.gpus()):
        inventory.close()
        return fail(f"--sharing {args.sharing!r}: {unknown}")
    try:
        api = KubeClient.from_kubeconfig(args.kubeconfig)
    except KubeConfigError as exc:
        return fail(str(exc), 1)
    config = NodeAgentConfig(
        node_name=args.node_name,
        driver_name=args.driver_name,
        registration_dir=args.registration_dir,
        plugins_dir=args.plugins_dir,
        cdi_dir=args.cdi_dir,
        state_dir=args.state_dir,
        limiter_library=args.limiter_library,
        dev_root=args.dev_root,
        http_address=args.http_address or None,
        metrics_auth=args.metrics_auth,
        monitor_interval_s=args.monitor_interval,
        monitor_watch_interval_s=args.monitor_watch_interval,
        watchdog_context_allowance=context_allowance,
        watchdog_grace_s=args.watchdog_grace_period,
        proc_root=args.proc_root,
        cgroup_root=args.cgroup_root,
        driver_root=args.driver_root,
        driver_root_host_path=args.driver_root_host_path,
        mps_shm_bytes=mps_shm_bytes,
        mps_cgroup=args.mps_cgroup,
        limit_hook=limit_hook,
        pod_uid=args.pod_uid or None,
    )
    agent = NodeAgent(config, api, inventory, sharing=sharing, publish_slices=args.publish_slices)
    # The kubelet can register and call the plugin before start() returns: a SIGTERM from then on
    # must stop it cleanly.
    with stop_on_signals(threading.Event()) as stop:
        try:
            agent.start()
        except (CheckpointTooNew, OSError, ValueError) as exc:
            inventory.close()
            status = EXIT_NEWER_STATE if isinstance(exc, CheckpointTooNew) else 1
            return fail(f"cannot start the kubelet plugin: {exc}", status)
        try:
            wait_for_signal(stop)
        finally:
            agent.stop(grace_s=args.shutdown_grace_period)
            inventory.close()
    return 0
