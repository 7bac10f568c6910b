"""`dra-gpu cdi-hook`: the OCI hooks a claim's CDI spec runs, for the driver's memory limits.

`set-memory-limits` runs at `createRuntime`, `clear-memory-limits` at `poststop`; each reads the OCI
state from stdin (as every OCI hook does) and calls `dra_gpu.host.memory_hook`. Any failure is
one line on stderr and a non-zero exit, which makes the runtime refuse to start the container: a
workload never runs without the isolation its class promised.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dra_gpu.host.memory_hook import (
    EXIT_DRIVER,
    PROC_ROOT_ENV,
    GpuLimit,
    HookError,
    clear_recorded,
    read_state,
    set_memory_limits,
)
from dra_gpu.inventory.capabilities import cgroup_root

NAME = "cdi-hook"
HELP = "OCI hooks referenced from CDI specs (run by the container runtime, not by hand)"


def parse_limit(text: str) -> GpuLimit:
    uuid, sep, values = text.partition("=")
    soft_text, sep2, hard_text = values.partition(":")
    if not (sep and sep2 and uuid.startswith("GPU-") and soft_text.isdigit() and hard_text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected GPU-UUID=SOFT_BYTES:HARD_BYTES")
    soft, hard = int(soft_text), int(hard_text)
    if soft > hard:
        raise argparse.ArgumentTypeError(f"{text!r}: the soft limit {soft} is above the hard limit {hard}")
    return GpuLimit(uuid, soft, hard)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="hook", metavar="HOOK", required=True)
    set_parser = sub.add_parser(
        "set-memory-limits", help="createRuntime: set the GPUs' limits on the container's cgroup"
    )
    set_parser.add_argument(
        "--limit", type=parse_limit, action="append", required=True, metavar="UUID=SOFT:HARD"
    )
    clear_parser = sub.add_parser(
        "clear-memory-limits", help="poststop: clear the limits the set hook recorded"
    )
    for child in (set_parser, clear_parser):
        child.add_argument("--record-dir", type=Path, required=True, help="the claim's record directory")
        child.add_argument(
            "--cgroup-root", type=Path, default=None, help="cgroup-v2 mount (default /sys/fs/cgroup)"
        )
        child.add_argument("--proc-root", type=Path, default=None, help="procfs mount (default /proc)")


def run(args: argparse.Namespace) -> int:
    cgroups = args.cgroup_root or cgroup_root()
    proc = args.proc_root or Path(os.environ.get(PROC_ROOT_ENV) or "/proc")
    try:
        state = read_state(sys.stdin)
        if args.hook == "set-memory-limits":
            set_memory_limits(state, args.limit, args.record_dir, cgroups, proc)
            return 0
        problems = clear_recorded(args.record_dir, state["id"])
    except HookError as exc:
        print(f"dra-gpu cdi-hook {args.hook}: {exc}", file=sys.stderr)
        return exc.code
    for problem in problems:
        print(f"dra-gpu cdi-hook {args.hook}: {problem}", file=sys.stderr)
    return EXIT_DRIVER if problems else 0
