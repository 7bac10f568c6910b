"""Plain-text output shared by the commands that print for people (`demo`, `usage`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> str:
    table = [tuple(headers), *(tuple(str(c) for c in r) for r in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(indent + line for line in lines)


def share_text(consumed: Mapping[str, str] | None) -> str:
    """`10Gi memory, 30 cores`, or `whole GPU` for a device that is not shared."""
    if not consumed:
        return "whole GPU"
    order = sorted(consumed, key=lambda k: (k != "memory", k))
    return ", ".join(f"{consumed[k]} {k}" for k in order)


def gib(amount: Fraction | int) -> str:
    """Bytes as GiB with at most one decimal (`79.5 GiB`), for people rather than for the API."""
    value = f"{float(amount) / 2**30:.1f}".removesuffix(".0")
    return f"{value} GiB"
