"""CEL device selectors evaluated the way Kubernetes evaluates them.

Kubernetes compiles DeviceClass and request selectors with cel-go; here the `cel` package from PyPI
(`common-expression-language`) runs them against the same `device` variable:

- `device.driver` (string), `device.allowMultipleAllocations` (bool);
- `device.attributes[domain].name`: `int`, `bool`, `string` as themselves, `version` as its string
  (so `==` works; ordering needs `semver(...)` functions below), list forms as lists;
- `device.capacity[domain].name`: the capacity as a quantity (below).

Unqualified attribute and capacity names belong to the driver's domain, as in Kubernetes. A domain the
device does not have reads as an empty map (Kubernetes does the same), so `has(...)` guards work;
a missing key is a runtime error ("no such key"), which the allocator reports like Kubernetes does.

Supported Kubernetes library functions (besides CEL's built-ins and the `cel.stdlib` extensions:
strings, lists, sets, math, base64, `min`/`max`/`sum`):

- quantity: `quantity(s)`, `isQuantity(s)`, `q.compareTo(q2)`, `q.isGreaterThan(q2)`,
  `q.isLessThan(q2)`, `q.add(q2|int)`, `q.sub(q2|int)`, `q.sign()`, `q.isInteger()`,
  `q.asInteger()`, `q.asApproximateFloat()`. A quantity is a value of its own type (a one-key map holding
  its amount), so `==` compares amounts (`quantity("1Gi") == quantity("1024Mi")`) and, as in Kubernetes,
  `<`, `>=` or `+` on quantities are refused: they compare and add through their methods only.
- semver: `semver(s)`, `semver(s, normalize)` (`v1.2` -> `1.2.0`), `isSemver(s[, normalize])`,
  `v.major()`, `v.minor()`, `v.patch()`, and `compareTo`, `isGreaterThan`, `isLessThan` between two
  versions (semver 2.0 precedence). A `version` attribute is a Semver in Kubernetes: `==`/`!=` against
  anything but another version is "no such overload" there (the scheduler aborts the claim), and is
  refused the same way here rather than compared as a string.
- regex: `s.find(re)`, `s.findAll(re[, n])` (besides CEL's `matches`).
- strings: `fmt.format([args])` with `%s %d %f %e %b %o %x %X %%` (and a precision, `%.2f`).
- ip/cidr: `ip(s)`, `isIP(s)`, `ip.isCanonical(s)`, `.family()`, `.isUnspecified()`, `.isLoopback()`,
  `.isLinkLocalMulticast()`, `.isLinkLocalUnicast()`, `.isGlobalUnicast()`; `cidr(s)`, `isCIDR(s)`,
  `.containsIP(ip|s)`, `.containsCIDR(cidr|s)`, `.ip()`, `.masked()`, `.prefixLength()`. An address or
  a network is a one-key map holding its canonical text, so `==` compares them as Kubernetes does.
- optional syntax, which the `cel` package does not parse: `x.?f` and `x[?k]` chains ending in
  `.orValue(d)` or `.hasValue()` are rewritten to `has(x.f) ? x.f : d` / `k in x ? x[k] : d` before
  compiling; any other use of it is a compile error that says so, never a different evaluation.

- url: `url(s)` (an absolute URI or an absolute path, as Go's `url.ParseRequestURI`), `isURL(s)`,
  `.getScheme()`, `.getHost()` (with the port; IPv6 in brackets), `.getHostname()`, `.getPort()`,
  `.getEscapedPath()`, `.getQuery()` (a map of lists). A URL is a one-key map holding its text.

Not supported: cost limits (the API server already rejected over-expensive
expressions); an expression using them is refused with "undefined function".

Longer than 500 lines: the Kubernetes CEL libraries, each function small, share the conversions of values and
make up one environment; split, each part would import all the others.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import cel
from cel.stdlib import add_stdlib_to_context

from dra_gpu.kube import objects
from dra_gpu.quantity import QuantityError, parse_quantity

Number = int | float

_I64_MAX = 2**63 - 1


class SelectorError(Exception):
    """A selector that cannot be compiled or that failed while evaluating one device."""


def split_qualified(name: str, driver: str) -> tuple[str, str]:
    """(domain, identifier) of an attribute or capacity name; bare names are in the driver's domain."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


_QUANTITY = "quantity@"


def quantity_number(value: str | int | Fraction) -> Number:
    """A quantity's amount: an int when whole and within int64, else a double."""
    q = parse_quantity(value)
    if q.denominator == 1 and -_I64_MAX <= q.numerator <= _I64_MAX:
        return int(q.numerator)
    return float(q)


def quantity_value(value: str | int | Fraction) -> dict[str, Number]:
    """A quantity as CEL sees it: a value of its own type, a one-key map holding its amount, so that `==`
    compares amounts (`quantity("1Gi") == quantity("1024Mi")`) and `<` or `+` on it are "no such overload",
    as in Kubernetes, where only its methods compare and add."""
    return {_QUANTITY: quantity_number(value)}


def _attribute_value(attr: Mapping[str, Any]) -> Any:
    for key in ("int", "bool", "string", "version"):
        if key in attr:
            return attr[key]
    for key in ("ints", "bools", "strings", "versions"):
        if key in attr:
            return list(attr[key])
    return None


VERSIONS_KEY = "versions@"
"""Key of the device variable naming its `version` attributes (not an identifier: CEL never reads it)."""


def device_variable(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The `device` variable for one ResourceSlice device (v1 JSON shape)."""
    attributes: dict[str, dict[str, Any]] = {}
    versions: set[tuple[str, str]] = set()
    for name, attr in (device.get("attributes") or {}).items():
        domain, ident = split_qualified(name, driver)
        value = _attribute_value(attr or {})
        if value is not None:
            attributes.setdefault(domain, {})[ident] = value
        if "version" in (attr or {}):
            versions.add((domain, ident))
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in objects.device_capacity(device).items():
        domain, ident = split_qualified(name, driver)
        capacity.setdefault(domain, {})[ident] = quantity_value((cap or {}).get("value", 0))
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
        VERSIONS_KEY: frozenset(versions),
    }


# --- semver ---------------------------------------------------------------------------------------

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _semver_parts(text: Any) -> tuple[int, int, int, str | None]:
    m = _SEMVER.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a semantic version (expected e.g. '1.2.3')")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)


def _semver_key(text: str) -> tuple[Any, ...]:
    major, minor, patch, pre = _semver_parts(text)
    if pre is None:
        return (major, minor, patch, 1, ())
    idents = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (major, minor, patch, 0, idents)


def _normalize(text: Any) -> Any:
    """Kubernetes' semver normalize: no `v` prefix, missing minor/patch as 0, no leading zeros."""
    if not isinstance(text, str):
        return text
    core, sep, rest = _split_core(text.removeprefix("v"))
    parts = core.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return text
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + sep + rest


def _split_core(text: str) -> tuple[str, str, str]:
    m = re.search(r"[-+]", text)
    return (text, "", "") if m is None else (text[: m.start()], m.group(), text[m.end() :])


def _semver(text: Any, normalize: bool = False) -> str:
    if normalize:
        text = _normalize(text)
    _semver_parts(text)
    return str(text)


def _is_semver(text: Any, normalize: bool = False) -> bool:
    try:
        _semver(text, normalize)
    except ValueError:
        return False
    return True


# --- quantity -------------------------------------------------------------------------------------


def _quantity(text: Any) -> dict[str, Number]:
    if not isinstance(text, str):
        raise ValueError(f"quantity() needs a string, got {text!r}")
    try:
        return quantity_value(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def _is_quantity(text: Any) -> bool:
    try:
        _quantity(text)
    except ValueError:
        return False
    return True


def _number(value: Any) -> Number:
    """A quantity's amount; an `add`/`sub` argument may also be an int, as in Kubernetes."""
    if isinstance(value, dict) and _QUANTITY in value:
        return value[_QUANTITY]  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a quantity, got {value!r}")
    return value


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, str) and isinstance(b, str):
        ka, kb = _semver_key(a), _semver_key(b)
        return (ka > kb) - (ka < kb)
    x, y = _number(a), _number(b)
    return (x > y) - (x < y)


def _as_integer(value: Any) -> int:
    x = _number(value)
    if isinstance(x, float):
        if not x.is_integer():
            raise ValueError(f"quantity {x} is not an integer")
        return int(x)
    return x


# --- regex, strings, ip/cidr -----------------------------------------------------------------------


def _regex(pattern: Any) -> re.Pattern[str]:
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


def _find(text: Any, pattern: Any) -> str:
    m = _regex(pattern).search(_string(text))
    return m.group(0) if m else ""


def _find_all(text: Any, pattern: Any, limit: int = -1) -> list[str]:
    found = [m.group(0) for m in _regex(pattern).finditer(_string(text))]
    return found if limit < 0 else found[:limit]


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"no such overload: expected a string, got {type(value).__name__}")
    return value


_FORMAT = re.compile(r"%(?:\.(\d+))?([sdfebox%X])")


def _format(template: Any, args: Any) -> str:
    """Kubernetes' strings.format: each verb takes the next argument, of the type the verb needs."""
    values = list(args) if isinstance(args, list) else None
    if values is None:
        raise ValueError("no such overload: format() takes a list of arguments")
    out: list[str] = []
    last = 0
    for m in _FORMAT.finditer(_string(template)):
        out.append(template[last : m.start()])
        last = m.end()
        precision, verb = m.group(1), m.group(2)
        if verb == "%":
            out.append("%")
            continue
        if not values:
            raise ValueError(f"missing argument for %{verb}")
        value = values.pop(0)
        out.append(_format_one(verb, precision, value))
    out.append(template[last:])
    return "".join(out)


def _format_one(verb: str, precision: str | None, value: Any) -> str:
    if verb == "s":
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value) if not isinstance(value, (list, dict)) else _list_text(value)
    if isinstance(value, bool):
        raise ValueError(f"%{verb} does not take a bool")
    if verb in "fe":
        if not isinstance(value, (int, float)):
            raise ValueError(f"%{verb} needs a number, got {type(value).__name__}")
        digits = 6 if precision is None else int(precision)
        return f"{float(value):.{digits}{verb}}"
    if not isinstance(value, int):
        raise ValueError(f"%{verb} needs an integer, got {type(value).__name__}")
    return {"d": str(value), "b": f"{value:b}", "o": f"{value:o}", "x": f"{value:x}", "X": f"{value:X}"}[verb]


def _list_text(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_format_one("s", None, v) for v in value) + "]"
    return (
        "{"
        + ", ".join(f"{_format_one('s', None, k)}: {_format_one('s', None, v)}" for k, v in value.items())
        + "}"
    )


_IP, _CIDR = "ip@", "cidr@"


def _address(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(value, dict) and _IP in value:
        return ipaddress.ip_address(value[_IP])
    text = _string(value)
    if "%" in text:
        raise ValueError(f"IP address with zone value is not allowed: {text!r}")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"IP Address {text!r} parse error during conversion from string") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text!r}")
    return address


def _network(value: Any) -> tuple[Any, int]:
    """(address as written, prefix) of a CIDR; the address need not be the network's first."""
    if isinstance(value, dict) and _CIDR in value:
        value = value[_CIDR]
    text = _string(value)
    address, sep, prefix = text.partition("/")
    if not sep or not prefix.isdigit():
        raise ValueError(f"network address parse error during conversion from string: {text!r}")
    ip = _address(address)
    if int(prefix) > ip.max_prefixlen:
        raise ValueError(f"network address parse error during conversion from string: {text!r}")
    return ip, int(prefix)


def _ip(value: Any) -> dict[str, str]:
    if isinstance(value, dict) and _CIDR in value:  # cidr.ip(): the address as written
        return {_IP: str(_network(value)[0])}
    return {_IP: str(_address(value))}


def _cidr(value: Any) -> dict[str, str]:
    ip, prefix = _network(value)
    return {_CIDR: f"{ip}/{prefix}"}


def _valid(fn: Callable[[Any], Any]) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        try:
            fn(value)
        except ValueError:
            return False
        return True

    return check


def _contains_ip(network: Any, address: Any) -> bool:
    ip, prefix = _network(network)
    return _address(address) in ipaddress.ip_network(f"{ip}/{prefix}", strict=False)


def _contains_cidr(network: Any, other: Any) -> bool:
    ip, prefix = _network(network)
    other_ip, other_prefix = _network(other)
    outer = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    inner = ipaddress.ip_network(f"{other_ip}/{other_prefix}", strict=False)
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


def _masked(network: Any) -> dict[str, str]:
    ip, prefix = _network(network)
    return {_CIDR: str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))}


# --- url (Kubernetes' `k8s.io/apiserver/pkg/cel/library/urls.go`) ------------------------------------

_URL = "url@"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _url(value: Any) -> dict[str, str]:
    """Go's `url.ParseRequestURI`, as `url()` parses: an absolute URI (with a scheme) or an absolute path."""
    if isinstance(value, dict) and _URL in value:
        return value
    text = str(value)
    if not (text.startswith("/") or _SCHEME.match(text)) or any(
        ord(c) < 0x20 or ord(c) == 0x7F for c in text
    ):
        raise ValueError(f"URL parse error during conversion from string: {text!r}")
    return {_URL: text}


def _split(value: Any) -> urllib.parse.SplitResult:
    text = _url(value)[_URL]
    return urllib.parse.urlsplit(text.split("#", 1)[0])


def _host(value: Any) -> str:
    return _split(value).netloc.rpartition("@")[2]


def _hostname(value: Any) -> str:
    host = _host(value)
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rpartition(":")[0] if ":" in host else host


def _port(value: Any) -> str:
    host = _host(value)
    tail = host[host.find("]") + 1 :] if host.startswith("[") else host
    return tail.rpartition(":")[2] if ":" in tail else ""


def _query(value: Any) -> dict[str, list[str]]:
    query: dict[str, list[str]] = {}
    for key, item in urllib.parse.parse_qsl(_split(value).query, keep_blank_values=True):
        query.setdefault(key, []).append(item)
    return query


def _functions() -> dict[str, Callable[..., Any]]:
    return {
        "quantity": _quantity,
        "isQuantity": _is_quantity,
        "compareTo": _compare,
        "isGreaterThan": lambda a, b: _compare(a, b) > 0,
        "isLessThan": lambda a, b: _compare(a, b) < 0,
        "add": lambda a, b: {_QUANTITY: _number(a) + _number(b)},
        "sub": lambda a, b: {_QUANTITY: _number(a) - _number(b)},
        "sign": lambda a: (_number(a) > 0) - (_number(a) < 0),
        "isInteger": lambda a: isinstance(_number(a), int) or float(_number(a)).is_integer(),
        "asInteger": _as_integer,
        "asApproximateFloat": lambda a: float(_number(a)),
        "semver": _semver,
        "isSemver": _is_semver,
        "major": lambda v: _semver_parts(v)[0],
        "minor": lambda v: _semver_parts(v)[1],
        "patch": lambda v: _semver_parts(v)[2],
        "find": _find,
        "findAll": _find_all,
        "format": _format,
        "ip": _ip,
        "isIP": _valid(_address),
        "ip.isCanonical": lambda s: str(_address(s)) == s,
        "family": lambda a: _address(a).version,
        "isUnspecified": lambda a: _address(a).is_unspecified,
        "isLoopback": lambda a: _address(a).is_loopback,
        "isLinkLocalMulticast": lambda a: _link_local_multicast(_address(a)),
        "isLinkLocalUnicast": lambda a: _address(a).is_link_local,
        "isGlobalUnicast": lambda a: _global_unicast(_address(a)),
        "cidr": _cidr,
        "isCIDR": _valid(_network),
        "containsIP": _contains_ip,
        "containsCIDR": _contains_cidr,
        "prefixLength": lambda n: _network(n)[1],
        "masked": _masked,
        "url": _url,
        "isURL": _valid(_url),
        "getScheme": lambda u: _split(u).scheme,
        "getHost": _host,
        "getHostname": _hostname,
        "getPort": _port,
        "getEscapedPath": lambda u: urllib.parse.quote(
            urllib.parse.unquote(_split(u).path), safe="/:@!$&'()*+,;=-._~"
        ),
        "getQuery": _query,
    }


def _link_local_multicast(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if address.version == 4:
        return address in ipaddress.ip_network("224.0.0.0/24")
    return address in ipaddress.ip_network("ff02::/16")


def _global_unicast(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Go's net.IP.IsGlobalUnicast: not unspecified, loopback, multicast, link-local or broadcast."""
    broadcast = address.version == 4 and str(address) == "255.255.255.255"
    return not (
        address.is_unspecified
        or address.is_loopback
        or address.is_multicast
        or address.is_link_local
        or broadcast
    )


def kubernetes_context() -> Any:
    """A `cel.Context` with CEL's extensions and the Kubernetes functions above (no variables yet)."""
    context = cel.Context()
    add_stdlib_to_context(context)
    for name, fn in _functions().items():
        context.add_function(name, fn)
    return context


# --- optional syntax ------------------------------------------------------------------------------


class OptionalSyntaxError(ValueError):
    """Optional syntax this environment cannot rewrite into plain CEL."""


_OPEN = {"(": ")", "[": "]", "{": "}"}


def _skip_string(text: str, i: int) -> int:
    """Index after the string literal starting at `i`."""
    quote = text[i]
    i += 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _group_end(text: str, i: int) -> int:
    """Index after the bracket group opening at `i`."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _skip_string(text, i)
            continue
        if c in _OPEN:
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise OptionalSyntaxError("unbalanced brackets")


def _group_start(text: str, end: int) -> int:
    """Index of the bracket opening the group that closes at `end - 1` (strings inside are skipped)."""
    i = 0
    stack: list[int] = []
    while i < end:
        c = text[i]
        if c in "\"'":
            i = _skip_string(text, i)
            continue
        if c in _OPEN:
            stack.append(i)
        elif c in ")]}":
            start = stack.pop()
            if i == end - 1:
                return start
        i += 1
    raise OptionalSyntaxError("unbalanced brackets")


def _receiver_start(text: str, end: int) -> int:
    """Start of the primary expression (identifiers, selections, indexes, calls) that ends at `end`."""
    i = end
    while i > 0:
        c = text[i - 1]
        if c in ")]":
            i = _group_start(text, i)
        elif c.isalnum() or c in "_.":
            i -= 1
        else:
            break
    return i


def _first_optional(text: str) -> int:
    i = 0
    while i < len(text) - 1:
        if text[i] in "\"'":
            i = _skip_string(text, i)
            continue
        if text[i] in ".[" and text[i + 1] == "?":
            return i
        i += 1
    return -1


_IDENT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")


def rewrite_optionals(expression: str) -> str:
    """`x.?f...orValue(d)` -> `(has(x.f) ? x.f... : (d))`, `x[?k]...hasValue()` -> `(k in x)`; the
    receiver is evaluated more than once, which is harmless as CEL has no side effects."""
    text = expression
    while (at := _first_optional(text)) >= 0:
        start = _receiver_start(text, at)
        chain, guards, i = text[start:at], [], at
        while True:
            if text.startswith(".?", i):
                m = _IDENT.match(text, i + 2)
                if m is None:
                    raise OptionalSyntaxError(f"a field name must follow '.?' at {i}")
                guards.append(f"has({chain}.{m.group(1)})")
                chain, i = f"{chain}.{m.group(1)}", m.end()
            elif text.startswith("[?", i):
                end = _group_end(text, i)
                key = text[i + 2 : end - 1]
                guards.append(f"({key}) in {chain}")
                chain, i = f"{chain}[{key}]", end
            elif text.startswith(".orValue(", i):
                end = _group_end(text, i + len(".orValue"))
                default = text[i + len(".orValue(") : end - 1]
                replacement, i = f"(({' && '.join(guards)}) ? {chain} : ({default}))", end
                break
            elif re.match(r"\.hasValue\s*\(\s*\)", text[i:]):
                replacement = f"({' && '.join(guards)})"
                i += re.match(r"\.hasValue\s*\(\s*\)", text[i:]).end()  # type: ignore[union-attr]
                break
            elif text.startswith("[", i):
                end = _group_end(text, i)
                chain, i = chain + text[i:end], end
            elif (m := re.match(r"\.([A-Za-z_][A-Za-z0-9_]*)(?!\s*\()", text[i:])) is not None:
                chain, i = f"{chain}.{m.group(1)}", i + m.end()
            else:
                raise OptionalSyntaxError(
                    "optional syntax ('.?' or '[?') is supported here only in a chain that ends in "
                    ".orValue(default) or .hasValue()"
                )
        text = text[:start] + replacement + text[i:]
    return text


# --- compiled selectors ---------------------------------------------------------------------------

_DOMAIN_REFS = re.compile(
    r"""\b(attributes|capacity)\s*(?:\[\s*(?:"([^"]*)"|'([^']*)')\s*\]|\.\s*([A-Za-z_][A-Za-z0-9_]*))"""
)


_ATTRIBUTE_REF = (
    r"""device\s*\.\s*attributes\s*(?:\[\s*(?:"([^"]*)"|'([^']*)')\s*\]|\.\s*([A-Za-z_][A-Za-z0-9_]*))"""
    r"""\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:"([^"]*)"|'([^']*)')\s*\])"""
)
_COMPARED_LEFT = re.compile(_ATTRIBUTE_REF + r"\s*[!=]=(?!\s*semver\s*\()")
_COMPARED_RIGHT = re.compile(r"(?<!\))\s*[!=]=\s*" + _ATTRIBUTE_REF + r"(?!\s*[.\[(])")


def _equality_operands(expression: str) -> frozenset[tuple[str, str]]:
    """(domain, name) of attributes an expression compares with `==`/`!=` (other than to `semver(...)`)."""
    found = set()
    for pattern in (_COMPARED_LEFT, _COMPARED_RIGHT):
        for m in pattern.finditer(expression):
            g = m.groups()
            found.add((g[0] or g[1] or g[2] or "", g[3] or g[4] or g[5] or ""))
    return frozenset(found)


_FUNCTION_ERROR = re.compile(
    r"Function '([^']+)' error: Python function call failed: \w+: (.*?)(?:\. Check function arguments.*)?$"
)


def _runtime_message(exc: Exception) -> str:
    text = str(exc).split("\n", 1)[0]
    m = _FUNCTION_ERROR.match(text)
    return f"{m.group(1)}(): {m.group(2)}" if m else text


class CompiledSelector:
    """One compiled expression plus the domains it reads (to give them the empty-map default)."""

    def __init__(self, expression: str, program: Any, domains: dict[str, frozenset[str]]) -> None:
        self.expression = expression
        self._program = program
        self._equalities = _equality_operands(expression)
        self._attr_domains = domains["attributes"]
        self._cap_domains = domains["capacity"]

    def _with_default_domains(self, device: dict[str, Any]) -> dict[str, Any]:
        """The variable CEL sees: unknown domains read as empty maps; the version names are ours only."""
        attrs, caps = device["attributes"], device["capacity"]
        missing_a = [d for d in self._attr_domains if d not in attrs]
        missing_c = [d for d in self._cap_domains if d not in caps]
        out = {k: v for k, v in device.items() if k != VERSIONS_KEY}
        if missing_a:
            out["attributes"] = {**attrs, **{d: {} for d in missing_a}}
        if missing_c:
            out["capacity"] = {**caps, **{d: {} for d in missing_c}}
        return out

    def evaluate(self, context: Any, device: dict[str, Any]) -> bool:
        """True/False for one device variable; SelectorError("CEL runtime error: ...") otherwise."""
        for domain, name in self._equalities & device.get(VERSIONS_KEY, frozenset()):
            raise SelectorError(
                f'no such overload: attribute "{domain}/{name}" is a version (a Semver); compare it with '
                f"compareTo/isGreaterThan/isLessThan or == semver(...), not with == on another type"
            )
        context.add_variable("device", self._with_default_domains(device))
        try:
            result = self._program.execute(context)
        except KeyError as exc:
            raise SelectorError(f"no such key: {exc.args[0] if exc.args else exc}") from None
        except (TypeError, ValueError, RuntimeError) as exc:
            raise SelectorError(_runtime_message(exc)) from None
        if not isinstance(result, bool):
            raise SelectorError(f"expression returned {type(result).__name__} {result!r}, not a bool")
        return result


class CelEnvironment:
    """Compiles each distinct expression once and evaluates it with the Kubernetes functions.

    Not thread-safe (neither is `cel.Context`): one environment per allocator.
    """

    def __init__(self) -> None:
        self._context = kubernetes_context()
        self._compiled: dict[str, CompiledSelector | SelectorError] = {}

    def compile(self, expression: str) -> CompiledSelector:
        """The compiled selector; SelectorError("CEL compile error: ...") when it does not parse."""
        hit = self._compiled.get(expression)
        if hit is None:
            try:
                source = rewrite_optionals(expression)
                program = cel.compile(source)
            except (ValueError, RuntimeError, TypeError) as exc:
                hit = SelectorError(f"CEL compile error: {str(exc).splitlines()[0] if str(exc) else exc}")
            else:
                domains: dict[str, set[str]] = {"attributes": set(), "capacity": set()}
                for m in _DOMAIN_REFS.finditer(source):
                    domains[m.group(1)].add(m.group(2) or m.group(3) or m.group(4) or "")
                hit = CompiledSelector(expression, program, {k: frozenset(v) for k, v in domains.items()})
            self._compiled[expression] = hit
        if isinstance(hit, SelectorError):
            raise hit
        return hit

    def matches(self, expression: str, device: dict[str, Any]) -> bool:
        """Compile (cached) and evaluate one expression against one device variable."""
        return self.compile(expression).evaluate(self._context, device)
