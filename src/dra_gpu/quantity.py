"""Kubernetes resource quantities ("10Gi", "30", "500m", "1.5e3") as exact numbers.

Capacities, consumed capacity and config limits all travel as quantity strings in the API;
parsing them in one place keeps rounding identical in the allocator, the slice publisher
and the kubelet plugin.
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_RE = re.compile(
    r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)", re.ASCII
)
_ONE_NANO = Decimal("1e-9")
MAX_DIGITS = 64
"""Quantities are refused from 1e64 up: no real capacity is near that, and an exponent such as
``1e999999999`` would otherwise make an exact parse compute a number gigabytes long."""
_CONTEXT = decimal.Context(
    prec=MAX_DIGITS + 40, rounding=decimal.ROUND_UP, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN
)
"""ROUND_UP (away from zero) at every step, so the final rounding to 1n matches Kubernetes'."""


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
    m = _RE.fullmatch(value)
    if not m:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. '10Gi', '512Mi', '30', '500m')")
    number, exponent, suffix = m.groups()
    # Decimal keeps a huge or tiny exponent symbolic, so "1e999999999" costs nothing to read.
    power = (exponent or "e")[1:]
    digits = power.lstrip("+-").lstrip("0")
    if len(digits) > 10 or int(digits or 0) > 2**31 - (power[:1] != "-"):  # Kubernetes: an int32
        raise QuantityError(f"{value!r} is out of range: the exponent must fit in 32 bits")
    with decimal.localcontext(_CONTEXT) as ctx:
        amount = Decimal(number + (exponent or ""))
        if suffix in _BINARY:
            amount = ctx.multiply(amount, _BINARY[suffix])
        elif suffix:
            amount = ctx.scaleb(amount, _DECIMAL_EXPONENT[suffix])
        if amount.is_zero():
            return Fraction(0)
        if amount.adjusted() >= MAX_DIGITS:
            raise QuantityError(f"{value!r} is out of range: quantities must be below 1e{MAX_DIGITS}")
        # Like resource.Quantity: nano precision, any rest rounded away from zero (up to 1n at least).
        return Fraction(amount.quantize(_ONE_NANO))


def to_int(value: str | int | Fraction) -> int:
    """A quantity rounded up to a whole number (bytes, percent): the API rounds up too."""
    q = parse_quantity(value)
    n = q.numerator // q.denominator
    return n if n == q else n + 1


def format_quantity(value: int | Fraction) -> str:
    """Canonical text: the largest exact binary suffix for big integers, else plain, m, u or n."""
    q = Fraction(value)
    if q.denominator == 1:
        n = int(q)
        if n != 0 and abs(n) >= 1024:
            for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
                if n % _BINARY[suffix] == 0:
                    return f"{n // _BINARY[suffix]}{suffix}"
        return str(n)
    for suffix, factor in (("m", 10**3), ("u", 10**6), ("n", 10**9)):
        scaled = q * factor
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    # Finer than Kubernetes can hold: round away from zero to 1n, as the API server would.
    nanos = q * 10**9
    sign = -1 if nanos < 0 else 1
    return f"{sign * -(-abs(nanos.numerator) // nanos.denominator)}n"
