"""Parsers for what the check programs and NVIDIA's tools print. Pure functions, tested on recordings."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence

Interval = tuple[int, int]
Kernel = tuple[int, int, int]

MIB = 1024 * 1024
_KV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_SMI_L = re.compile(r"^GPU (\d+): (.*?) \(UUID: ((?:GPU|MIG)-[0-9A-Fa-f-]+)\)")


def key_values(text: str) -> dict[str, str]:
    """`key=value` lines (the check programs' output); other lines are ignored, the last value wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _KV.match(line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def int_of(values: dict[str, str], key: str) -> int | None:
    """An integer figure of `key_values`, None when missing or not a number."""
    try:
        return int(values[key])
    except (KeyError, ValueError):
        return None


def float_of(values: dict[str, str], key: str) -> float | None:
    try:
        return float(values[key])
    except (KeyError, ValueError):
        return None


def smi_gpus(text: str) -> list[dict[str, str]]:
    """`nvidia-smi -L`: index, name and UUID of each GPU (MIG lines are skipped)."""
    out = []
    for line in text.splitlines():
        m = _SMI_L.match(line.strip())
        if m and m.group(3).startswith("GPU-"):
            out.append({"index": m.group(1), "name": m.group(2), "uuid": m.group(3)})
    return out


def smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`: one dict per GPU.

    Values are stripped; "[N/A]", "N/A" and "[Not Supported]" become "".
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError(
                f"nvidia-smi printed {len(cells)} fields where {len(fields)} were asked: {line!r}"
            )
        rows.append(
            {
                f: ("" if c in ("[N/A]", "N/A", "[Not Supported]") else c)
                for f, c in zip(fields, cells, strict=True)
            }
        )
    return rows


def mib_to_bytes(text: str) -> int | None:
    """nvidia-smi's memory figures are MiB without a unit (with `nounits`)."""
    try:
        return int(float(text)) * MIB
    except ValueError:
        return None


def kernels_from_bytes(data: bytes) -> list[Kernel]:
    """The (start, spun, end) triples `gc_rt busy --out` writes: little-endian uint64, GPU global-timer ns.

    A torn tail is ignored; a kernel that never ran (end not after start) is kept, so that the kernels of
    one launch keep their places.
    """
    usable = len(data) - len(data) % 24
    return list(struct.iter_unpack("<QQQ", data[:usable]))


def launch_spans(kernels: Sequence[Kernel], per_launch: int = 1) -> list[Interval]:
    """The GPU time each launch held: from its first kernel's start to its last kernel's end.

    A CUDA graph of `per_launch` kernels holds the GPU between its nodes too: no other context runs
    there, and the limiter charges the graph from its start to its end.
    """
    spans = []
    for i in range(0, len(kernels) - len(kernels) % per_launch, per_launch):
        group = kernels[i : i + per_launch]
        if all(e > s for s, _, e in group):
            spans.append((group[0][0], group[-1][2]))
    return spans


def spin_spans(kernels: Iterable[Kernel]) -> list[Interval]:
    """Each kernel's time spinning, without its bookkeeping: reported beside the time it held the GPU."""
    return [(s, spun) for s, spun, _ in kernels if spun > s]


def busy_fraction(intervals: Iterable[Interval], trim_ns: int = 0) -> tuple[float, int]:
    """Fraction of the window during which at least one interval runs, and the window in ns.

    The window runs from the first start to the last end, less `trim_ns` at each edge (where the
    processes of a multi-process run have not all started or have already stopped).
    """
    spans = sorted(intervals)
    if not spans:
        return 0.0, 0
    lo = spans[0][0] + trim_ns
    hi = max(e for _, e in spans) - trim_ns
    if hi <= lo:
        return 0.0, 0
    busy = 0
    cur_s, cur_e = None, None
    for s, e in spans:
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        busy += cur_e - cur_s
    return busy / (hi - lo), hi - lo


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of nothing")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def tail(text: str, lines: int = 8) -> list[str]:
    return [line for line in text.strip().splitlines()[-lines:] if line.strip()]
