"""The CEL environment: Kubernetes' `device` variable, quantity and semver functions, error messages."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.allocator.cel_env import (
    CelEnvironment,
    SelectorError,
    device_variable,
    quantity_value,
    split_qualified,
)

DEVICE: dict[str, Any] = {
    "name": "gpu-0",
    "allowMultipleAllocations": True,
    "attributes": {
        "index": {"int": 3},
        "healthy": {"bool": True},
        "model": {"string": "H100"},
        "driverVersion": {"version": "580.159.3"},
        "cudaComputeCapability": {"version": "9.0.0-rc.1"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
        "links": {"ints": [1, 2]},
    },
    "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}, "power": {"value": "700500m"}},
}


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


def test_device_variable_groups_by_domain_and_types_values() -> None:
    var = device_variable("gpu.dra-gpu.io", DEVICE)
    assert var["driver"] == "gpu.dra-gpu.io" and var["allowMultipleAllocations"] is True
    ours = var["attributes"]["gpu.dra-gpu.io"]
    assert (
        ours["index"] == 3 and ours["healthy"] is True and ours["model"] == "H100" and ours["links"] == [1, 2]
    )
    assert var["attributes"]["resource.kubernetes.io"] == {"pciBusID": "0000:18:00.0"}
    assert var["capacity"]["gpu.dra-gpu.io"] == {
        "memory": quantity_value("80Gi"),
        "cores": quantity_value("100"),
        "power": quantity_value("700500m"),
    }
    assert split_qualified("example.com/x", "d") == ("example.com", "x")
    assert split_qualified("x", "d") == ("d", "x")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('quantity("1Gi") == quantity("1024Mi")', True),
        ('quantity("1.5").compareTo(quantity("1500m")) == 0', True),
        ('quantity("2Gi").isGreaterThan(quantity("2G"))', True),
        ('quantity("1k").isLessThan(quantity("1Ki"))', True),
        ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
        ('quantity("1Gi").sub(1073741823) == quantity("1")', True),
        ('quantity("-5").sign() == -1', True),
        ('quantity("500m").isInteger()', False),
        ('quantity("2k").asInteger() == 2000', True),
        ('quantity("500m").asApproximateFloat() == 0.5', True),
        ('isQuantity("10Gi") && !isQuantity("ten")', True),
        ('semver("1.10.0").isGreaterThan(semver("1.9.9"))', True),
        ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
        ('semver("1.0.0-alpha.2").compareTo(semver("1.0.0-alpha.10")) < 0', True),  # numeric identifiers
        (
            'semver("2.3.4").major() == 2 && semver("2.3.4").minor() == 3 && semver("2.3.4").patch() == 4',
            True,
        ),
        ('isSemver("1.2.3+build.7") && !isSemver("v1.2.3") && !isSemver("1.02.3")', True),
        ('device.capacity["gpu.dra-gpu.io"].power.compareTo(quantity("700")) > 0', True),
        ('device.attributes["gpu.dra-gpu.io"].cudaComputeCapability.isLessThan(semver("9.0.0"))', True),
        ('2 in device.attributes["gpu.dra-gpu.io"].links', True),
        ('[1, 3, 2].max() == 3 && "a,b".split(",").size() == 2', True),
    ],
)
def test_kubernetes_library_functions(env: CelEnvironment, expression: str, expected: bool) -> None:
    assert env.matches(expression, device_variable("gpu.dra-gpu.io", DEVICE)) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('device.attributes["gpu.dra-gpu.io"].serial == "x"', "no such key: serial"),
        (
            'device.capacity["gpu.dra-gpu.io"].memory.compareTo(quantity("lots")) > 0',
            "quantity(): 'lots' is not a quantity",
        ),
        ('semver("1.2") == "1.2"', "semver(): '1.2' is not a semantic version"),
        ('quantity("500m").asInteger() == 0', "asInteger(): quantity 0.5 is not an integer"),
        ('device.attributes["gpu.dra-gpu.io"].model', None),  # a string, not a bool
    ],
)
def test_runtime_errors_say_what_went_wrong(
    env: CelEnvironment, expression: str, message: str | None
) -> None:
    with pytest.raises(SelectorError) as err:
        env.matches(expression, device_variable("gpu.dra-gpu.io", DEVICE))
    assert str(err.value).startswith(message or "expression returned str 'H100', not a bool")


def test_unknown_domains_read_as_empty_maps(env: CelEnvironment) -> None:
    var = device_variable("gpu.dra-gpu.io", DEVICE)
    assert env.matches('!has(device.attributes["other.example.com"].x)', var)
    assert env.matches("!has(device.capacity.other.x)", var)
    assert "other.example.com" not in var["attributes"]  # the device variable itself is not changed
    with pytest.raises(SelectorError, match="no such key: x"):
        env.matches('device.attributes["other.example.com"].x == 1', var)


def test_compile_errors_are_reported_once_and_cached(env: CelEnvironment) -> None:
    with pytest.raises(SelectorError, match=r"^CEL compile error: .*Syntax error"):
        env.compile("device.driver ==")
    with pytest.raises(SelectorError, match="CEL compile error"):
        env.compile("device.driver ==")
    assert env.compile("true") is env.compile("true")


OURS = 'device.attributes["gpu.dra-gpu.io"]'


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # Optional syntax, as the API server accepts it in claims (cel-go's optional library).
        (f'{OURS}.?model.orValue("none") == "H100"', True),
        (f'{OURS}.?profile.orValue("none") == "none"', True),
        (f"{OURS}.?profile.hasValue()", False),
        ('device.attributes[?"other.example.com"].?x.orValue(7) == 7', True),
        (
            f'{OURS}.?index.orValue(0) + device.capacity["gpu.dra-gpu.io"].?cores.orValue(quantity("0")).asInteger()'
            " == 103",
            True,
        ),
        ('"x.?y" == "x.?y"', True),  # inside a string literal it is text
        # Regex and strings libraries.
        (f'{OURS}.model.find("[0-9]+") == "100"', True),
        (f'{OURS}.model.find("Z") == ""', True),
        ('"a1b22c333".findAll("[0-9]+") == ["1", "22", "333"]', True),
        ('"a1b22c333".findAll("[0-9]+", 2).size() == 2', True),
        ('"%s-%d".format(["a", 1]) == "a-1"', True),
        ('"%.2f|%x|%X|%o|%b|%%".format([1.5, 255, 255, 8, 5]) == "1.50|ff|FF|10|101|%"', True),
        (f'"%s on %s".format([{OURS}.model, device.driver]) == "H100 on gpu.dra-gpu.io"', True),
        # ip and cidr libraries.
        ('ip("10.0.0.1").family() == 4 && ip("::1").family() == 6', True),
        ('ip("127.0.0.1").isLoopback() && ip("0.0.0.0").isUnspecified()', True),
        ('ip("fe80::1").isLinkLocalUnicast() && ip("8.8.8.8").isGlobalUnicast()', True),
        ('ip("2001:db8::1") == ip("2001:0db8::1")', True),
        ('isIP("10.0.0.1") && !isIP("10.0.0.256") && ip.isCanonical("2001:db8::1")', True),
        ('!ip.isCanonical("2001:0db8::1")', True),
        ('cidr("10.0.0.0/8").containsIP("10.1.2.3") && !cidr("10.0.0.0/8").containsIP(ip("11.0.0.1"))', True),
        (
            'cidr("10.0.0.0/8").containsCIDR("10.1.0.0/16") && cidr("10.1.2.3/8").masked() == cidr("10.0.0.0/8")',
            True,
        ),
        ('cidr("10.1.2.3/8").prefixLength() == 8 && cidr("10.1.2.3/8").ip() == ip("10.1.2.3")', True),
        ('isCIDR("10.0.0.0/8") && !isCIDR("10.0.0.0/33")', True),
        (f'ip({OURS}.model.find("Z") + "10.0.0.1").family() == 4', True),
        # url library (the examples of Kubernetes' urls.go).
        ('url("https://example.com:80/").getHost() == "example.com:80"', True),
        (
            'url("https://[::1]:80/").getHost() == "[::1]:80" && url("https://[::1]/").getHostname() == "::1"',
            True,
        ),
        (
            'url("https://example.com:80/").getPort() == "80" && url("https://example.com/").getPort() == ""',
            True,
        ),
        ('url("https://example.com/path with spaces/").getEscapedPath() == "/path%20with%20spaces/"', True),
        ('url("https://example.com/?k=a&k=b&kb=c").getQuery() == {"k": ["a", "b"], "kb": ["c"]}', True),
        ('url("ftp://x.example/").getScheme() == "ftp" && url("/a/b").getHostname() == ""', True),
        ('isURL("https://example.com/") && isURL("/path") && !isURL("example.com") && !isURL("")', True),
        # semver with normalize; versions compared as versions.
        ('semver("v1.2", true).major() == 1 && semver("v1.2", true).minor() == 2', True),
        ('semver("1.02.3", true) == semver("1.2.3") && isSemver("v1", true) && !isSemver("v1")', True),
        (f'{OURS}.driverVersion == semver("580.159.3")', True),
        (f'{OURS}.driverVersion.isGreaterThan(semver("580.95.5"))', True),
    ],
)
def test_the_kubernetes_cel_libraries(env: CelEnvironment, expression: str, expected: bool) -> None:
    assert env.matches(expression, device_variable("gpu.dra-gpu.io", DEVICE)) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        # Kubernetes: a version attribute is a Semver; == with a string is "no such overload".
        (
            f'{OURS}.driverVersion == "580.159.3"',
            'no such overload: attribute "gpu.dra-gpu.io/driverVersion"',
        ),
        (f'"580.159.3" != {OURS}.driverVersion', "no such overload"),
        ('"%d".format(["x"]) == ""', "format(): %d needs an integer, got str"),
        ('ip("10.0.0.1%eth0").family() == 4', "ip(): IP address with zone value is not allowed"),
        ('ip("::ffff:10.0.0.1").family() == 4', "ip(): IPv4-mapped IPv6 address is not allowed"),
        # Kubernetes: a quantity compares and adds through its methods only.
        ('quantity("1Gi") < quantity("2Gi")', "No such overload"),
        ('device.capacity["gpu.dra-gpu.io"].memory > quantity("1Gi")', "No such overload"),
        ('quantity("1Gi") + quantity("1Gi") == quantity("2Gi")', "Unsupported operation"),
    ],
)
def test_type_errors_are_kubernetes_type_errors(env: CelEnvironment, expression: str, message: str) -> None:
    with pytest.raises(SelectorError) as err:
        env.matches(expression, device_variable("gpu.dra-gpu.io", DEVICE))
    assert str(err.value).startswith(message), str(err.value)


def test_optional_syntax_this_environment_cannot_rewrite_is_refused_not_misread(env: CelEnvironment) -> None:
    with pytest.raises(
        SelectorError, match=r"CEL compile error: optional syntax .* \.orValue\(default\) or \.hasValue\(\)"
    ):
        env.compile(f'{OURS}.?model == optional.of("H100")')


def test_a_version_compared_as_an_integer_part_is_fine(env: CelEnvironment) -> None:
    var = device_variable("gpu.dra-gpu.io", DEVICE)
    assert env.matches(f"{OURS}.driverVersion.major() == 580", var)
    assert env.matches(f'{OURS}.model == "H100"', var)  # a string attribute compares as a string
