"""The limiter's limits file: its paths in a container, its bounds, the compute priority classes and the
file itself (`render`), as the library reads it (native/limiter/src/limits.c).

The node agent writes one limits file per claim (`plugin/sharing/modes/limiter.py` gives `render` the
claim's budgets); the library reads it at the claims root of the container. These names and bounds are the
library's: keep them in step with limits.c.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

CONTAINER_LIBRARY = "/usr/local/lib/dra-gpu/libdragpu-limiter.so.1"
CONTAINER_CLAIMS_ROOT = "/run/dra-gpu/claims"
CONTAINER_GPUS_ROOT = "/run/dra-gpu/gpus"
"""Where each GPU's arbitration directory is in the container (the library's GPUS_ROOT)."""
CONTAINER_PRELOAD = "/etc/ld.so.preload"
LIMITS_FILE = "limits"
STATE_DIR = "limiter"
PRELOAD_FILE = "ld.so.preload"
LIMITS_VERSION = 1
MAX_MEMORY = 2**64 - 1
"""The largest byte count the library reads (an unsigned 64-bit integer)."""
MAX_DEVICES = 16
"""The devices the library takes from one claim's limits file (DL_MAX_DEVICES)."""
MAX_CLAIM_REF = 63 + 1 + 253
"""`claim=<namespace>/<name>`: the longest the library takes, and the longest Kubernetes allows."""


# The one place the classes are spelled: the config model, the grants, the limits file and (by position, 0
# first) the GPU's board take them from here; tests/project/test_one_spelling.py fails on another spelling.
# The docstring is the JSON Schema's description of `compute.priority`.
class Priority(StrEnum):
    """How a limiter share takes part in its GPU's arbitration (docs/configuration.md)."""

    LATENCY = "latency"
    STANDARD = "standard"
    BESTEFFORT = "besteffort"


DEFAULT_PRIORITY = Priority.STANDARD
"""The class of a claim that names none (and of a device line without `priority=`)."""

PRIORITY_ORDER = " < ".join(p.value for p in reversed(Priority))
"""The classes lowest first, as messages show them (`besteffort < standard < latency`)."""

_LIBRARY_UUID = re.compile(
    r"(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
"""A device UUID as the library reads it."""
_PLAIN = re.compile(r"[^\s/=#]+")
"""A field of the file: no blank or control character, nothing its syntax gives a meaning to."""


class LimitsError(ValueError):
    """A limits file the library would refuse; `reason` says which kind of input is at fault."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class DeviceLine:
    """One GPU's line: the claim's pooled memory budget and its compute floor, ceiling and class."""

    memory: int | None
    """Bytes; None: unlimited."""
    cores: int
    """The compute floor, percent."""
    top: int
    """The compute ceiling in effect, percent (the floor when the share is fixed)."""
    priority: str


def container_claim_dir(claim_uid: str) -> str:
    return f"{CONTAINER_CLAIMS_ROOT}/{claim_uid}"


def render(uid: str, namespace: str, name: str, devices: Mapping[str, DeviceLine]) -> str:
    """The claim's limits file (format version 1), or LimitsError for what the library would refuse: a
    claim prepared with a file the library does not load would have every allocation refused."""
    ref = f"{namespace}/{name}"
    if not (_PLAIN.fullmatch(namespace) and _PLAIN.fullmatch(name) and len(ref) <= MAX_CLAIM_REF):
        raise LimitsError(
            f"claim {ref[:80]!r} cannot be written into the limiter's limits file "
            f"(namespace/name of at most {MAX_CLAIM_REF} characters, no blanks)",
            "invalid_claim",
        )
    if not _PLAIN.fullmatch(uid):
        raise LimitsError(
            f"claim UID {uid[:64]!r} cannot name the limiter's state directory", "invalid_claim"
        )
    if len(devices) > MAX_DEVICES:
        raise LimitsError(
            f"ResourceClaim {ref} has Limiter budgets on {len(devices)} GPUs; the limiter takes at most "
            f"{MAX_DEVICES} per claim: split the request into claims of at most {MAX_DEVICES} GPUs",
            "invalid_config",
        )
    lines = [f"version={LIMITS_VERSION}", f"claim={ref}", f"state={container_claim_dir(uid)}/{STATE_DIR}"]
    for uuid, limit in devices.items():
        if not _LIBRARY_UUID.fullmatch(uuid):
            raise LimitsError(
                f"GPU {uuid[:64]!r} has no UUID the limiter reads (GPU- or MIG- and 8-4-4-4-12 hex digits)",
                "unsupported_device",
            )
        if limit.memory is not None and not 0 <= limit.memory <= MAX_MEMORY:
            raise LimitsError(
                f"ResourceClaim {ref}: a memory limit of {limit.memory} bytes on {uuid} is more than the "
                f"limiter can hold ({MAX_MEMORY} bytes, 16 EiB): ask for at most the GPU's memory",
                "invalid_config",
            )
        if not 1 <= limit.cores <= 100:
            raise LimitsError(
                f"ResourceClaim {ref}: a compute share of {limit.cores}% on {uuid} is not 1..100",
                "invalid_config",
            )
        if not limit.cores <= limit.top <= 100 or limit.priority not in list(Priority):
            raise LimitsError(
                f"ResourceClaim {ref}: a compute ceiling of {limit.top}% ({limit.priority}) on {uuid} is "
                f"not between its floor {limit.cores}% and 100%",
                "invalid_config",
            )
        memory = "unlimited" if limit.memory is None else str(limit.memory)
        line = f"device={uuid} memory={memory} cores={limit.cores}"
        if limit.top != limit.cores:
            line += f" limit={limit.top}"
        if limit.priority != DEFAULT_PRIORITY:
            line += f" priority={limit.priority}"
        lines.append(line)
    return "\n".join(lines) + "\n"
