"""Entry point of the `dra-gpu` command: the subcommands of `dra_gpu.commands`, listed here."""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from dra_gpu import __version__
from dra_gpu.commands import (
    cdi_hook,
    controller,
    demo,
    gpus,
    kubelet_plugin,
    manifests,
    schema,
    slices,
    usage,
)
from dra_gpu.flags import add_flag
from dra_gpu.logs import setup_logging

COMMANDS: tuple[ModuleType, ...] = (
    cdi_hook,
    controller,
    demo,
    gpus,
    kubelet_plugin,
    manifests,
    schema,
    slices,
    usage,
)
"""Every subcommand, in the order `--help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-gpu",
        description="Kubernetes DRA driver that shares NVIDIA GPUs: whole, fractional with enforced "
        "memory and compute caps, time-sliced or MPS.",
    )
    parser.add_argument("--version", action="version", version=f"dra-gpu {__version__}")
    add_flag(
        parser,
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity",
    )
    add_flag(parser, "--log-format", default="text", choices=["json", "text"], help="log line format")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        child = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(child)
        child.set_defaults(_run=module.run)
    return parser


EXIT_BROKEN_PIPE = 141
"""What a shell reports for a program killed by SIGPIPE (128 + 13): `dra-gpu gpus | head`."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (a test's capture)
        pass
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    setup_logging(args.log_level, args.log_format)
    try:
        result: int = args._run(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): what it wanted it has; no traceback, nothing more to say.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    return result


if __name__ == "__main__":
    sys.exit(main())
