"""How a command ends on a problem: one line on stderr saying what to change, and its exit status."""

from __future__ import annotations

import sys

BAD_INPUT = 2
"""The exit status of a command given something it cannot use (a flag's value, a profile)."""


def fail(message: str, status: int = BAD_INPUT) -> int:
    """Print `error: <message>` on stderr; `status` for the command to return (bad input unless said)."""
    print(f"error: {message}", file=sys.stderr)
    return status
