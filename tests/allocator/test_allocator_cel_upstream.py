"""Kubernetes' own DRA CEL cases (`staging/src/k8s.io/dynamic-resource-allocation/cel/compile_test.go`,
the ones a 1.36 scheduler evaluates the same way), run through the in-tree environment.

Each case is (device attributes, capacity, expression, expected match); the expressions are upstream's.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.allocator.cel_env import CelEnvironment, device_variable

DRIVER = "dra.example.com"
FULL: dict[str, Any] = {
    "attributes": {
        "bool": {"bool": True},
        "int": {"int": 1},
        "string": {"string": "fish"},
        "version": {"version": "1.0.0"},
    },
    "capacity": {"quantity": {"value": "1Mi"}},
}

CASES: list[tuple[str, dict[str, Any], str, bool]] = [
    ("true", {}, "true", True),
    (
        "version",
        {"attributes": {"name": {"version": "1.0.0"}}},
        f'device.attributes["{DRIVER}"].name.isGreaterThan(semver("0.0.1"))',
        True,
    ),
    (
        "version_v",
        {"attributes": {"name": {"version": "1.0.0"}}},
        f'device.attributes["{DRIVER}"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)',
        True,
    ),
    (
        "quantity",
        {"capacity": {"name": {"value": "1Mi"}}},
        f'device.capacity["{DRIVER}"].name.isGreaterThan(quantity("1Ki"))',
        True,
    ),
    (
        "check-positive",
        {"capacity": {"name": {"value": "1Mi"}}},
        f'"name" in device.capacity["{DRIVER}"] && device.capacity["{DRIVER}"].name.isGreaterThan(quantity("1Ki"))',
        True,
    ),
    (
        "check-negative",
        {},
        f'!("name" in device.capacity["{DRIVER}"]) || device.capacity["{DRIVER}"].name.isGreaterThan(quantity("1Ki"))',
        True,
    ),
    (
        "all",
        FULL,
        f'device.capacity["{DRIVER}"].quantity.isGreaterThan(quantity("1Ki")) && '
        f'device.attributes["{DRIVER}"].bool && device.attributes["{DRIVER}"].int > 0 && '
        f'device.attributes["{DRIVER}"].string == "fish" && '
        f'device.attributes["{DRIVER}"].version.isGreaterThan(semver("0.0.1")) && '
        f'device.capacity["{DRIVER}"]["quantity"].isGreaterThan(quantity("1Ki")) && '
        f'device.attributes["{DRIVER}"]["bool"] && device.attributes["{DRIVER}"]["int"] > 0 && '
        f'device.attributes["{DRIVER}"]["string"] == "fish" && '
        f'device.attributes["{DRIVER}"]["version"].isGreaterThan(semver("0.0.1"))',
        True,
    ),
    (
        "many",
        {"attributes": {"a": {"bool": True}, "b": {"bool": True}, "c": {"bool": True}}},
        f'device.attributes["{DRIVER}"].a && device.attributes["{DRIVER}"].b && device.attributes["{DRIVER}"].c',
        True,
    ),
    (
        "check_attribute_domains",
        {"attributes": {"services": {"string": "x"}}},
        f'device.attributes.exists_one(x, x == "{DRIVER}")',
        True,
    ),
    (
        "check_attribute_ids",
        {"attributes": {"services": {"string": "x"}}},
        f'device.attributes["{DRIVER}"].exists_one(x, x == "services")',
        True,
    ),
    (
        "split_attribute",
        {"attributes": {"services": {"string": "some_example_value"}}},
        f'device.attributes["{DRIVER}"].services.split("example").size() >= 2',
        True,
    ),
    (
        "regexp_attribute",
        {"attributes": {"services": {"string": "asymetric"}}},
        f'device.attributes["{DRIVER}"].services.matches("[^a]?sym")',
        True,
    ),
    (
        "check_capacity_domains",
        {"capacity": {"memory": {"value": "1Mi"}}},
        f'device.capacity.exists_one(x, x == "{DRIVER}")',
        True,
    ),
    (
        "check_capacity_ids",
        {"capacity": {"memory": {"value": "1Mi"}}},
        f'device.capacity["{DRIVER}"].exists_one(x, x == "memory")',
        True,
    ),
    (
        "allow_multiple_allocations",
        {"allowMultipleAllocations": True},
        "device.allowMultipleAllocations == true",
        True,
    ),
    ("allow_multiple_allocations_default", {}, "device.allowMultipleAllocations == false", True),
    ("driver", {}, f'device.driver == "{DRIVER}"', True),
    ("domain_not_found", {}, 'device.attributes["no-such-domain"].size() == 0', True),
]


@pytest.mark.parametrize(("name", "device", "expression", "expected"), CASES, ids=[c[0] for c in CASES])
def test_upstream_case(name: str, device: dict[str, Any], expression: str, expected: bool) -> None:
    assert CelEnvironment().matches(expression, device_variable(DRIVER, {"name": "d", **device})) is expected
