"""Command-line flags that also read an environment variable, as Kubernetes components do.

A DaemonSet sets most knobs through `env:`; a developer passes flags. The flag wins over the variable,
the variable over the default, and `--help` shows the variable's name and the default. The only flags
without a variable are the ones that pick what a one-shot command does (`add_mode_flag`: `--write`,
`--check`), besides `--help` and `--version`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

ENV_PREFIX = "DRA_GPU_"

ENV_ATTR = "dra_gpu_env"
"""Set on every argparse action a helper here adds: its variable's name, or None for a mode flag."""


def env_name(flag: str) -> str:
    """`--node-name` -> `DRA_GPU_NODE_NAME`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


EXIT_USAGE = 2
"""Exit status for bad input, a flag's or its variable's alike (argparse uses it for flags)."""


def _invalid(variable: str, raw: str, why: object) -> SystemExit:
    """Say what to change on one line and exit 2: a bad variable is as much a usage error as a bad flag."""
    print(f"error: environment variable {variable}={raw!r} is invalid: {why}", file=sys.stderr)
    return SystemExit(EXIT_USAGE)


def _type_problem(type: Callable[[str], Any], exc: Exception) -> str:
    """What was wrong with a value, in the user's words: never a Python function's name."""
    if isinstance(exc, argparse.ArgumentTypeError):
        return str(exc)
    expected = {int: "a whole number", float: "a number"}.get(type)  # type: ignore[call-overload]
    return f"expected {expected}" if expected else str(exc)


def _help(help: str, variable: str, default_text: str) -> str:
    text = f"{help} [env {variable}]" if help else f"[env {variable}]"
    return f"{text} (default: {default_text})"


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
    unset: str = "none",
    metavar: str | None = None,
) -> None:
    """Add `flag` whose default comes from `env` (derived from the flag name when omitted).

    `unset` says in `--help` what a flag without a default does (shown as its default).
    """
    variable = env or env_name(flag)
    raw = os.environ.get(variable)
    value: Any = default
    if raw is not None and raw != "":
        try:
            value = type(raw) if type is not None else raw
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise _invalid(variable, raw, _type_problem(type, exc) if type else exc) from None
        if choices is not None and value not in choices:
            raise _invalid(variable, raw, f"choose from {', '.join(choices)}")
    names = [short, flag] if short else [flag]
    default_text = "%(default)s" if default is not None else unset
    kwargs: dict[str, Any] = {
        "default": value,
        "choices": choices,
        "help": _help(help, variable, default_text),
    }
    if type is not None:
        kwargs["type"] = type
    if metavar is not None:
        kwargs["metavar"] = metavar
    action = parser.add_argument(*names, **kwargs)
    setattr(action, ENV_ATTR, variable)


class _Append(argparse.Action):
    """`append` whose first use on the command line replaces the default (the variable's list)
    instead of adding to it: the flag wins over its variable."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, [*items, values])


def add_list_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    *,
    env: str | None = None,
    help: str = "",
    metavar: str | None = None,
) -> None:
    """A repeatable flag; its variable holds the values separated by commas. Default: empty."""
    variable = env or env_name(flag)
    raw = os.environ.get(variable) or ""
    value = [item.strip() for item in raw.split(",") if item.strip()]
    text = _help(help, variable, "none").replace(f"[env {variable}]", f"[env {variable}, comma-separated]")
    action = parser.add_argument(flag, action=_Append, default=value, metavar=metavar, help=text)
    setattr(action, ENV_ATTR, variable)


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
            raise _invalid(variable, raw, "use true or false")
    action = parser.add_argument(flag, default=value, action=argparse.BooleanOptionalAction)
    # Set after construction: Python 3.11's BooleanOptionalAction appends its own default, 3.12's not.
    action.help = _help(help, variable, "true" if default else "false")
    setattr(action, ENV_ATTR, variable)


def add_mode_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, *, help: str) -> None:
    """A switch that picks what a one-shot command does (`--write`, `--check`): no variable, off."""
    action = parser.add_argument(flag, action="store_true", help=help)
    setattr(action, ENV_ATTR, None)


def add_kubeconfig_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--kubeconfig`, for every command that talks to the API (sources: `dra_gpu.kube.kubeconfig`)."""
    add_flag(
        parser,
        "--kubeconfig",
        help="kubeconfig file",
        unset="$KUBECONFIG, then ~/.kube/config, then the in-cluster service account",
    )


def add_metrics_auth_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--metrics-auth`, for every command that serves /metrics (`http_endpoint`)."""
    add_bool_flag(
        parser,
        "--metrics-auth",
        default=True,
        help="serve /metrics only to bearer tokens the API server allows to get /metrics (TokenReview and "
        "SubjectAccessReview, as kube-rbac-proxy does); the health checks stay open",
    )
