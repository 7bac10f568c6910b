"""`python3 -m gpucheck` (`make gpu-check`): build, find the GPU, run every check, report.

Exit status: 0 all checks passed (skips and known limits included), 1 a check failed (or, without a
GPU, a CUDA program failed to build), 2 bad usage, 77 no NVIDIA GPU here (after building the CUDA
programs, so that a GPU-less machine still proves they compile).

Environment: GPU_CHECK_OUT (report directory, default gpu-check-out), GPU_CHECK_BUILD (default
build/gpu-check), GPU_CHECK_WHEELS (bundled wheels, default .gpu-check-wheels), GPU_CHECK_GPU
(index or UUID of the GPU to check, default the first), GPU_CHECK_QUICK=1 (shorter windows),
GPU_CHECK_KEEP=1 (keep the working files: logs, kernel intervals), GPU_CHECK_FRAMEWORK_PYTHON (the
Python whose PyTorch, CuPy and JAX the workloads use, default the one running the check), NVCC
(default nvcc on PATH), GPU_CHECK_AGENT_INVENTORY (the enforcement checks' agent: `nvml`, the default,
or `checked`, the checked GPU alone, for an NVML that answers only the per-process queries).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from gpucheck import bundle
from gpucheck.build import PROGRAMS, Built, build_limiter, build_programs
from gpucheck.checks import CHECKS
from gpucheck.context import Context
from gpucheck.gpu import find_gpus, pick
from gpucheck.proc import run
from gpucheck.report import (
    EXIT_FAILED,
    EXIT_NO_GPU,
    EXIT_USAGE,
    FAIL,
    PASS,
    SKIP,
    Report,
    Result,
    exit_status,
    render_summary,
)

ROOT = Path(__file__).resolve().parent.parent


def _env_path(name: str, default: str) -> Path:
    value = Path(os.environ.get(name) or default)
    return value if value.is_absolute() else ROOT / value


def _related(name: str, wanted: str) -> bool:
    """Whether `--only wanted` selects the check or result `name` (by whole dotted parts)."""
    return name == wanted or name.startswith(wanted + ".") or wanted.startswith(name + ".")


def selects(name: str, wanted: str, checks: list[str]) -> bool:
    """Whether `--only wanted` runs the check `name`: a related check, unless a longer check name under it
    is related too (`compute.elastic.reclaim` runs `compute.elastic`, not every result of `compute`)."""
    return _related(name, wanted) and not (
        wanted.startswith(name + ".")
        and any(n.startswith(name + ".") and _related(n, wanted) for n in checks)
    )


def run_check(name: str, check: object, ctx: Context) -> list[Result]:
    """One check; whatever it raises becomes a failed result, so the next check still runs."""
    started = time.monotonic()
    try:
        produced = check(ctx)  # type: ignore[operator]
        results = produced if isinstance(produced, list) else [produced]
    except Exception as exc:
        results = [Result(name, FAIL, f"the check crashed: {type(exc).__name__}: {exc}")]
        results[0].details = traceback.format_exc().strip().splitlines()[-8:]
    elapsed = time.monotonic() - started
    for r in results:
        r.seconds = round(elapsed / len(results), 2)
    return results


def _python_environment(ctx: Context, wheels: Path) -> dict[str, object]:
    """Unpack the bundled wheels and see whether the project imports with them."""
    site = ctx.build / "site"
    unpacked = bundle.unpack(wheels, site)
    ctx.pythonpath = ([site] if unpacked else []) + [ROOT, ROOT / "src"]
    for path in reversed(ctx.pythonpath):
        sys.path.insert(0, str(path))
    probe = run(
        [ctx.python, "-c", "import dra_gpu.plugin, dra_gpu.cli, cdi.resolver"],
        env=ctx.project_env(),
        timeout_s=120,
    )
    other = bundle.foreign(unpacked)
    if other:
        print(f"gpu-check: wheels for another Python than {sys.version.split()[0]}: {', '.join(other)}")
    return {
        "python": sys.version.split()[0],
        "wheels": unpacked,
        "wheels_for_another_python": other,
        "project_importable": probe.ok,
        "import_problem": "" if probe.ok else probe.why(),
    }


def build_results(built: Built, ctx: Context) -> list[Result]:
    """What could not be built cannot be checked: on a GPU node that is a failure, not a skip."""
    out = []
    for program in PROGRAMS:
        name = f"build.{program.name}"
        if built.nvcc is None:
            out.append(Result(name, SKIP, "nvcc not found: the checks that run this program are skipped"))
        elif program.name in built.errors:
            out.append(Result(name, FAIL, built.errors[program.name]))
        elif program.name in built.lenient:
            out.append(
                Result(name, PASS, f"built only without warnings as errors: {built.lenient[program.name]}")
            )
        else:
            out.append(Result(name, PASS, str(built.programs[program.name])))
    if ctx.limiter is None:
        out.append(Result("build.limiter", FAIL, ctx.limiter_error))
    else:
        out.append(Result("build.limiter", PASS, str(ctx.limiter)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description="prove the driver on this node's GPU")
    parser.add_argument("--only", action="append", default=[], help="run only checks whose name starts so")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(name for name, _ in CHECKS))
        return 0
    unknown = [p for p in args.only if not any(_related(n, p) for n, _ in CHECKS)]
    if unknown:
        print(f"gpu-check: no check named {unknown[0]!r}; --list shows them", file=sys.stderr)
        return EXIT_USAGE

    build_dir = _env_path("GPU_CHECK_BUILD", "build/gpu-check")
    out_dir = _env_path("GPU_CHECK_OUT", "gpu-check-out")
    built = build_programs(build_dir, os.environ.get("NVCC") or None)
    if built.nvcc is None:
        print(
            "gpu-check: nvcc not found: the CUDA programs were not built (checks that need them are skipped)"
        )
    elif built.errors:
        for name, error in built.errors.items():
            print(f"gpu-check: {name}: {error}")
    else:
        print(
            f"gpu-check: built {len(built.programs)} CUDA programs with {built.nvcc} into {build_dir / 'bin'}"
        )
    for name, error in built.lenient.items():
        print(f"gpu-check: {name}: built only without warnings as errors ({error})")

    gpus, why = find_gpus()
    if not gpus:
        print(f"gpu-check: no NVIDIA GPU found ({why}): nothing to check here")
        # Building the programs is the part of the check that runs everywhere: a failure fails.
        return EXIT_FAILED if built.nvcc and built.errors else EXIT_NO_GPU
    gpu = pick(gpus, os.environ.get("GPU_CHECK_GPU", ""))
    if gpu is None:
        names = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
        print(
            f"gpu-check: GPU_CHECK_GPU={os.environ['GPU_CHECK_GPU']} names no GPU here; there are {names}",
            file=sys.stderr,
        )
        return EXIT_USAGE

    ctx = Context(
        root=ROOT,
        build=build_dir,
        out=out_dir,
        gpu=gpu,
        programs=built.programs,
        build_errors=built.errors,
        python=sys.executable,
        framework_python=os.environ.get("GPU_CHECK_FRAMEWORK_PYTHON", ""),
        quick=os.environ.get("GPU_CHECK_QUICK", "") not in ("", "0"),
    )
    report = Report(
        gpu=gpu.to_json(),
        build={"nvcc": built.nvcc, "errors": built.errors, "lenient": built.lenient, "log": built.log},
    )
    report.environment = _python_environment(ctx, _env_path("GPU_CHECK_WHEELS", ".gpu-check-wheels"))
    ctx.limiter, ctx.limiter_error = build_limiter(ROOT)
    report.build["limiter"] = str(ctx.limiter) if ctx.limiter else ctx.limiter_error
    print(f"gpu-check: checking GPU {gpu.index} {gpu.uuid} ({gpu.name}, driver {gpu.driver_version})")
    if ctx.limiter is None:
        print(f"gpu-check: {ctx.limiter_error}")
    if not report.environment["project_importable"]:
        print(f"gpu-check: the project does not import: {report.environment['import_problem']}")
    if not args.only:
        for result in build_results(built, ctx):
            report.results.append(result)
            print(f"  {result.status.upper():<5} {result.name}: {result.summary}")

    for name, check in CHECKS:
        if args.only and not any(selects(name, p, [n for n, _ in CHECKS]) for p in args.only):
            continue
        for result in run_check(name, check, ctx):
            if args.only and not any(_related(result.name, p) for p in args.only):
                continue
            report.results.append(result)
            print(f"  {result.status.upper():<5} {result.name}: {result.summary}", flush=True)
        report.write(out_dir)
    report.finished = time.time()
    if os.environ.get("GPU_CHECK_KEEP", "") in ("", "0"):
        shutil.rmtree(ctx.work, ignore_errors=True)
    else:
        print(f"gpu-check: working files kept in {ctx.work}")
    path = report.write(out_dir)
    print()
    print(render_summary(report.results))
    print(f"report: {path}")
    return exit_status(report.results)
