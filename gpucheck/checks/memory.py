"""The limiter's memory cap: precision per API, the views other tools get, the pooled budget, every family."""

from __future__ import annotations

from typing import Any

from gpucheck.context import GIB, MIB, Context
from gpucheck.parse import int_of, key_values, mib_to_bytes, smi_csv
from gpucheck.proc import Ran, background, run, which
from gpucheck.report import FAIL, KNOWN, PASS, Result, failed, judged, skipped, verdict

CHUNK = 256 * MIB
CONTEXT_ALLOWANCE = 600 * MIB
"""How far below the cap one process's usable memory may stop when its context's size is not known (a context
took 549 MB on an H100 with driver 580: native/limiter/tests/real-gpu/h100-driver-facts.txt)."""
CONTEXT_TOLERANCE = 64 * MIB
"""How far the limiter's figure for a context may differ from what NVML shows the process holding."""
FAMILY_CAP = GIB
FAMILY_CHUNK = 64 * MIB
HERE_TIMEOUT_S = 120.0

# (program, family, what it exercises)
FAMILIES = (
    ("gc_drv", "mem", "cuMemAlloc_v2"),
    ("gc_drv", "pitch", "cuMemAllocPitch_v2"),
    ("gc_drv", "managed", "cuMemAllocManaged"),
    ("gc_drv", "async", "cuMemAllocAsync (default pool)"),
    ("gc_drv", "pool", "cuMemAllocFromPoolAsync (own pool)"),
    ("gc_drv", "vmm", "cuMemCreate + cuMemMap, handle released at once"),
    ("gc_drv", "array", "cuArrayCreate_v2"),
    ("gc_drv", "graph", "graph memory node (cuGraphAddMemAllocNode)"),
    ("gc_drv", "dlsym-next", "cuMemAlloc_v2 through dlsym(RTLD_NEXT)"),
    ("gc_drv", "dlopen", "cuMemAlloc_v2 through dlopen + dlsym"),
    ("gc_drv", "getproc", "cuMemAlloc through cuGetProcAddress_v2"),
    ("gc_rt_shared", "malloc", "cudaMalloc"),
    ("gc_rt_shared", "async", "cudaMallocAsync"),
    ("gc_rt_shared", "managed", "cudaMallocManaged"),
    ("gc_rt_shared", "entry", "cuMemAlloc through cudaGetDriverEntryPointByVersion"),
    ("gc_rt_shared", "graph", "captured cudaMallocAsync (graph memory node)"),
)
OOM = ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")


def cap_for(ctx: Context) -> int:
    """A cap that is not a multiple of the chunk (so the last steps are exercised), under a quarter of the GPU."""
    return min(3000 * MIB, max(ctx.gpu.memory_bytes // 4 // MIB, 64) * MIB)


def _fill(ctx: Context, program: str, family: str, chunk: int, max_bytes: int, env: dict[str, str]) -> Ran:
    binary = ctx.program(program)
    assert binary is not None
    return run([binary, "family", family, str(chunk), str(max_bytes)], env=env, timeout_s=HERE_TIMEOUT_S)


def context_bytes(ctx: Context) -> int | None:
    """What the driver holds for a process that has a context and allocated nothing (NVML, per process).

    The goal for usable memory under a cap C is C minus this.
    """
    binary = ctx.program("gc_drv")
    if binary is None:
        return None
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    with background(
        [binary, "family", "mem", str(MIB), "0", "--hold"], ctx.base_env(), ctx.work / "ctx.log"
    ) as p:
        if not p.wait_for("holding", 60):
            return None
        try:
            return _nvml_process_memory(pynvml, ctx.gpu.uuid, p.process.pid)
        except Exception:  # an optional figure: any NVML or binding problem just leaves it out
            return None
    return None


def _nvml_process_memory(pynvml: Any, uuid: str, pid: int) -> int | None:
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        for suffix in ("_v3", "_v2", ""):  # the bindings refuse an unversioned call to another NVML
            query = getattr(pynvml, f"nvmlDeviceGetComputeRunningProcesses{suffix}", None)
            if query is None:
                continue
            try:
                processes = query(handle)
            except Exception:
                continue
            for proc in processes:
                if proc.pid == pid and isinstance(proc.usedGpuMemory, int):
                    return int(proc.usedGpuMemory)
            return None
        return None
    finally:
        pynvml.nvmlShutdown()


def cap_precision(ctx: Context) -> list[Result]:
    """Per API (driver, runtime shared, runtime static): reported total is C, usable stops at C."""
    cap = cap_for(ctx)
    context = context_bytes(ctx)
    out = []
    for program, family, label in (
        ("gc_drv", "mem", "driver-api"),
        ("gc_rt_shared", "malloc", "runtime-shared"),
        ("gc_rt_static", "malloc", "runtime-static"),
    ):
        name = f"limiter.cap.{label}"
        missing = ctx.missing(program, "limiter")
        if missing:
            out.append(skipped(name, missing))
            continue
        binary = ctx.program(program)
        assert binary is not None
        env = ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(name))
        info = run([binary, "info"], env=env, timeout_s=HERE_TIMEOUT_S)
        fill = _fill(ctx, program, family, CHUNK, 2 * cap, env)
        result = judge_cap(
            name, cap, ctx.gpu.memory_bytes, key_values(info.stdout), key_values(fill.stdout), context
        )
        if not info.ok or not fill.ok:
            result.status = FAIL
            result.summary = f"the program failed: {(info if not info.ok else fill).why()}"
        result.details += info.describe() + fill.describe()
        out.append(result)
    return out


def judge_cap(
    name: str,
    cap: int,
    physical: int,
    info: dict[str, str],
    fill: dict[str, str],
    context: int | None = None,
) -> Result:
    """Reported total exactly C; allocation refused with out-of-memory, at most C less the process's context
    (the rule of `usable`) and not far below it."""
    total, device_total = int_of(info, "total"), int_of(info, "device_total")
    allocated = int_of(fill, "allocated")
    figures = {
        "cap_bytes": cap,
        "physical_bytes": physical,
        "reported_total": total,
        "reported_free": int_of(info, "free"),
        "device_total": device_total,
        "allocated": allocated,
        "shortfall": cap - allocated if allocated is not None else None,
        "last": fill.get("last"),
        "context_bytes": context,
    }
    least, most = usable(cap, 1, context)
    problems = []
    if total != cap:
        problems.append(f"memory-info total {total} != cap {cap}")
    if device_total is not None and device_total != cap:
        problems.append(f"device total {device_total} != cap {cap}")
    if allocated is None:
        problems.append("no allocation figure")
    elif allocated > cap:
        problems.append(f"allocated {allocated / MIB:.0f} MiB > cap {cap / MIB:.0f} MiB")
    elif allocated > most:
        problems.append(
            f"context charged less than the driver took for it: {_rule_text(cap, 1, context)}, "
            f"allocated {allocated / MIB:.0f} MiB"
        )
    elif allocated < least:
        problems.append(f"allocation stopped {(cap - allocated) / MIB:.0f} MiB below the cap")
    if fill.get("last") not in OOM:
        problems.append(f"last allocation ended with {fill.get('last')}, not out-of-memory")
    return judged(
        name,
        problems,
        lambda: (
            f"total = cap {cap / MIB:.0f} MiB exactly; allocated {allocated / MIB if allocated else 0:.0f} MiB, "
            f"then {fill.get('last')}"
        ),
        **figures,
    )


def views(ctx: Context) -> list[Result]:
    """What PyTorch, NVML (in process) and nvidia-smi report under the cap."""
    cap = cap_for(ctx)
    out = []
    if ctx.limiter is None:
        return [skipped("limiter.view", ctx.missing("limiter"))]
    script = ctx.root / "gpucheck/workloads/views.py"
    for view in ("torch", "nvml"):
        name = f"limiter.view.{view}"
        env = ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(name))
        argv = [ctx.python, str(script), view] + ([str(CHUNK), str(2 * cap)] if view == "torch" else [])
        ran = run(argv, env=env, timeout_s=300)
        values = key_values(ran.stdout)
        if "skip" in values:
            out.append(skipped(name, values["skip"]))
            continue
        total, allocated = int_of(values, "total"), int_of(values, "allocated")
        ok = ran.ok and total == cap and (allocated is None or allocated <= cap)
        summary = (
            f"total {total} (cap {cap})"
            + (f", allocated {allocated / MIB:.0f} MiB" if allocated is not None else "")
            if ran.ok
            else ran.why()
        )
        result = verdict(
            name, ok, summary, cap_bytes=cap, total=total, free=int_of(values, "free"), allocated=allocated
        )
        result.details += ran.describe()
        out.append(result)
    out.append(_smi_view(ctx, cap))
    return out


def _smi_view(ctx: Context, cap: int) -> Result:
    name = "limiter.view.nvidia-smi"
    smi = which("nvidia-smi")
    if smi is None:
        return skipped(name, "nvidia-smi not found")
    env = ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(name))
    ran = run(
        [smi, "-i", ctx.gpu.uuid, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        env=env,
        timeout_s=60,
    )
    if not ran.ok:
        return failed(name, f"nvidia-smi failed: {ran.why()}")
    rows = smi_csv(ran.stdout, ("memory.total",))
    total = mib_to_bytes(rows[0]["memory.total"]) if rows else None
    if total == cap:
        return Result(name, PASS, f"nvidia-smi reports the cap {cap / MIB:.0f} MiB", {"total": total})
    return Result(
        name,
        KNOWN,
        f"nvidia-smi reports {total / MIB if total else 0:.0f} MiB, not the cap {cap / MIB:.0f} MiB: it does not "
        "go through the preloaded NVML wrappers",
        {"total": total, "cap_bytes": cap},
    )


def usable(cap: int, processes: int, context: int | None) -> tuple[int, int]:
    """What N processes of a claim of C bytes can allocate together, as (least, most).

    The rule (native/limiter/README.md): each process's context is charged what the driver took for it, so
    N processes can allocate C - N x context. The fill stops one chunk short at worst; the limiter's view of a
    context may differ a little from NVML's. Where the context's size is not known, up to CONTEXT_ALLOWANCE
    a process.
    """
    if context is None:
        return cap - processes * CONTEXT_ALLOWANCE - CHUNK, cap
    expected = cap - processes * context
    return expected - CHUNK - processes * CONTEXT_TOLERANCE, min(
        cap, expected + processes * CONTEXT_TOLERANCE
    )


def pooled(ctx: Context) -> Result:
    """Two processes of one claim (one state directory) together stop at the cap, less their contexts."""
    name = "limiter.pooled"
    missing = ctx.missing("gc_drv", "limiter")
    if missing:
        return skipped(name, missing)
    binary = ctx.program("gc_drv")
    assert binary is not None
    cap = cap_for(ctx)
    context = context_bytes(ctx)
    env = ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(name))
    first_share = cap // 2 // (64 * MIB) * 64 * MIB
    with background(
        [binary, "family", "mem", str(64 * MIB), str(first_share), "--hold"], env, ctx.work / "pooled-a.log"
    ) as holder:
        if not holder.wait_for("holding", 120):
            return failed(name, f"the first process did not start holding: {holder.text()[-300:]}")
        second = _fill(ctx, "gc_drv", "mem", CHUNK, 2 * cap, env)
        first = holder.collect(30)
    return judge_pooled(
        name,
        cap,
        key_values(first.stdout),
        key_values(second.stdout),
        first.describe() + second.describe(),
        context,
    )


def _rule_text(cap: int, processes: int, context: int | None) -> str:
    least, most = usable(cap, processes, context)
    if context is None:
        return f"expected {least / MIB:.0f}-{most / MIB:.0f} MiB (context size unknown)"
    return (
        f"expected {cap / MIB:.0f} - {processes} x {context / MIB:.0f} MiB context = "
        f"{(cap - processes * context) / MIB:.0f} MiB"
    )


def judge_pooled(
    name: str,
    cap: int,
    first: dict[str, str],
    second: dict[str, str],
    details: list[str],
    context: int | None = None,
) -> Result:
    a, b = int_of(first, "allocated"), int_of(second, "allocated")
    if a is None or b is None:
        result = failed(name, "a process printed no allocation figure")
    else:
        together = a + b
        least, most = usable(cap, 2, context)
        ok = least <= together <= most and second.get("last") in OOM
        result = verdict(
            name,
            ok,
            f"{a / MIB:.0f} + {b / MIB:.0f} = {together / MIB:.0f} MiB of a {cap / MIB:.0f} MiB cap, "
            f"then {second.get('last')}; {_rule_text(cap, 2, context)}",
            cap_bytes=cap,
            first=a,
            second=b,
            together=together,
            context_bytes=context,
            second_sees_total=int_of(second, "after_total"),
        )
    result.details += details
    return result


def shared(ctx: Context) -> list[Result]:
    """Memory one process of a claim shares with another (legacy IPC, a VMM descriptor) is charged once."""
    out = []
    context = None
    for kind in ("ipc", "vmm"):
        name = f"limiter.shared.{kind}"
        missing = ctx.missing("gc_drv", "limiter")
        if missing:
            out.append(skipped(name, missing))
            continue
        binary = ctx.program("gc_drv")
        assert binary is not None
        if context is None:
            context = context_bytes(ctx)
        cap = cap_for(ctx)
        share = cap // 2 // (64 * MIB) * 64 * MIB
        env = ctx.limiter_env(memory=cap, state_dir=ctx.state_dir(name))
        ran = run([binary, "share", kind, str(share), str(CHUNK)], env=env, timeout_s=HERE_TIMEOUT_S)
        result = judge_shared(name, kind, cap, key_values(ran.stdout), ran.ok, ran.why(), context)
        result.details += ran.describe()
        out.append(result)
    return out


def judge_shared(
    name: str,
    kind: str,
    cap: int,
    values: dict[str, str],
    ran_ok: bool,
    why: str,
    context: int | None = None,
) -> Result:
    """Two processes (exporter, importer) fill the cap less their contexts, the shared memory counted once."""
    shared_bytes, allocated = int_of(values, "shared"), int_of(values, "allocated")
    figures = {
        "cap_bytes": cap,
        "shared": shared_bytes,
        "second_allocated": allocated,
        "context_bytes": context,
        "kcmp": values.get("kcmp"),
    }
    if "setup_error" in values:
        error = values["setup_error"]
        return (skipped if _unsupported(error) else failed)(
            name, f"sharing failed to start: {error}", **figures
        )
    if not ran_ok or shared_bytes is None or values.get("child_status") != "0":
        return failed(name, f"the programs failed: {why}", **figures)
    if values.get("opened") != "CUDA_SUCCESS":
        return failed(
            name, f"the claim's second process could not open the memory: {values.get('opened')}", **figures
        )
    if allocated is None:
        return failed(name, "the second process printed no allocation figure", **figures)
    together = shared_bytes + allocated
    least, most = usable(cap, 2, context)
    text = (
        f"{shared_bytes / MIB:.0f} MiB shared + {allocated / MIB:.0f} MiB more = {together / MIB:.0f} MiB "
        f"of a {cap / MIB:.0f} MiB cap, then {values.get('last')}; {_rule_text(cap, 2, context)}"
    )
    if together > cap:
        return failed(name, f"over the cap: {text}", **figures)
    if least <= together <= most and values.get("last") in OOM:
        return Result(name, PASS, f"{text}: charged once", figures)
    if together > most:
        return failed(name, f"contexts charged less than the driver took for them: {text}", **figures)
    if together + shared_bytes <= most:  # the shared memory counted a second time
        if kind == "vmm" and values.get("kcmp") == "0":
            return Result(
                name,
                KNOWN,
                f"{text}: charged to both processes, as documented where kcmp is not allowed (seccomp)",
                figures,
            )
        return failed(name, f"charged twice: {text}", **figures)
    return failed(name, f"stopped below the rule: {text}", **figures)


def families(ctx: Context) -> list[Result]:
    out = []
    for program, family, what in FAMILIES:
        name = f"limiter.family.{'driver' if program == 'gc_drv' else 'runtime'}.{family}"
        missing = ctx.missing(program, "limiter")
        if missing:
            out.append(skipped(name, missing))
            continue
        env = ctx.limiter_env(memory=FAMILY_CAP, state_dir=ctx.state_dir(name))
        ran = _fill(ctx, program, family, FAMILY_CHUNK, 2 * FAMILY_CAP, env)
        result = judge_family(name, what, family, key_values(ran.stdout), ran)
        out.append(result)
    return out


def _unsupported(error: str) -> bool:
    return "NOT_SUPPORTED" in error or "NotSupported" in error


def judge_family(name: str, what: str, family: str, values: dict[str, str], ran: Ran) -> Result:
    allocated = int_of(values, "allocated")
    figures = {"cap_bytes": FAMILY_CAP, "allocated": allocated, "last": values.get("last"), "what": what}
    if "setup_error" in values:
        error = values["setup_error"]
        result = (skipped if _unsupported(error) else failed)(
            name, f"{what}: setup failed with {error}", **figures
        )
    elif allocated == 0 and _unsupported(str(values.get("last"))):
        result = skipped(name, f"{what}: not supported here ({values.get('last')})", **figures)
    elif not ran.ok or allocated is None:
        result = failed(name, f"{what}: {ran.why()}", **figures)
    else:
        held = allocated <= FAMILY_CAP and values.get("last") in OOM
        text = f"{what}: {allocated / MIB:.0f} MiB under a {FAMILY_CAP / MIB:.0f} MiB cap, then {values.get('last')}"
        if held:
            result = Result(name, PASS, text, figures)
        else:
            result = failed(name, f"not enforced: {text}", **figures)
    result.details += ran.describe()
    return result
