"""Kubernetes' name and value formats (apimachinery `util/validation`), with its messages.

Each function returns the API server's complaints about a value (empty: valid), so that the fake API
server and `dra-gpu manifests` refuse what the real server refuses, in its words. Lengths are in bytes,
as Go counts them.
"""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_NAME_PART_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def byte_length(text: str) -> int:
    return len(text.encode("utf-8"))


def _too_long(text: str, limit: int) -> list[str]:
    return [f"must be no more than {limit} bytes"] if byte_length(text) > limit else []


def dns1123_label(text: str) -> list[str]:
    errors = _too_long(text, DNS1123_LABEL_MAX)
    return errors if _DNS1123_LABEL.fullmatch(text) else [*errors, LABEL_MESSAGE]


def dns1123_subdomain(text: str) -> list[str]:
    errors = _too_long(text, DNS1123_SUBDOMAIN_MAX)
    return errors if _DNS1123_SUBDOMAIN.fullmatch(text) else [*errors, SUBDOMAIN_MESSAGE]


def qualified_name(text: str) -> list[str]:
    """`[prefix/]name`: a label key, an annotation key, a resource name."""
    prefix, slash, name = text.rpartition("/")
    if text.count("/") > 1:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character, with an optional DNS subdomain prefix and '/' (e.g. "
            "'example.com/MyName')"
        ]
    errors: list[str] = []
    if slash:
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend(f"prefix part {e}" for e in dns1123_subdomain(prefix))
    if not name:
        errors.append("name part must be non-empty")
    elif byte_length(name) > QUALIFIED_NAME_MAX:
        errors.append(f"name part must be no more than {QUALIFIED_NAME_MAX} bytes")
    if name and not _QUALIFIED_NAME.fullmatch(name):
        errors.append(_NAME_PART_MESSAGE)
    return errors


def label_value(text: str) -> list[str]:
    errors = _too_long(text, LABEL_VALUE_MAX)
    return errors if _LABEL_VALUE.fullmatch(text) else [*errors, _LABEL_VALUE_MESSAGE]


def extended_resource_name(text: str) -> list[str]:
    """Kubernetes' IsExtendedResourceName: a domain-qualified name outside `kubernetes.io`, not `requests.*`,
    that is still a qualified name once quota prefixes it with `requests.`."""
    if "/" not in text or "kubernetes.io/" in text or text.startswith("requests."):
        return [
            "must be a valid extended resource name: DOMAIN/NAME, with a domain of your own (not kubernetes.io), "
            "e.g. example.com/gpu"
        ]
    if qualified_name(f"requests.{text}"):
        return [
            "must be a valid extended resource name: a lowercase DNS domain, '/', and a name (e.g. example.com/gpu)"
        ]
    return []
