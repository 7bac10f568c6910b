"""CDI name rules as runtimes enforce them, with messages that say what to fix."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cdi.errors import CDIError
from cdi.names import (
    parse_kind,
    parse_qualified_name,
    qualified_name,
    validate_class,
    validate_device_name,
    validate_vendor,
)


@pytest.mark.parametrize(
    "qualified, parts",
    [
        ("k8s.gpu.example.com/claim=3f2a9c1e-gpu-0", ("k8s.gpu.example.com", "claim", "3f2a9c1e-gpu-0")),
        ("vendor.com/class=dev:0.1_x", ("vendor.com", "class", "dev:0.1_x")),
        ("A/b-c_d.e=Z", ("A", "b-c_d.e", "Z")),
        ("v/c=0", ("v", "c", "0")),
    ],
)
def test_parse_and_build_round_trip(qualified: str, parts: tuple[str, str, str]) -> None:
    assert parse_qualified_name(qualified) == parts
    assert qualified_name(*parts) == qualified


def test_device_name_with_a_slash_is_actionable() -> None:
    with pytest.raises(CDIError) as err:
        validate_device_name("a/b")
    msg = str(err.value)
    assert msg.startswith("CDI device name 'a/b' is invalid: ")
    assert "character '/' at position 1 is not allowed" in msg
    assert "letters, digits, '_', '-', '.' and ':'" in msg


def test_slash_in_the_name_part_of_a_qualified_name_names_the_device_name() -> None:
    with pytest.raises(CDIError, match=r"CDI device name 'claim/gpu-0' is invalid: character '/'"):
        parse_qualified_name("example.com/gpu=claim/gpu-0")


@pytest.mark.parametrize(
    "name, problem",
    [
        ("", "it is empty"),
        ("-gpu", "it starts with '-', not a letter or digit"),
        ("gpu.", "it ends with '.', not a letter or digit"),
        ("gpu 0", "character ' ' at position 3 is not allowed"),
        ("gpü", "character 'ü' at position 2 is not allowed"),
    ],
)
def test_invalid_device_names(name: str, problem: str) -> None:
    with pytest.raises(CDIError) as err:
        validate_device_name(name)
    assert f"CDI device name {name!r} is invalid: {problem}" in str(err.value)


@pytest.mark.parametrize(
    "check, what, value, problem",
    [
        (validate_vendor, "vendor", "1vendor.com", "it starts with '1', not a letter"),
        (validate_vendor, "vendor", "vendor.com-", "it ends with '-', not a letter or digit"),
        (validate_vendor, "vendor", "ven:dor", "character ':' at position 3 is not allowed"),
        (validate_vendor, "vendor", "v" * 254, "it is 254 characters long, the limit is 253"),
        (validate_class, "class", "gpu=x", "character '=' at position 3 is not allowed"),
        (validate_class, "class", "c" * 64, "it is 64 characters long, the limit is 63"),
        (validate_class, "class", "", "it is empty"),
    ],
)
def test_invalid_vendor_and_class(check: Callable[[str], None], what: str, value: str, problem: str) -> None:
    with pytest.raises(CDIError) as err:
        check(value)
    assert f"CDI {what} {value!r} is invalid: {problem}" in str(err.value)
    assert "must start with an ASCII letter" in str(err.value)


@pytest.mark.parametrize(
    "qualified, missing",
    [
        ("example.com/gpu", "the device name"),
        ("example.com/gpu=", "the device name"),
        ("gpu=0", "the vendor"),
        ("=0", "the vendor"),
        ("example.com/=0", "the class"),
    ],
)
def test_unqualified_names_say_what_is_missing(qualified: str, missing: str) -> None:
    with pytest.raises(CDIError) as err:
        parse_qualified_name(qualified)
    assert f"{qualified!r} is not a fully qualified CDI device name: missing {missing}" in str(err.value)
    assert "'<vendor>/<class>=<name>'" in str(err.value)


def test_path_like_device_is_not_qualified() -> None:
    with pytest.raises(CDIError, match=r"'/dev/nvidia0' is not a fully qualified CDI device name"):
        parse_qualified_name("/dev/nvidia0")


def test_class_containing_a_slash_is_rejected_in_qualified_names() -> None:
    with pytest.raises(CDIError, match=r"CDI class 'gpu/x' is invalid: character '/' at position 3"):
        parse_qualified_name("example.com/gpu/x=0")


def test_parse_kind() -> None:
    assert parse_kind("k8s.gpu.example.com/claim") == ("k8s.gpu.example.com", "claim")
    with pytest.raises(CDIError, match=r"CDI kind 'example.com' is invalid: expected '<vendor>/<class>'"):
        parse_kind("example.com")


def test_qualified_name_refuses_bad_parts() -> None:
    with pytest.raises(CDIError, match=r"CDI device name 'uid/0' is invalid"):
        qualified_name("example.com", "claim", "uid/0")
