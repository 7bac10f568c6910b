"""Architecture and compute capability, derived when the driver cannot tell us directly.

Old drivers lack nvmlDeviceGetArchitecture (and very old ones the compute-capability query), and
new drivers may return an architecture code newer than this table: in both cases the other fact
and the product name still pin it down well enough for scheduling attributes.
"""

from __future__ import annotations

# nvmlDeviceArchitecture_t values (NVML_DEVICE_ARCH_*), from nvml.h.
NVML_ARCHITECTURES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

UNKNOWN = "Unknown"

# Compute capability -> architecture; majors alone where every minor shares one architecture.
_CC_ARCH: dict[str, str] = {
    "7.0": "Volta",
    "7.2": "Volta",
    "7.5": "Turing",
    "8.9": "Ada Lovelace",
}
_MAJOR_ARCH: dict[int, str] = {
    3: "Kepler",
    5: "Maxwell",
    6: "Pascal",
    8: "Ampere",
    9: "Hopper",
    10: "Blackwell",
    11: "Blackwell",
    12: "Blackwell",
}

# Product-name fragments -> compute capability, most specific first (A100 before A10, L40 before L4).
_NAME_CC: tuple[tuple[str, str], ...] = (
    ("GB300", "10.3"),
    ("B300", "10.3"),
    ("GB200", "10.0"),
    ("B200", "10.0"),
    ("GH200", "9.0"),
    ("H200", "9.0"),
    ("H100", "9.0"),
    ("H800", "9.0"),
    ("L40", "8.9"),
    ("L20", "8.9"),
    ("L4", "8.9"),
    ("A100", "8.0"),
    ("A800", "8.0"),
    ("A30", "8.0"),
    ("A40", "8.6"),
    ("A10", "8.6"),
    ("A16", "8.6"),
    ("A2", "8.6"),
    ("T4", "7.5"),
    ("V100", "7.0"),
    ("P100", "6.0"),
    ("P40", "6.1"),
    ("P4", "6.1"),
)


def architecture_from_code(code: int) -> str | None:
    return NVML_ARCHITECTURES.get(code)


def architecture_from_compute_capability(cc: str) -> str:
    if cc in _CC_ARCH:
        return _CC_ARCH[cc]
    major, _, _ = cc.partition(".")
    try:
        return _MAJOR_ARCH.get(int(major), UNKNOWN)
    except ValueError:
        return UNKNOWN


def compute_capability_from_name(product_name: str) -> str:
    """Best guess from the marketing name; "" when the name says nothing we know."""
    words = product_name.upper().replace("-", " ").split()
    for fragment, cc in _NAME_CC:
        if any(word == fragment or _starts_model(word, fragment) for word in words):
            return cc
    return ""


def _starts_model(word: str, fragment: str) -> bool:
    """A fragment matches a model word unless a digit follows: A10 must not match A100."""
    return word.startswith(fragment) and not word[len(fragment) :][:1].isdigit()
