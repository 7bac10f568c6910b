"""`dra-gpu demo`: the README's first command; runs the driver end to end on this machine.

No cluster and no GPU are needed: the API server, the GPUs, nvidia-smi and the CUDA driver are
simulated, and the demo says so; everything else is the real code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dra_gpu.commands._exit import fail
from dra_gpu.demo.run import DemoError, run_demo
from dra_gpu.flags import add_bool_flag, add_flag

NAME = "demo"
HELP = "run the local demo: simulated GPUs and API server, real node agent, allocator, controller and CDI"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--limiter-build",
        env="DRA_GPU_LIMITER_BUILD",
        default=None,
        type=Path,
        help="directory of the built native limiter",
        unset="native/limiter/build when present",
    )
    add_bool_flag(parser, "--keep", help="keep the temporary files (CDI specs, checkpoint)")
    add_bool_flag(parser, "--verbose", help="show the components' own log lines")


def run(args: argparse.Namespace) -> int:
    if args.limiter_build is not None and not args.limiter_build.is_dir():
        return fail(f"--limiter-build {args.limiter_build}: not a directory")
    try:
        report = run_demo(sys.stdout, limiter_build=args.limiter_build, keep=args.keep, verbose=args.verbose)
    except DemoError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    return 1 if report.prepare_errors else 0
