"""A read-only mirror of the limiter's per-claim accounting region (native/limiter/src/region.c).

The agent reads only the 4 KiB header: the device table (claim-wide bytes in use per GPU UUID) and
the claim-wide counters beside it. A file of another layout (magic, version or sizes differ) is
skipped, never reinterpreted. Keep this module in step with region.c; a test builds a region with the
real library and reads it back here, so drift fails there.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

REGION_FILE = "dragpu-limiter.region"
MAGIC = 0x314C504741524444
VERSION = 1
HEADER_BYTES = 4096
SLOT_COUNT = 1024
SLOT_BYTES = 192
DEVICE_COUNT = 16
REGION_BYTES = HEADER_BYTES + SLOT_COUNT * SLOT_BYTES

_HEAD = struct.Struct(
    "<QIIIIII"
)  # magic, version, header_bytes, slot_count, slot_bytes, device_count, reserved
_DEVS_AT = 64  # struct region_dev is _Alignas(64)
_DEV_BYTES = 192  # uuid[48], ready u32 | used i64 (own cache line) | tat_ns i64 (own cache line)
_UUID_LEN = 48
_READY_AT = 48
_USED_AT = 64
_STATS_AT = _DEVS_AT + DEVICE_COUNT * _DEV_BYTES
_STATS = struct.Struct("<QQQQ")  # refused, throttled_ns, busy_ns, spare


@dataclass(frozen=True)
class RegionDevice:
    """One GPU's claim-wide figures."""

    uuid: str
    used_bytes: int
    refused: int
    throttled_seconds: float
    busy_seconds: float


def parse_header(header: bytes) -> list[RegionDevice] | None:
    """The device table of a region header; None for a layout this mirror does not know."""
    if len(header) < HEADER_BYTES:
        return None
    magic, version, header_bytes, slots, slot_bytes, devices, _ = _HEAD.unpack_from(header)
    if (magic, version, header_bytes, slots, slot_bytes, devices) != (
        MAGIC,
        VERSION,
        HEADER_BYTES,
        SLOT_COUNT,
        SLOT_BYTES,
        DEVICE_COUNT,
    ):
        return None
    out = []
    for i in range(DEVICE_COUNT):
        base = _DEVS_AT + i * _DEV_BYTES
        (ready,) = struct.unpack_from("<I", header, base + _READY_AT)
        if not ready:
            continue
        uuid = header[base : base + _UUID_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
        (used,) = struct.unpack_from("<q", header, base + _USED_AT)
        refused, throttled_ns, busy_ns, _ = _STATS.unpack_from(header, _STATS_AT + i * _STATS.size)
        out.append(RegionDevice(uuid, max(used, 0), refused, throttled_ns / 1e9, busy_ns / 1e9))
    return out


def read_region(state_dir: Path | str) -> list[RegionDevice] | None:
    """The figures of the region in a claim's limiter state directory; None if there is none (yet).

    Bytes of processes that died are returned to the totals by the next limited process of the claim,
    so after a crash the figure can stay high until another process of the claim runs.
    """
    try:
        fd = os.open(f"{state_dir}/{REGION_FILE}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return parse_header(os.pread(fd, HEADER_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
