"""XID error codes: which ones make a GPU unhealthy, and how to say so to a human.

The driver's own recovery action (NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) is the
authority where the driver has it: an XID after which the driver asks for no action is the
application's fault, not the GPU's. Older drivers lack the field; there a fixed list of XIDs
caused by applications (the list NVIDIA's device plugin skips by default) is ignored and every
other critical XID makes the GPU unhealthy until the plugin restarts.
"""

from __future__ import annotations

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
"""Raised by faulty applications (exceptions, page faults, preemptive cleanup): not the GPU's health."""

# NVML_GPU_RECOVERY_ACTION_* values, from nvml.h.
RECOVERY_NONE = 0
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "GPU reset",
    2: "node reboot",
    3: "drain peer-to-peer traffic",
    4: "drain and reset",
    5: "recover the IMEX domain",
    6: "bus reset",
    7: "system reboot",
}

_DESCRIPTIONS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def describe_xid(xid: int) -> str:
    """The XID with its meaning where we know it, as a taint or log message shows it."""
    text = _DESCRIPTIONS.get(xid)
    return f"XID {xid}: {text}" if text else f"XID {xid}"


def describe_recovery_action(action: int) -> str:
    return RECOVERY_ACTIONS.get(action, f"recovery action {action}")


def xid_is_fatal(xid: int, recovery_action: int | None) -> bool:
    """Whether an XID should make the GPU unhealthy; recovery_action None means the driver cannot say."""
    if recovery_action is not None:
        return recovery_action != RECOVERY_NONE
    return xid not in APPLICATION_XIDS
