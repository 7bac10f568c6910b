"""Kubernetes resource quantities ("10Gi", "30", "500m", "1.5e3") as exact numbers.

Capacities, consumed capacity and config limits all travel as quantity strings in the API;
parsing them in one place keeps rounding identical in the allocator, the slice publisher
and the kubelet plugin.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | Fraction) -> Fraction:
    """Parse a quantity exactly; raise QuantityError naming the bad text."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or integer, not {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string or integer, not {type(value).__name__}")
    m = _RE.match(value.strip())
    if not m:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. '10Gi', '512Mi', '30', '500m')")
    number, exponent, suffix = m.groups()
    base = Fraction(number)
    if exponent:
        return base * Fraction(10) ** int(exponent[1:])
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix or ""]


def to_int(value: str | int | Fraction) -> int:
    """A quantity rounded up to a whole number (bytes, percent): the API rounds up too."""
    q = parse_quantity(value)
    n = q.numerator // q.denominator
    return n if n == q else n + 1


def format_quantity(value: int | Fraction) -> str:
    """Canonical text: the largest exact binary suffix for big integers, else plain or milli."""
    q = Fraction(value)
    if q.denominator == 1:
        n = int(q)
        if n != 0 and abs(n) >= 1024:
            for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
                if n % _BINARY[suffix] == 0:
                    return f"{n // _BINARY[suffix]}{suffix}"
        return str(n)
    milli = q * 1000
    if milli.denominator == 1:
        return f"{int(milli)}m"
    return str(float(q))
