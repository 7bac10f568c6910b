"""A read-only mirror of the limiter's per-claim accounting region (native/limiter/src/region.c).

The agent reads the 4 KiB header (the device table keyed by GPU UUID and the claim-wide counters
beside it), the export table (memory processes of the claim share, charged once) and the process slots
in use. A slot counts only while its owner holds the slot's open-file-description lock (asked with
F_OFD_GETLK, which takes no lock), and an export entry only while one of its holders' slots does: the
bytes of a process that died stay in the totals until the next limited process of the claim sweeps
them, but not in what the agent reports. A file of another layout (magic, version or sizes differ) is skipped, never
reinterpreted. Keep this module in step with region.c; a test builds a region with the real library
and reads it back here, so drift fails there.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from dataclasses import dataclass, replace
from pathlib import Path

REGION_FILE = "dragpu-limiter.region"
MAGIC = 0x314C504741524444
VERSION = 3
HEADER_BYTES = 4096
EXPORT_COUNT = 128
EXPORT_BYTES = 256
SLOTS_AT = HEADER_BYTES + EXPORT_COUNT * EXPORT_BYTES
SLOT_COUNT = 1024
SLOT_BYTES = 192
DEVICE_COUNT = 16
REGION_BYTES = SLOTS_AT + SLOT_COUNT * SLOT_BYTES

# Native byte order, standard sizes: the file is the C structs as this machine lays them out.
# magic, version, header_bytes, slot_count, slot_bytes, device_count, export_count
_HEAD = struct.Struct("=QIIIIII")
_DEVS_AT = 64  # struct region_dev is _Alignas(64)
_DEV_BYTES = 192  # uuid[48], ready u32 | used i64 (own cache line) | tat_ns i64 (own cache line)
_UUID_LEN = 48
_READY_AT = 48
_USED_AT = 64
_STATS_AT = _DEVS_AT + DEVICE_COUNT * _DEV_BYTES
_STATS = struct.Struct("=QQQQ")  # refused, throttled_ns, busy_ns, spare
# struct region_export: live u32, dev u32, kind u32, pid i32, pidns u64, fd i32, spare u32, bytes i64,
# key[64], holders[16] u64 (bit i: slot i)
_EXPORT = struct.Struct("=II8x8x8xq64x")
_EXPORT_HOLDERS_AT = 104
_EXPORT_HOLDERS = struct.Struct(f"={SLOT_COUNT // 64}Q")
# struct region_slot: in_use u32, pid i32, pidns u64, start u64, used[16] i64
_SLOT_USED = struct.Struct(f"={DEVICE_COUNT}q")
_SLOT_USED_AT = 24
_SLOT_CHUNK = 32  # slots are claimed lowest first: read chunks until one has none in use
_FLOCK = "hhqqi4x"  # native, as fcntl(2) takes it  # struct flock: l_type, l_whence, l_start, l_len, l_pid


@dataclass(frozen=True)
class RegionDevice:
    """One GPU's claim-wide figures."""

    uuid: str
    used_bytes: int
    refused: int
    throttled_seconds: float
    busy_seconds: float
    index: int = 0
    """The entry's position in the device table (and in every slot's per-device array)."""


def header_fields() -> bytes:
    """The layout fields a region starts with (the agent makes claims' regions with them)."""
    return _HEAD.pack(MAGIC, VERSION, HEADER_BYTES, SLOT_COUNT, SLOT_BYTES, DEVICE_COUNT, EXPORT_COUNT)


def parse_header(header: bytes) -> list[RegionDevice] | None:
    """The device table of a region header; None for a layout this mirror does not know."""
    if len(header) < HEADER_BYTES:
        return None
    magic, version, header_bytes, slots, slot_bytes, devices, exports = _HEAD.unpack_from(header)
    if (magic, version, header_bytes, slots, slot_bytes, devices, exports) != (
        MAGIC,
        VERSION,
        HEADER_BYTES,
        SLOT_COUNT,
        SLOT_BYTES,
        DEVICE_COUNT,
        EXPORT_COUNT,
    ):
        return None
    out = []
    for i in range(DEVICE_COUNT):
        base = _DEVS_AT + i * _DEV_BYTES
        (ready,) = struct.unpack_from("=I", header, base + _READY_AT)
        if not ready:
            continue
        uuid = header[base : base + _UUID_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
        (used,) = struct.unpack_from("=q", header, base + _USED_AT)
        refused, throttled_ns, busy_ns, _ = _STATS.unpack_from(header, _STATS_AT + i * _STATS.size)
        out.append(RegionDevice(uuid, max(used, 0), refused, throttled_ns / 1e9, busy_ns / 1e9, i))
    return out


def _slot_alive(fd: int, slot: int) -> bool:
    """Whether a live process holds the slot's lock (byte 1 + slot); asking takes no lock."""
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 1 + slot, 1, 0)
    answer: bytes = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query)
    return int(struct.unpack(_FLOCK, answer)[0]) != fcntl.F_UNLCK


def _shared_bytes(fd: int, totals: list[int]) -> None:
    """Adds the export entries that a live process still holds (each counted once, however many hold it)."""
    table = os.pread(fd, EXPORT_COUNT * EXPORT_BYTES, HEADER_BYTES)
    for at in range(0, len(table) - EXPORT_BYTES + 1, EXPORT_BYTES):
        live, device, used = _EXPORT.unpack_from(table, at)
        if not live or device >= DEVICE_COUNT or used <= 0:
            continue
        words = _EXPORT_HOLDERS.unpack_from(table, at + _EXPORT_HOLDERS_AT)
        holders = (w * 64 + b for w, word in enumerate(words) if word for b in range(64) if word >> b & 1)
        if any(_slot_alive(fd, slot) for slot in holders):
            totals[device] += used


def live_bytes(fd: int) -> list[int]:
    """Per device index: the bytes held by processes that are alive."""
    totals = [0] * DEVICE_COUNT
    _shared_bytes(fd, totals)
    for first in range(0, SLOT_COUNT, _SLOT_CHUNK):
        chunk = os.pread(fd, _SLOT_CHUNK * SLOT_BYTES, SLOTS_AT + first * SLOT_BYTES)
        chunk = chunk[: len(chunk) - len(chunk) % SLOT_BYTES]
        in_use = memoryview(chunk).cast("I")[:: SLOT_BYTES // 4]  # each slot's first field
        busy = [i for i, flag in enumerate(in_use) if flag]
        if not busy:
            break
        for i in busy:
            if _slot_alive(fd, first + i):
                for d, used in enumerate(_SLOT_USED.unpack_from(chunk, i * SLOT_BYTES + _SLOT_USED_AT)):
                    totals[d] += max(used, 0)
    return totals


def read_region(state_dir: Path | str) -> list[RegionDevice] | None:
    """The figures of the region in a claim's limiter state directory; None if there is none (yet).

    Never blocks: the state directory is the tenant's to write on hosts where it is mounted read-write, so
    a FIFO or a device in the file's place must not stall the node's monitor (non-blocking open, regular
    files only, no symbolic link)."""
    try:
        fd = os.open(f"{state_dir}/{REGION_FILE}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        devices = parse_header(os.pread(fd, HEADER_BYTES, 0))
        if devices is None:
            return None
        live = live_bytes(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    # Index i of the device table is device i of every slot; report what live processes hold.
    return [replace(d, used_bytes=min(d.used_bytes, live[d.index])) for d in devices]
