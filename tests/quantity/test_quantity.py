"""Kubernetes quantity parsing and formatting, checked against resource.Quantity's rules."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest

from dra_gpu.quantity import QuantityError, format_quantity, parse_quantity, to_int


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10Gi", 10 * 2**30),
        ("1.5Ki", 1536),
        ("500m", Fraction(1, 2)),
        ("1.5e3", 1500),
        ("1E", 10**18),  # a bare E is the exa suffix, not an exponent
        ("+.5", Fraction(1, 2)),
        ("-1Ki", -1024),
        ("0e999", 0),
    ],
)
def test_parses_kubernetes_forms(text: str, expected: int | Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(("text", "nanos"), [("1e-10", 1), ("-1e-10", -1), ("0.5000000001", 500000001)])
def test_precision_below_one_nano_rounds_away_from_zero_like_the_api_server(text: str, nanos: int) -> None:
    assert parse_quantity(text) == Fraction(nanos, 10**9)


@pytest.mark.parametrize("text", [" 1Gi", "1Gi ", "1\n", "\u0661Gi", "1K", "1e", "."])
def test_text_the_api_server_rejects_is_rejected(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e999999999", "-1e999999999", "1" * 70, "1e99999999999999999999"])
def test_huge_values_fail_fast_with_a_clear_message(text: str) -> None:
    # A user's claim config could carry such a value; parsing it exactly would hang the plugin.
    code = (
        "from dra_gpu.quantity import parse_quantity, QuantityError\n"
        f"try:\n    parse_quantity({text!r})\nexcept QuantityError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "is out of range" in done.stdout


def test_tiny_exponent_is_one_nano_not_a_hang() -> None:
    assert parse_quantity("1e-999999999") == Fraction(1, 10**9)


def test_to_int_rounds_up() -> None:
    assert to_int("1500m") == 2
    assert to_int("-1500m") == -1


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2048, "2Ki"),
        (1536, "1536"),
        (Fraction(3, 2), "1500m"),
        (Fraction(1, 10**6), "1u"),
        (Fraction(3, 2000), "1500u"),
        (Fraction(1, 3), "333333334n"),
        (Fraction(10**17 + 1, 10), "10000000000000000100m"),
    ],
)
def test_format_is_exact_and_parses_back(value: int | Fraction, text: str) -> None:
    assert format_quantity(value) == text
    assert parse_quantity(text) == parse_quantity(format_quantity(parse_quantity(text)))
