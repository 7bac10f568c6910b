"""Consumable capacity: the amount one share consumes, as the Kubernetes allocator computes it."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_gpu.allocator.capacity import CapacitySpec, amount, consumption, parse_requests

GI = 2**30


def spec(**policy: object) -> CapacitySpec:
    return CapacitySpec.parse(
        "memory", {"value": "80Gi", "requestPolicy": policy} if policy else {"value": "80Gi"}
    )


@pytest.mark.parametrize(
    ("policy", "requested", "consumed"),
    [
        ({}, None, 80 * GI),  # no policy, not asked: the whole value
        ({}, "10.5Gi", Fraction(21, 2) * GI),  # no policy: as asked
        ({"default": "8Gi"}, None, 8 * GI),
        ({"default": "8Gi", "validRange": {"min": "4Gi", "step": "4Gi"}}, "5Gi", 8 * GI),
        ({"default": "8Gi", "validRange": {"min": "4Gi", "step": "4Gi"}}, "1Gi", 4 * GI),  # below min
        ({"default": "8Gi", "validRange": {"min": "4Gi"}}, "5.5Gi", Fraction(11, 2) * GI),  # no step
        ({"default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}, "10752Mi", 11 * GI),
        ({"default": "8Gi", "validRange": {"min": "500m", "step": "250m"}}, "600m", Fraction(3, 4)),
        ({"default": "20Gi", "validValues": ["10Gi", "20Gi", "40Gi"]}, "10Gi", 10 * GI),
        ({"default": "20Gi", "validValues": ["10Gi", "20Gi", "40Gi"]}, "21Gi", 40 * GI),
    ],
)
def test_consumed_amount_rounds_like_kubernetes(
    policy: dict[str, object], requested: str | None, consumed: object
) -> None:
    s = spec(**policy)
    got = s.consumed(None if requested is None else amount(requested))
    assert got == consumed
    assert s.violation(got) is None


@pytest.mark.parametrize(
    ("policy", "requested", "why"),
    [
        (
            {"default": "8Gi", "validRange": {"min": "4Gi", "max": "40Gi", "step": "4Gi"}},
            "41Gi",
            "more than the maximum 40Gi",
        ),
        (
            {"default": "20Gi", "validValues": ["10Gi", "20Gi"]},
            "30Gi",
            "larger than every valid value (10Gi, 20Gi)",
        ),
    ],
)
def test_amounts_outside_the_policy_are_refused(policy: dict[str, object], requested: str, why: str) -> None:
    s = spec(**policy)
    assert s.violation(s.consumed(amount(requested))) == why


def test_the_default_is_allowed_even_off_the_steps() -> None:
    s = spec(default="7Gi", validRange={"min": "4Gi", "step": "2Gi"})
    assert s.violation(7 * GI) is None
    assert s.violation(9 * GI) == "not 4Gi plus a multiple of 2Gi"


def test_consumption_covers_every_capacity_of_the_device() -> None:
    specs = (
        CapacitySpec.parse("cores", {"value": "100", "requestPolicy": {"default": "100"}}),
        CapacitySpec.parse("memory", {"value": "80Gi"}),
    )
    assert consumption(specs, {"memory": 10 * GI}) == (100, 10 * GI)
    assert consumption(specs, {"bandwidth": 1}) == 'has no capacity "bandwidth"'
    assert consumption(specs, {"memory": 81 * GI}) == 'capacity "memory": needs 81Gi, the device has 80Gi'


def test_bad_capacity_requests_name_the_entry() -> None:
    assert parse_requests({"memory": "10Gi", "cores": 30}, "request x") == {
        "memory": 10 * GI,
        "cores": 30,
    }
    with pytest.raises(ValueError, match=r'request x: capacity request "memory": \'1 GB\' is not a quantity'):
        parse_requests({"memory": "1 GB"}, "request x")
    with pytest.raises(ValueError, match=r'request x: capacity request "cores" is negative'):
        parse_requests({"cores": "-1"}, "request x")
