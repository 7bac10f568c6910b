"""`compute.priority`'s classes are spelled once in the driver: `limiter_abi.limits.Priority`, which the config
model, the grants, the limits file and the board take them from.

A string in `src/dra_gpu/` (docstrings and comments aside) that is a class's name, or that names two of them
(a message listing their order), is a second spelling that can drift from the first; so there is none
outside `limiter_abi/limits.py`, but for the places listed in `KNOWN` with why.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from repo_paths import ROOT

from dra_gpu.limiter_abi import board
from dra_gpu.limiter_abi.limits import PRIORITY_ORDER, Priority

SRC = ROOT / "src" / "dra_gpu"
HOME = "limiter_abi/limits.py"
NAMES = frozenset(p.value for p in Priority)
WORD = re.compile(r"[a-z]+")

KNOWN: dict[str, tuple[int, str]] = {}
"""Files that still spell the classes, how many strings each, and why; a file here must not gain one."""


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (of modules, classes, functions, attributes)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.add(id(statement.value))
    return found


def spellings(text: str) -> int:
    """Strings in a module's source that spell the priority classes by hand."""
    tree = ast.parse(text)
    skip = _docstrings(tree)
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        named = NAMES & set(WORD.findall(node.value))
        if node.value in NAMES or len(named) >= 2:
            count += 1
    return count


def hand_spellings(root: Path = SRC) -> Counter[str]:
    found: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == HOME or relative.startswith("_proto/"):
            continue
        count = spellings(path.read_text())
        if count:
            found[relative] = count
    return found


def test_the_priority_classes_are_spelled_once_in_the_driver() -> None:
    found = hand_spellings()
    known = {path: count for path, (count, _why) in KNOWN.items()}
    extra = {path: n for path, n in found.items() if n > known.get(path, 0)}
    assert extra == {}, f"spell the classes through limiter_abi.limits.Priority, not by hand: {extra}"


def test_the_board_codes_are_the_classes_in_their_order() -> None:
    assert tuple(p.value for p in Priority) == board.PRIORITIES
    assert board.Entry("uid", 1, 1).priority == Priority.STANDARD


def test_the_order_messages_show_is_lowest_first() -> None:
    assert PRIORITY_ORDER == "besteffort < standard < latency"


def test_the_scan_finds_a_name_and_a_listed_order_but_not_prose() -> None:
    assert spellings('x = "latency"\n') == 1
    assert spellings('x = f"grants ({y}; besteffort < standard < latency)"\n') == 1
    assert spellings('"""latency, standard or besteffort."""\nx = "a latency-critical claim waits"\n') == 0
