"""Subcommands of `dra-gpu`: one module each, discovered by `dra_gpu.cli`.

Each module defines NAME, HELP, add_arguments(parser) and run(args) -> int, so adding a command
means adding a module, not editing a central table.
"""
