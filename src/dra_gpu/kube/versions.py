"""What an API server of a given Kubernetes version understands: the features this driver adapts to.

A feature here is either a behaviour that came with a release (a rule the scheduler applies) or a
feature gate whose fields the API server drops while the gate is off. The driver learns the version
from the server (`GET /version`, `KubeAPI.server_version`) and never assumes a newer one; where a gate
can be switched off on a release that has it, the slice publisher still checks what the server kept
(`slices/dropped.py`).

Sources, by feature:

- `QUALIFIED_CAPACITY_NAMES` (1.38, no gate): a claim may name a capacity as `<driver>/<name>` and
  the scheduler resolves it to the device's `<name>` (and the reverse); where a device publishes
  both forms, the qualified one wins. kubernetes/kubernetes PR #142202 ("DRA consumable capacity +
  CEL: fix name comparisons and lookup"), targeted at 1.38; open when last seen (2026-09), so the
  release it lands in is not confirmed by a release note.
- `DRADeviceCompatibilityGroups` (KEP-5963): `consumesCounters[].compatibilityGroups`; alpha (off) in
  1.37, beta planned for 1.38 (kep.yaml; beta gates are on by default). Sources: the kube-scheduler
  feature-gate specs at 1.37 and the KEP README.
- `DRASharedConsumableCapacity` (KEP-5941): `sharedCounters[].counters[].requestPolicy` and
  `consumesCounters[].counters[].valueFrom`; alpha (off by default) planned for 1.38, implementation
  in kubernetes/kubernetes PR #140084 (open when last seen). Sources: the KEP README (retargeted to
  1.38 on 2026-09-22) and the PR's `types.go` diff.
"""

from __future__ import annotations

import logging
import re

from dra_gpu.kube.api import KubeAPI
from dra_gpu.kube.errors import ApiError

log = logging.getLogger(__name__)

Version = tuple[int, int]

FLOOR: Version = (1, 34)
"""The oldest Kubernetes the driver supports (resource.k8s.io/v1)."""

QUALIFIED_CAPACITY_NAMES: Version = (1, 38)
"""From this release on the scheduler resolves `<driver>/<name>` capacity requests (PR #142202)."""

COMPATIBILITY_GROUPS = "DRADeviceCompatibilityGroups"
SHARED_CONSUMABLE_CAPACITY = "DRASharedConsumableCapacity"

GATE_SINCE: dict[str, tuple[Version, Version | None]] = {
    # gate: (release it exists in, release it is on by default from; None: not yet on by default)
    COMPATIBILITY_GROUPS: ((1, 37), (1, 38)),
    SHARED_CONSUMABLE_CAPACITY: ((1, 38), None),
}


def parse_version(text: str) -> Version:
    """`1.38`, `v1.38.0`, `1.38+` (a managed cluster's minor), as (major, minor); ValueError otherwise."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\+?(?:\.\d+.*)?", text.strip())
    if not match:
        raise ValueError(f"not a Kubernetes version (major.minor, e.g. 1.38): {text!r}")
    return int(match.group(1)), int(match.group(2))


def from_version_info(info: dict[str, object]) -> Version:
    """The (major, minor) of a `/version` answer: `major` "1", `minor` "38" or "38+", else `gitVersion`."""
    major, minor = str(info.get("major") or ""), str(info.get("minor") or "")
    digits = re.match(r"\d+", minor)
    if major.isdigit() and digits:
        return int(major), int(digits.group(0))
    return parse_version(str(info.get("gitVersion") or ""))


def resolves_qualified_capacity_names(version: Version) -> bool:
    """Whether the scheduler of this release looks `<driver>/<name>` up as the device's `<name>`."""
    return version >= QUALIFIED_CAPACITY_NAMES


def server_version(api: KubeAPI) -> Version | None:
    """The API server's release; None (logged) if it cannot be read, for the caller to treat as the oldest
    supported and ask again on its next pass (never settled on: one error at start must not last)."""
    try:
        return api.server_version()
    except ApiError as exc:
        log.warning("cannot read the API server's version", extra={"error": str(exc)})
        return None


def server_resolves_qualified_names(api: KubeAPI) -> bool | None:
    """Whether the API server's release resolves `<driver>/<name>` capacities; None if its version cannot
    be read (`server_version`)."""
    version = server_version(api)
    return None if version is None else resolves_qualified_capacity_names(version)


def gate_default(gate: str, version: Version) -> bool:
    """Whether `gate` is on by default on a server of `version` (False where the release has no such gate)."""
    since, on_from = GATE_SINCE[gate]
    return version >= since and on_from is not None and version >= on_from


def show(version: Version) -> str:
    return f"{version[0]}.{version[1]}"
