"""Every flag of every command has its environment variable and shows its default in `--help`.

The parsers are walked, not listed, so a flag added later is checked too. The documented exceptions
(README, "Commands"): `--help`, `--version`, the mode switches of the one-shot commands, and
`cdi-hook`, whose arguments come only from the CDI spec that the container runtime runs it with.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from repo_paths import ROOT

from dra_gpu.cli import build_parser
from dra_gpu.flags import ENV_ATTR

EXEMPT_COMMANDS = {"cdi-hook"}
MODE_SWITCHES = {"--write", "--check", "--image"}
README = ROOT / "README.md"


def commands(
    parser: argparse.ArgumentParser, path: str = "dra-gpu"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if name not in EXEMPT_COMMANDS:
                    yield from commands(child, f"{path} {name}")


def flags() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    for path, parser in commands(build_parser()):
        for action in parser._actions:
            if isinstance(
                action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
            ):
                continue
            yield path, parser, action


def long_name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


@pytest.fixture(autouse=True)
def no_flag_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [k for k in os.environ if k.startswith("DRA_GPU_")]:
        monkeypatch.delenv(name)


def test_every_flag_has_a_variable_and_shows_it_and_its_default() -> None:
    problems = []
    seen = 0
    for path, parser, action in flags():
        seen += 1
        name = f"{path} {long_name(action)}"
        if not action.option_strings:
            problems.append(f"{name}: a positional argument has no variable")
            continue
        if not hasattr(action, ENV_ATTR):
            problems.append(f"{name}: not added through dra_gpu.flags")
            continue
        variable = getattr(action, ENV_ATTR)
        if variable is None:
            if long_name(action) not in MODE_SWITCHES:
                problems.append(f"{name}: a mode switch the README does not list")
            continue
        formatter = parser._get_formatter()
        text = formatter._expand_help(action)
        if f"[env {variable}" not in text:
            problems.append(f"{name}: --help does not name {variable}")
        if "(default: " not in text:
            problems.append(f"{name}: --help does not show the default")
    assert seen > 40
    assert not problems, "\n".join(problems)


def _sample(action: argparse.Action) -> tuple[str, object]:
    """A value for the flag's variable, and what the parser must then hold."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return ("false", False) if action.default else ("true", True)
    if action.nargs is None and isinstance(action.default, list):  # a repeatable flag
        return "http://a:1/metrics,http://b:1/metrics", ["http://a:1/metrics", "http://b:1/metrics"]
    if action.choices:
        choice = list(action.choices)[-1]
        return str(choice), choice
    raw = "7" if action.type not in (None, Path) else "/from/env"
    convert: Any = action.type
    return raw, convert(raw) if convert else raw


def test_every_variable_sets_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = 0
    for path, _, action in list(flags()):
        variable = getattr(action, ENV_ATTR, None)
        if variable is None:
            continue
        raw, expected = _sample(action)
        with monkeypatch.context() as m:
            m.setenv(variable, raw)
            argv = path.split()[1:]
            args = build_parser().parse_args(argv)
        assert getattr(args, action.dest) == expected, f"{path} {long_name(action)} from {variable}={raw}"
        checked += 1
    assert checked > 40


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_OUTPUT", "json")
    assert build_parser().parse_args(["gpus", "-o", "table"]).output == "table"
    monkeypatch.setenv("DRA_GPU_METRICS_URL", "http://env:1/metrics")
    assert build_parser().parse_args(["usage"]).metrics_url == ["http://env:1/metrics"]
    args = build_parser().parse_args(
        ["usage", "--metrics-url", "http://a:1/m", "--metrics-url", "http://b:1/m"]
    )
    assert args.metrics_url == ["http://a:1/m", "http://b:1/m"]


def test_the_readme_lists_the_exceptions() -> None:
    text = " ".join(README.read_text().split())
    assert "Every flag has an environment-variable equivalent" in text
    for exception in (*sorted(MODE_SWITCHES), *sorted(EXEMPT_COMMANDS)):
        assert f"`{exception}`" in text, exception
