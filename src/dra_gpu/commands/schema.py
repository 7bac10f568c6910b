"""`dra-gpu schema`: print, write or check the GpuConfig JSON Schema generated from the models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dra_gpu.config import json_schema

NAME = "schema"
HELP = "print, write (--write) or verify (--check) the GpuConfig JSON Schema"
DEFAULT_PATH = Path("api/dra/v1alpha/gpuconfig.schema.json")


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH, help="schema file (default: %(default)s)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the schema file")
    mode.add_argument("--check", action="store_true", help="exit 1 if the schema file is stale")


def run(args: argparse.Namespace) -> int:
    text = render()
    if args.write:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(text)
        return 0
    if args.check:
        current = args.path.read_text() if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale: run `dra-gpu schema --write`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0
