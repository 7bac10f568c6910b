"""Which claim identities the agent accepts from the kubelet: checked before anything else is done.

A claim's UID names its CDI spec file and its directory under the state directory, so it must be one
safe path component: a UUID as the API server makes it, or at least letters, digits, `.`, `_` and
`-` not starting with a dot (no `.`, `..` or `/`). Namespace and name are what the API server allows
for a ResourceClaim (a DNS label and a DNS subdomain); they go into the claim's limits file, so
nothing else may pass. A refusal quotes only a short prefix of what was sent.
"""

from __future__ import annotations

import re

from dra_gpu.plugin.errors import quote

MAX_UID = 128
MAX_NAMESPACE = 63
MAX_NAME = 253
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_path_component(text: str, limit: int = MAX_UID) -> bool:
    """One safe file name: no separator, not `.` or `..`, no dot first, printable ASCII only."""
    return 0 < len(text) <= limit and _COMPONENT.fullmatch(text) is not None


def uid_problem(uid: str) -> str | None:
    if _UUID.fullmatch(uid) or is_path_component(uid):
        return None
    return (
        f"uid {quote(uid)} is not a claim UID (a UUID, or up to {MAX_UID} letters, digits, '.', '_' and "
        f"'-' not starting with '.')"
    )


def namespace_problem(namespace: str) -> str | None:
    if len(namespace) <= MAX_NAMESPACE and _LABEL.fullmatch(namespace):
        return None
    return f"namespace {quote(namespace)} is not a Kubernetes namespace (a DNS label of at most {MAX_NAMESPACE} characters)"


def name_problem(name: str) -> str | None:
    if len(name) <= MAX_NAME and _SUBDOMAIN.fullmatch(name):
        return None
    return (
        f"name {quote(name)} is not a ResourceClaim name (a DNS subdomain of at most {MAX_NAME} "
        f"characters: lower-case letters, digits, '-' and '.')"
    )


def claim_problem(uid: str, namespace: str, name: str) -> str | None:
    """Why the kubelet's claim (uid, namespace, name) cannot be acted on; None if it can."""
    missing = [
        field for field, value in (("namespace", namespace), ("name", name), ("uid", uid)) if not value
    ]
    if missing:
        return f"the kubelet sent a claim without {', '.join(missing)}"
    problems = [p for p in (uid_problem(uid), namespace_problem(namespace), name_problem(name)) if p]
    if not problems:
        return None
    return "the kubelet sent an invalid claim: " + "; ".join(problems)
