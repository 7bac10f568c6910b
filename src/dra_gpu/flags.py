"""Command-line flags that also read an environment variable, as Kubernetes components do.

A DaemonSet sets most knobs through `env:`; a developer passes flags. The flag wins over the variable,
the variable over the default, and `--help` shows the variable's name.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

ENV_PREFIX = "DRA_GPU_"


def env_name(flag: str) -> str:
    """`--node-name` -> `DRA_GPU_NODE_NAME`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    *,
    env: str | None = None,
    default: Any = None,
    help: str = "",
    type: Callable[[str], Any] | None = None,
    choices: list[str] | None = None,
    short: str | None = None,
) -> None:
    """Add `flag` whose default comes from `env` (derived from the flag name when omitted)."""
    variable = env or env_name(flag)
    raw = os.environ.get(variable)
    value: Any = default
    if raw is not None and raw != "":
        try:
            value = type(raw) if type is not None else raw
        except (TypeError, ValueError) as exc:
            raise SystemExit(f"error: environment variable {variable}={raw!r} is invalid: {exc}") from exc
        if choices is not None and value not in choices:
            raise SystemExit(
                f"error: environment variable {variable}={raw!r} is invalid: choose from {', '.join(choices)}"
            )
    names = [short, flag] if short else [flag]
    text = f"{help} [env {variable}]" if help else f"[env {variable}]"
    if default is not None:
        text += " (default: %(default)s)"
    kwargs: dict[str, Any] = {"default": value, "choices": choices, "help": text}
    if type is not None:
        kwargs["type"] = type
    parser.add_argument(*names, **kwargs)


def add_bool_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    *,
    env: str | None = None,
    default: bool = False,
    help: str = "",
) -> None:
    """A boolean flag (`--x` / `--no-x`) whose default comes from an environment variable."""
    variable = env or env_name(flag)
    raw = os.environ.get(variable)
    value = default
    if raw:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            value = True
        elif lowered in ("0", "false", "no", "off"):
            value = False
        else:
            raise SystemExit(f"error: environment variable {variable}={raw!r} is invalid: use true or false")
    parser.add_argument(
        flag, default=value, action=argparse.BooleanOptionalAction, help=f"{help} [env {variable}]"
    )
