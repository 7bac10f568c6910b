"""`-o json` and `-o yaml` for every command that prints data: the same document in either form."""

from __future__ import annotations

import json
from typing import Any

import yaml

OUTPUTS = ("table", "json", "yaml")
"""The `--output` choices of a command that prints a table by default."""


def dump(fmt: str, data: Any) -> str:
    """`data` as `fmt` (json or yaml), ending in a newline; keys keep their order in both."""
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return json.dumps(data, indent=2) + "\n"
