"""`dra-gpu schema`: print, write or check the GpuConfig JSON Schema generated from the models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dra_gpu.config import json_schema
from dra_gpu.flags import add_flag, add_mode_flag

NAME = "schema"
HELP = "print, write (--write) or verify (--check) the GpuConfig JSON Schema"
DEFAULT_PATH = Path("api/dra/v1alpha/gpuconfig.schema.json")


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--path", env="DRA_GPU_SCHEMA_PATH", type=Path, default=DEFAULT_PATH, help="schema file")
    mode = parser.add_mutually_exclusive_group()
    add_mode_flag(mode, "--write", help="write the schema file")
    add_mode_flag(mode, "--check", help="exit 1 if the schema file is missing or stale")


def run(args: argparse.Namespace) -> int:
    text = render()
    path: Path = args.path
    if args.write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return 0
    if args.check:
        try:
            current = path.read_text()
        except FileNotFoundError:
            print(f"{path} is missing: run `dra-gpu schema --write`", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if current != text:
            print(f"{path} is stale: run `dra-gpu schema --write`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0
