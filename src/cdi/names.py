"""CDI vendor, class and device names, and fully qualified device names.

Rules follow ``pkg/parser/parser.go`` of the reference library (what runtimes enforce), plus the
SPEC's length limits for vendor (a DNS subdomain, at most 253) and class (at most 63). A
qualified name is ``<vendor>/<class>=<name>``; ``<vendor>/<class>`` alone is a spec's ``kind``.
"""

from __future__ import annotations

import string

from cdi.errors import CDIError

_ALNUM = frozenset(string.ascii_letters + string.digits)
_LETTERS = frozenset(string.ascii_letters)
_VENDOR_CLASS_CHARS = _ALNUM | frozenset("_-.")
_DEVICE_CHARS = _ALNUM | frozenset("_-.:")

MAX_VENDOR_LENGTH = 253
MAX_CLASS_LENGTH = 63

_VENDOR_CLASS_RULE = (
    "it must start with an ASCII letter, end with a letter or digit, and contain only letters, "
    "digits, '_', '-' and '.'"
)
_DEVICE_RULE = (
    "it must start and end with an ASCII letter or digit and contain only letters, digits, "
    "'_', '-', '.' and ':'"
)
_QUALIFIED_FORM = "expected '<vendor>/<class>=<name>', e.g. 'example.com/gpu=gpu0'"


def _problem(value: str, allowed: frozenset[str], first: frozenset[str], first_desc: str) -> str | None:
    if not value:
        return "it is empty"
    if value[0] not in first:
        return f"it starts with {value[0]!r}, not {first_desc}"
    for i, c in enumerate(value):
        if c not in allowed:
            return f"character {c!r} at position {i} is not allowed"
    if value[-1] not in _ALNUM:
        return f"it ends with {value[-1]!r}, not a letter or digit"
    return None


def _check_vendor_or_class(what: str, value: str, max_len: int) -> None:
    problem = _problem(value, _VENDOR_CLASS_CHARS, _LETTERS, "a letter")
    if problem is None and len(value) > max_len:
        problem = f"it is {len(value)} characters long, the limit is {max_len}"
    if problem is not None:
        raise CDIError(f"CDI {what} {value!r} is invalid: {problem}; {_VENDOR_CLASS_RULE}")


def validate_vendor(vendor: str) -> None:
    """Raise CDIError unless ``vendor`` is a valid CDI vendor name."""
    _check_vendor_or_class("vendor", vendor, MAX_VENDOR_LENGTH)


def validate_class(cls: str) -> None:
    """Raise CDIError unless ``cls`` is a valid CDI class name (dots need cdiVersion 0.6.0)."""
    _check_vendor_or_class("class", cls, MAX_CLASS_LENGTH)


def validate_device_name(name: str) -> None:
    """Raise CDIError unless ``name`` is a valid (unqualified) CDI device name."""
    problem = _problem(name, _DEVICE_CHARS, _ALNUM, "a letter or digit")
    if problem is not None:
        raise CDIError(f"CDI device name {name!r} is invalid: {problem}; {_DEVICE_RULE}")


def parse_kind(kind: str) -> tuple[str, str]:
    """Split and validate a spec ``kind`` (``<vendor>/<class>``)."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        raise CDIError(f"CDI kind {kind!r} is invalid: expected '<vendor>/<class>', e.g. 'example.com/gpu'")
    validate_vendor(vendor)
    validate_class(cls)
    return vendor, cls


def qualified_name(vendor: str, cls: str, name: str) -> str:
    """Build ``<vendor>/<class>=<name>`` after validating every part."""
    validate_vendor(vendor)
    validate_class(cls)
    validate_device_name(name)
    return f"{vendor}/{cls}={name}"


def parse_qualified_name(qualified: str) -> tuple[str, str, str]:
    """Split ``<vendor>/<class>=<name>`` into its validated parts."""
    if not qualified or qualified.startswith("/"):
        raise CDIError(f"{qualified!r} is not a fully qualified CDI device name: {_QUALIFIED_FORM}")
    kind, sep, name = qualified.partition("=")
    vendor, slash, cls = kind.partition("/")
    missing = None
    if not sep or not name:
        missing = "the device name"
    elif not slash or not vendor:
        missing = "the vendor"
    elif not cls:
        missing = "the class"
    if missing is not None:
        raise CDIError(
            f"{qualified!r} is not a fully qualified CDI device name: missing {missing}; {_QUALIFIED_FORM}"
        )
    validate_vendor(vendor)
    validate_class(cls)
    validate_device_name(name)
    return vendor, cls, name
