"""CEL device selectors evaluated the way Kubernetes evaluates them.

Kubernetes compiles DeviceClass and request selectors with cel-go; here the `cel` package from PyPI
(`common-expression-language`) runs them against the same `device` variable:

- `device.driver` (string), `device.allowMultipleAllocations` (bool);
- `device.attributes[domain].name`: `int`, `bool`, `string` as themselves, `version` as its string
  (so `==` works; ordering needs `semver(...)` functions below), list forms as lists;
- `device.capacity[domain].name`: the capacity as a number (an int when whole, else a double).

Unqualified attribute and capacity names belong to the driver's domain, as in Kubernetes. A domain the
device does not have reads as an empty map (Kubernetes does the same), so `has(...)` guards work;
a missing key is a runtime error ("no such key"), which the allocator reports like Kubernetes does.

Supported Kubernetes library functions (besides CEL's built-ins and the `cel.stdlib` extensions:
strings, lists, sets, math, base64, `min`/`max`/`sum`):

- quantity: `quantity(s)`, `isQuantity(s)`, `q.compareTo(q2)`, `q.isGreaterThan(q2)`,
  `q.isLessThan(q2)`, `q.add(q2|int)`, `q.sub(q2|int)`, `q.sign()`, `q.isInteger()`,
  `q.asInteger()`, `q.asApproximateFloat()`. A quantity is a plain number here, so `==` compares values
  (`quantity("1Gi") == quantity("1024Mi")`), and `<`/`>=` also work (Kubernetes would insist on
  `compareTo`; accepting more is harmless for selectors that are valid there).
- semver: `semver(s)`, `isSemver(s)`, `v.major()`, `v.minor()`, `v.patch()`, and `compareTo`,
  `isGreaterThan`, `isLessThan` between two versions (semver 2.0 precedence).

Not supported: CEL optional syntax (`.?name`, `orValue`), which the `cel` package does not parse, and
cost limits (the API server already rejected over-expensive expressions).
"""

from __future__ import annotations

import re
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


def quantity_number(value: str | int | Fraction) -> Number:
    """A quantity as CEL sees it: an int when whole and within int64, else a double."""
    q = parse_quantity(value)
    if q.denominator == 1 and -_I64_MAX <= q.numerator <= _I64_MAX:
        return int(q.numerator)
    return float(q)


def _attribute_value(attr: Mapping[str, Any]) -> Any:
    for key in ("int", "bool", "string", "version"):
        if key in attr:
            return attr[key]
    for key in ("ints", "bools", "strings", "versions"):
        if key in attr:
            return list(attr[key])
    return None


def device_variable(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The `device` variable for one ResourceSlice device (v1 JSON shape)."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, attr in (device.get("attributes") or {}).items():
        domain, ident = split_qualified(name, driver)
        value = _attribute_value(attr or {})
        if value is not None:
            attributes.setdefault(domain, {})[ident] = value
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in objects.device_capacity(device).items():
        domain, ident = split_qualified(name, driver)
        capacity.setdefault(domain, {})[ident] = quantity_number((cap or {}).get("value", 0))
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
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


def _semver(text: Any) -> str:
    _semver_parts(text)
    return str(text)


def _is_semver(text: Any) -> bool:
    try:
        _semver_parts(text)
    except ValueError:
        return False
    return True


# --- quantity -------------------------------------------------------------------------------------


def _quantity(text: Any) -> Number:
    if not isinstance(text, str):
        raise ValueError(f"quantity() needs a string, got {text!r}")
    try:
        return quantity_number(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def _is_quantity(text: Any) -> bool:
    try:
        _quantity(text)
    except ValueError:
        return False
    return True


def _number(value: Any) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
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


def _functions() -> dict[str, Callable[..., Any]]:
    return {
        "quantity": _quantity,
        "isQuantity": _is_quantity,
        "compareTo": _compare,
        "isGreaterThan": lambda a, b: _compare(a, b) > 0,
        "isLessThan": lambda a, b: _compare(a, b) < 0,
        "add": lambda a, b: _number(a) + _number(b),
        "sub": lambda a, b: _number(a) - _number(b),
        "sign": lambda a: (_number(a) > 0) - (_number(a) < 0),
        "isInteger": lambda a: isinstance(_number(a), int) or float(a).is_integer(),
        "asInteger": _as_integer,
        "asApproximateFloat": lambda a: float(_number(a)),
        "semver": _semver,
        "isSemver": _is_semver,
        "major": lambda v: _semver_parts(v)[0],
        "minor": lambda v: _semver_parts(v)[1],
        "patch": lambda v: _semver_parts(v)[2],
    }


def kubernetes_context() -> Any:
    """A `cel.Context` with CEL's extensions and the Kubernetes functions above (no variables yet)."""
    context = cel.Context()
    add_stdlib_to_context(context)
    for name, fn in _functions().items():
        context.add_function(name, fn)
    return context


# --- compiled selectors ---------------------------------------------------------------------------

_DOMAIN_REFS = re.compile(
    r"""\b(attributes|capacity)\s*(?:\[\s*(?:"([^"]*)"|'([^']*)')\s*\]|\.\s*([A-Za-z_][A-Za-z0-9_]*))"""
)


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
        self._attr_domains = domains["attributes"]
        self._cap_domains = domains["capacity"]

    def _with_default_domains(self, device: dict[str, Any]) -> dict[str, Any]:
        attrs, caps = device["attributes"], device["capacity"]
        missing_a = [d for d in self._attr_domains if d not in attrs]
        missing_c = [d for d in self._cap_domains if d not in caps]
        if not missing_a and not missing_c:
            return device
        out = dict(device)
        if missing_a:
            out["attributes"] = {**attrs, **{d: {} for d in missing_a}}
        if missing_c:
            out["capacity"] = {**caps, **{d: {} for d in missing_c}}
        return out

    def evaluate(self, context: Any, device: dict[str, Any]) -> bool:
        """True/False for one device variable; SelectorError("CEL runtime error: ...") otherwise."""
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
                program = cel.compile(expression)
            except (ValueError, RuntimeError, TypeError) as exc:
                hit = SelectorError(f"CEL compile error: {str(exc).splitlines()[0] if str(exc) else exc}")
            else:
                domains: dict[str, set[str]] = {"attributes": set(), "capacity": set()}
                for m in _DOMAIN_REFS.finditer(expression):
                    domains[m.group(1)].add(m.group(2) or m.group(3) or m.group(4) or "")
                hit = CompiledSelector(expression, program, {k: frozenset(v) for k, v in domains.items()})
            self._compiled[expression] = hit
        if isinstance(hit, SelectorError):
            raise hit
        return hit

    def matches(self, expression: str, device: dict[str, Any]) -> bool:
        """Compile (cached) and evaluate one expression against one device variable."""
        return self.compile(expression).evaluate(self._context, device)
