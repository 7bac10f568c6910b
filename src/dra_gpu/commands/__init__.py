"""Subcommands of `dra-gpu`: one module each, listed in `dra_gpu.cli.COMMANDS`.

Each module defines NAME, HELP, add_arguments(parser) and run(args) -> int.
"""
