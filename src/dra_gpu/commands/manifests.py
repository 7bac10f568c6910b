"""`dra-gpu manifests`: render the install manifests, write them (`--write`) or check them (`--check`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dra_gpu.commands._exit import fail
from dra_gpu.flags import add_flag, add_mode_flag
from dra_gpu.manifests import ManifestError, ValuesError, image_reference, install_stream, load_values, render
from dra_gpu.manifests.render import HEADER

NAME = "manifests"
HELP = "render the install manifests from the templates and a values file; print, --write or --check them"
DEFAULT_DIR = Path("deploy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--values",
        type=Path,
        help="YAML file merged over the default values",
        unset="the default values only",
    )
    add_flag(
        parser,
        "--dir",
        env="DRA_GPU_MANIFESTS_DIR",
        type=Path,
        default=DEFAULT_DIR,
        help="manifest directory",
    )
    mode = parser.add_mutually_exclusive_group()
    add_mode_flag(mode, "--write", help="write the files into --dir, removing stale ones")
    add_mode_flag(mode, "--check", help="exit 1 if --dir differs from the rendered files")
    add_mode_flag(mode, "--image", help="print the image reference the manifests use (for building it)")


def _generated(path: Path) -> bool:
    try:
        return path.read_text().startswith(HEADER)
    except OSError:
        return False


def _stale(directory: Path, rendered: dict[str, str]) -> list[str]:
    problems = []
    for name, text in rendered.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{path} is missing")
        elif path.read_text() != text:
            problems.append(f"{path} differs")
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        if path.name not in rendered and _generated(path):
            problems.append(f"{path} is no longer generated")
    return problems


def run(args: argparse.Namespace) -> int:
    try:
        values = load_values(args.values)
        if args.image:
            print(image_reference(values))
            return 0
        rendered = render(values)
    except (ValuesError, ManifestError) as exc:
        return fail(str(exc))
    directory: Path = args.dir
    if args.check:
        problems = _stale(directory, rendered)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            given = f" --values {args.values}" if args.values else ""
            print(f"run `dra-gpu manifests{given} --dir {directory} --write`", file=sys.stderr)
            return 1
        return 0
    if args.write:
        directory.mkdir(parents=True, exist_ok=True)
        for path in directory.glob("*.yaml"):
            if path.name not in rendered and _generated(path):
                path.unlink()
        for name, text in rendered.items():
            (directory / name).write_text(text)
        return 0
    sys.stdout.write(install_stream(rendered))
    return 0
