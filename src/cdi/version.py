"""CDI spec versions and the lowest version a spec's features need.

Runtimes vendor a copy of the CDI library and refuse a ``cdiVersion`` they do not know, even if no
newer feature is used (containerd 1.7 rejects ``1.1.0``). So writers should emit the *lowest*
version that covers the features in use; ``minimum_version`` reproduces the reference library's
``MinimumRequiredVersion`` for that.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from cdi.errors import CDIError

if TYPE_CHECKING:
    from cdi.spec import ContainerEdits, Spec

KNOWN_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
EARLIEST_VERSION = "0.3.0"
"""The lowest version the reference library computes; older ones are only accepted on read."""
CURRENT_VERSION = KNOWN_VERSIONS[-1]


def normalize(version: str) -> str:
    """Drop the leading ``v`` runtimes tolerate (``v0.5.0`` == ``0.5.0``)."""
    return version[1:] if version.startswith("v") else version


def version_key(version: str) -> tuple[int, int, int]:
    """A sortable key for a ``MAJOR.MINOR.PATCH`` version."""
    parts = normalize(version).split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise CDIError(f"CDI version {version!r} is invalid: expected MAJOR.MINOR.PATCH, e.g. '0.5.0'")
    major, minor, patch = (int(p) for p in parts)
    return major, minor, patch


def is_known(version: str) -> bool:
    return normalize(version) in KNOWN_VERSIONS


def requirements(spec: Spec) -> list[tuple[str, str]]:
    """Every (version, feature) pair the spec needs above the earliest version, in spec order."""
    found: list[tuple[str, str]] = []
    if spec.annotations:
        found.append(("0.6.0", "spec annotations"))
    _, slash, cls = spec.kind.partition("/")
    if slash and "." in cls:
        found.append(("0.6.0", f"a '.' in the class {cls!r}"))
    if spec.container_edits is not None:
        found += _edit_requirements(spec.container_edits, "spec containerEdits")
    for dev in spec.devices:
        where = f"device {dev.name!r}"
        if dev.name and dev.name[0] not in string.ascii_letters:
            found.append(("0.5.0", f"{where}: a name that does not start with a letter"))
        if dev.annotations:
            found.append(("0.6.0", f"{where}: annotations"))
        found += _edit_requirements(dev.container_edits, where)
    return found


def _edit_requirements(edits: ContainerEdits, where: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if any(m.type for m in edits.mounts or ()):
        found.append(("0.4.0", f"{where}: mounts[].type"))
    if any(d.host_path for d in edits.device_nodes or ()):
        found.append(("0.5.0", f"{where}: deviceNodes[].hostPath"))
    if edits.intel_rdt is not None:
        found.append(("0.7.0", f"{where}: intelRdt"))
        if edits.intel_rdt.schemata is not None or edits.intel_rdt.enable_monitoring:
            found.append(("1.1.0", f"{where}: intelRdt.schemata/enableMonitoring"))
    if edits.additional_gids:
        found.append(("0.7.0", f"{where}: additionalGids"))
    if edits.net_devices:
        found.append(("1.1.0", f"{where}: netDevices"))
    return found


def minimum_version(spec: Spec) -> str:
    """The lowest ``cdiVersion`` that covers every feature the spec uses (never below 0.3.0)."""
    return max((v for v, _ in requirements(spec)), key=version_key, default=EARLIEST_VERSION)


def features_needing(spec: Spec, version: str) -> list[str]:
    """The features that need a version above ``version``; empty if ``version`` suffices."""
    limit = version_key(version)
    return [feature for v, feature in requirements(spec) if version_key(v) > limit]
