"""GPU-wide settings the node agent makes, through its own `NvidiaCommands`: MPS, compute mode, time-slice.

Everything is restored afterwards (compute mode Default, time-slice Default, daemon stopped). Where
the driver refuses a command (no privileges, a GPU or virtual machine that does not allow it), the
result is a skip that quotes the driver.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from pathlib import Path
from typing import Any

from gpucheck import agent
from gpucheck.context import MIB, Context
from gpucheck.parse import int_of, key_values, smi_csv
from gpucheck.proc import Ran, background, run, which
from gpucheck.report import Result, failed, passed, skipped, verdict

# (client, active-thread percentage, pinned device memory limit)
MPS_CLIENTS = (("a", 25, 1024 * MIB), ("b", 50, 2048 * MIB))
SHM_WRAPPER = 'mount --bind "$0" /dev/shm && exec "$@"'
TIMESLICES = {"Short": 1, "Medium": 2, "Long": 3, "Default": 0}


def _commands() -> Any:
    """The agent's commands, as the agent makes them on a node with real GPUs."""
    return agent.commands().NvidiaCommands(isolate_shm=True)


DRIVER_ROOT_FILE = agent.COMMANDS.with_name("driver_root.py")
HOST_TOP = ("usr", "lib", "lib64", "bin", "sbin", "etc", "opt")
"""What the check's driver root shows of this machine's root: where the driver's files are."""


def _driver_root_module() -> Any:
    """The agent's `driver_root` module, loaded from its file as `agent.commands` is (standard library only)."""
    import importlib.util
    import sys

    name = "gpucheck_agent_driver_root"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DRIVER_ROOT_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def deployed_commands(work: Path) -> Any:
    """The agent's commands as the DaemonSet makes them: the host's root seen at a driver root other
    than / (here a directory of links to this machine's top directories), its tools run from there
    with a private directory of the driver's libraries, so the MPS daemon must find its server there."""
    root = work / "driver-root"
    root.mkdir(parents=True, exist_ok=True)
    for top in HOST_TOP:
        link = root / top
        if Path("/", top).exists() and not link.is_symlink():
            link.symlink_to(Path("/", top))
    dr = _driver_root_module()
    return agent.commands().NvidiaCommands(
        nvidia_smi=dr.tool_path(root, "nvidia-smi"),
        mps_control=dr.tool_path(root, "nvidia-cuda-mps-control"),
        tool_env=dr.tool_env(root, work / "driver-libraries"),
        isolate_shm=True,
    )


def _compute_mode(uuid: str) -> str:
    smi = which("nvidia-smi") or "nvidia-smi"
    ran = run([smi, "-i", uuid, "--query-gpu=compute_mode", "--format=csv,noheader"], timeout_s=60)
    rows = smi_csv(ran.stdout, ("compute_mode",)) if ran.ok else []
    return rows[0]["compute_mode"] if rows else f"unknown ({ran.why()})"


def refused(text: str) -> bool:
    """Whether a command's error says the driver refused it rather than that it broke."""
    lowered = text.lower()
    return any(
        s in lowered
        for s in ("insufficient permissions", "not supported", "permission denied", "operation not permitted")
    )


def _refusal(name: str, what: str, exc: Exception, **figures: Any) -> Result:
    """A skip when the driver refused (the node does not allow it), a failure when the command broke."""
    if refused(str(exc)):
        return skipped(name, f"the driver refused {what}: {exc}", **figures)
    return failed(name, f"{what} failed: {exc}", **figures)


def compute_mode(ctx: Context) -> Result:
    name = "gpu.compute-mode"
    CommandError, ComputeMode = agent.commands().CommandError, agent.commands().ComputeMode
    commands = _commands()
    before = _compute_mode(ctx.gpu.uuid)
    try:
        commands.set_compute_mode(ctx.gpu.uuid, ComputeMode.EXCLUSIVE_PROCESS)
    except CommandError as exc:
        return _refusal(name, "setting EXCLUSIVE_PROCESS", exc, before=before)
    during = _compute_mode(ctx.gpu.uuid)
    try:
        commands.set_compute_mode(ctx.gpu.uuid, ComputeMode.DEFAULT)
    except CommandError as exc:
        return failed(name, f"set EXCLUSIVE_PROCESS, then restoring DEFAULT failed: {exc}", during=during)
    after = _compute_mode(ctx.gpu.uuid)
    return verdict(
        name,
        during == "Exclusive_Process" and after == "Default",
        f"set EXCLUSIVE_PROCESS -> read back {during}; set DEFAULT -> read back {after} (was {before})",
        before=before,
        during=during,
        after=after,
    )


def timeslice(ctx: Context) -> Result:
    """`nvidia-smi compute-policy --set-timeslice` for each interval, back to Default."""
    name = "gpu.timeslice"
    CommandError = agent.commands().CommandError
    commands = _commands()
    accepted: list[str] = []
    readback: dict[str, str] = {}
    smi = which("nvidia-smi") or "nvidia-smi"
    for interval, value in TIMESLICES.items():
        try:
            commands.set_timeslice(ctx.gpu.index, value)
        except CommandError as exc:
            if accepted:
                with contextlib.suppress(CommandError):
                    commands.set_timeslice(ctx.gpu.index, TIMESLICES["Default"])
            return _refusal(name, f"--set-timeslice {value} ({interval})", exc, accepted=accepted)
        accepted.append(interval)
        listed = run([smi, "compute-policy", "-i", str(ctx.gpu.index), "-l"], timeout_s=60)
        readback[interval] = listed.stdout.strip()[-200:] if listed.ok else f"no read-back ({listed.why()})"
    return passed(
        name,
        f"accepted {', '.join(accepted)} (last Default); read-back: {readback['Default'][:60] or 'none'}",
        accepted=accepted,
        readback=readback,
    )


def _client(argv: list[str], shm: Path) -> list[str]:
    """A client as a container of an MPS claim runs: with the GPU's MPS /dev/shm."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", SHM_WRAPPER, str(shm), *argv]


def mps(ctx: Context) -> list[Result]:
    control = which("nvidia-cuda-mps-control")
    if control is None:
        return [
            skipped("mps", "nvidia-cuda-mps-control not found: the driver's MPS binaries are not installed")
        ]
    missing = ctx.missing("gc_rt_shared")
    if missing:
        return [skipped("mps", missing)]
    if which("unshare") is None:
        return [skipped("mps", "unshare not found (util-linux): clients cannot get the daemon's /dev/shm")]
    CommandError, ComputeMode = agent.commands().CommandError, agent.commands().ComputeMode
    commands = deployed_commands(ctx.work / "mps-driver-root")
    uuid = ctx.gpu.uuid
    base = ctx.work / "mps" / uuid
    pipe, log_dir, shm = base / "pipe", base / "log", base / "shm"
    for d, perm in ((pipe, 0o777), (log_dir, 0o755), (shm, 0o1777)):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(perm)
    results: list[Result] = []
    full_sms = full_sm_count(ctx)  # before the daemon: an MPS client sees only its share
    try:
        try:
            commands.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
            commands.start_mps_daemon(uuid, pipe, log_dir)
        except CommandError as exc:
            results.append(_refusal("mps.start", "starting the daemon as the agent does", exc))
        else:
            results.append(
                passed(
                    "mps.start",
                    f"daemon from the driver root {commands.mps_control} answers on its pipe; "
                    f"compute mode {_compute_mode(uuid)}",
                )
            )
            results += _mps_clients(ctx, control, pipe, shm, full_sms)
    finally:
        results.append(_stop_mps(commands, CommandError, ComputeMode, uuid, pipe))
        shutil.rmtree(base, ignore_errors=True)
    return results


def _stop_mps(commands: Any, error: Any, modes: Any, uuid: str, pipe: Path) -> Result:
    """As the agent's last MPS claim does: quit the daemon, then the default compute mode."""
    problems = []
    try:
        commands.stop_mps_daemon(uuid, pipe)
    except error as exc:
        problems.append(str(exc))
    deadline = time.monotonic() + 15
    while commands.mps_daemon_running(uuid, pipe) and time.monotonic() < deadline:
        time.sleep(0.2)  # the server exits after the daemon; the compute mode cannot change before
    if commands.mps_daemon_running(uuid, pipe):
        problems.append("the daemon still answers 15 s after quit")
    try:
        commands.set_compute_mode(uuid, modes.DEFAULT)
    except error as exc:
        problems.append(str(exc))
    mode = _compute_mode(uuid)
    return verdict(
        "mps.stop",
        not problems,
        "; ".join(problems) or f"daemon stopped; compute mode {mode}",
        compute_mode=mode,
    )


def full_sm_count(ctx: Context) -> int | None:
    """The GPU's SMs as a program outside MPS sees them: what active-thread percentages are shares of."""
    binary = ctx.program("gc_rt_shared")
    assert binary is not None
    return int_of(key_values(run([str(binary), "info"], env=ctx.base_env(), timeout_s=120).stdout), "sms")


def _mps_clients(ctx: Context, control: str, pipe: Path, shm: Path, full_sms: int | None) -> list[Result]:
    binary = ctx.program("gc_rt_shared")
    assert binary is not None
    envs = {}
    for client, percent, limit in MPS_CLIENTS:
        env = ctx.base_env()
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit // MIB}M"
        envs[client] = env
    (a, _pa, limit_a), (b, _pb, limit_b) = MPS_CLIENTS
    # Both clients hold memory at once: one daemon serves both, each under its own limit.
    with background(
        _client([str(binary), "family", "malloc", str(64 * MIB), str(2 * limit_a), "--hold"], shm),
        envs[a],
        ctx.work / "mps-a.log",
    ) as holder:
        holder.wait_for("holding", 120)
        servers = run(
            [control], env={**ctx.base_env(), "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, stdin="get_server_list\n"
        )
        second = run(
            _client([str(binary), "family", "malloc", str(64 * MIB), str(2 * limit_b)], shm),
            env=envs[b],
            timeout_s=120,
        )
        first = holder.collect(30)
    results = [judge_mps_server(servers)]
    for (client, percent, limit), ran in zip(MPS_CLIENTS, (first, second), strict=True):
        sms = run(_client([str(binary), "sms", "4096", "2000"], shm), env=envs[client], timeout_s=120)
        results.append(
            judge_mps_client(
                f"mps.client-{client}",
                percent,
                limit,
                key_values(ran.stdout),
                key_values(sms.stdout),
                [ran, sms],
                full_sms,
            )
        )
    return results


def judge_mps_server(servers: Ran) -> Result:
    """`get_server_list` while a client runs: the server PIDs it listed, or why it listed none."""
    pids = servers.stdout.split() if servers.ok else []
    if pids:
        return passed(
            "mps.server", f"the daemon lists server PID {', '.join(pids)} while a client runs", pids=pids
        )
    if not servers.ok:
        return failed("mps.server", f"get_server_list failed: {servers.why()}")
    return failed(
        "mps.server", "get_server_list listed no server while a client ran: the client did not go through MPS"
    )


def judge_mps_client(
    name: str,
    percent: int,
    limit: int,
    fill: dict[str, str],
    sms: dict[str, str],
    ran: list[Ran],
    full_sms: int | None,
) -> Result:
    """A client's memory under its pinned limit, and its SMs against `percent` of the GPU's full count.

    The client's own SM count (`sms`) is already its share: MPS gives it about `percent` % of the
    GPU's SMs (rounded to whole TPCs), and the client then fills what it sees.
    """
    allocated, used, seen = int_of(fill, "allocated"), int_of(sms, "sms_used"), int_of(sms, "sms")
    problems = []
    if allocated is None:
        problems.append("no allocation figure")
    elif allocated > limit or allocated < limit // 2:
        problems.append(f"allocated {allocated / MIB:.0f} MiB under a pinned limit of {limit / MIB:.0f} MiB")
    if used is None or seen is None:
        problems.append("no SM figure")
    elif full_sms is None:
        problems.append("no full SM count of the GPU (the info run outside MPS failed)")
    else:
        expected = full_sms * percent / 100
        if not math.floor(expected * 0.8) <= used <= math.ceil(expected) + 2:
            problems.append(
                f"{used} of the GPU's {full_sms} SMs used at {percent} % active threads "
                f"(expected about {expected:.0f}; the client saw {seen})"
            )
    bad = next((r for r in ran if not r.ok), None)
    if bad is not None:
        problems.insert(0, f"the client failed: {bad.why()}")
    result = verdict(
        name,
        not problems,
        "; ".join(problems)
        or f"{percent} % threads: {used} of the GPU's {full_sms} SMs (the client saw {seen}); "
        f"pinned {limit / MIB:.0f} MiB: allocated {allocated / MIB if allocated else 0:.0f} MiB",
        percent=percent,
        limit_bytes=limit,
        allocated=allocated,
        sms_used=used,
        sms=seen,
        gpu_sms=full_sms,
    )
    for r in ran:
        result.details += r.describe()
    return result
