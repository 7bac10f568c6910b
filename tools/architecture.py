#!/usr/bin/env python3
"""Render docs/architecture.yaml (processes, sockets and files, and what passes between them) to
docs/architecture.md: a Mermaid flowchart, then a table of every socket and file with its path.

``python tools/architecture.py --write`` writes the page; ``--check`` exits 1 if it is not current;
``--names`` lists what the description says is in the code and exits 1 for each thing that is not.
``tests/project/test_architecture.py`` runs the same checks.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE = REPO_ROOT / "docs" / "architecture.yaml"
PAGE = REPO_ROOT / "docs" / "architecture.md"
SHAPES = {"process": ('(["', '"])'), "socket": ('{{"', '"}}'), "file": ('[("', '")]')}
"""Mermaid shapes: a process is a stadium, a socket a hexagon, a file a cylinder."""


def load(source: Path = SOURCE) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(source.read_text())
    return data


def nodes(description: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for g in description["groups"] for n in g["nodes"]]


def _mermaid_text(text: str) -> str:
    """Mermaid reads `<`/`>` as HTML, `"` as the label's end and `;` as a statement's: entity codes for
    them (`<br/>` stays)."""
    for plain, code in (("<br/>", "\0"), (";", "#59;"), ("<", "#lt;"), (">", "#gt;"), ('"', "#quot;")):
        text = text.replace(plain, code)
    return text.replace("\0", "<br/>")


def render(description: dict[str, Any]) -> str:
    lines = [
        "<!-- Made by tools/architecture.py from docs/architecture.yaml: edit that file, then run",
        "     `python tools/architecture.py --write` (a test fails while this page is not current). -->",
        f"# {description['title']}",
        "",
        description["intro"].rstrip(),
        "",
        "```mermaid",
        "flowchart LR",
    ]
    for group in description["groups"]:
        lines.append(f'  subgraph {group["id"]}["{_mermaid_text(group["label"])}"]')
        for node in group["nodes"]:
            label = node["label"]
            if "path" in node:
                label += f"<br/>{node['path']}"
            start, end = SHAPES[node["kind"]]
            lines.append(f"    {node['id']}{start}{_mermaid_text(label)}{end}")
        lines.append("  end")
    for source, target, what in description["edges"]:
        lines.append(f'  {source} -- "{_mermaid_text(what)}" --> {target}')
    lines += [
        "```",
        "",
        "| socket or file | path | in a container | read and written by |",
        "|---|---|---|---|",
    ]
    by_id = {n["id"]: n for n in nodes(description)}
    for node in nodes(description):
        if node["kind"] == "process":
            continue
        users = sorted(
            {by_id[s]["label"].split("<br/>")[0] for s, t, _ in description["edges"] if t == node["id"]}
        )
        inside = f"`{node['container']}`" if "container" in node else ""
        lines.append(f"| {node['label']} | `{node['path']}` | {inside} | {', '.join(users)} |")
    return "\n".join(lines) + "\n"


def _constant(dotted: str) -> Any:
    """`package.module.NAME` or `package.module.Class.attribute`: the value, importing the longest module."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ModuleNotFoundError(dotted)


def missing_names(description: dict[str, Any], root: Path = REPO_ROOT) -> list[str]:
    """One line for each file, constant or word the description names that the code does not have."""
    problems = []
    for node in nodes(description):
        where = node["id"]
        for path in node.get("code", []):
            if not (root / path).is_file():
                problems.append(f"{where}: no file {path}")
        for key, shown in (("const", "path"), ("container_const", "container")):
            for dotted in node.get(key, []):
                try:
                    value = str(_constant(dotted))
                except (ImportError, AttributeError) as exc:
                    problems.append(f"{where}: {dotted} is not in the code ({exc})")
                    continue
                if value not in node[shown]:
                    problems.append(f"{where}: {dotted} is {value!r}, which {node[shown]!r} does not contain")
        for path, words in node.get("text", []):
            file = root / path
            if not file.is_file() or words not in file.read_text():
                problems.append(f"{where}: {path} does not say {words!r}")
            elif words.strip('"') not in node["path"]:
                problems.append(f"{where}: {node['path']!r} does not contain {words!r}")
    ids = {n["id"] for n in nodes(description)}
    for source, target, _ in description["edges"]:
        problems += [f"edge {source} -> {target}: no node {n}" for n in (source, target) if n not in ids]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="write docs/architecture.md")
    what.add_argument("--check", action="store_true", help="exit 1 if docs/architecture.md is not current")
    what.add_argument("--names", action="store_true", help="exit 1 for each named thing the code lacks")
    args = parser.parse_args(argv)
    description = load()
    page = render(description)
    if args.write:
        PAGE.write_text(page)
        return 0
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != page:
            print(
                "docs/architecture.md is not current: run python tools/architecture.py --write",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.names:
        problems = missing_names(description)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    print(page, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
