"""A read-only mirror of the limiter's per-claim accounting region (native/limiter/src/region.c).

The agent reads the 4 KiB header (the device table keyed by GPU UUID and the claim-wide counters
beside it), the export table (memory processes of the claim share, charged once) and the process slots
in use. A slot counts only while its owner holds the slot's open-file-description lock (asked with
F_OFD_GETLK, which takes no lock), and an export entry only while one of its holders' slots does: the
bytes of a process that died stay in the totals until the next limited process of the claim sweeps
them, but not in what the agent reports. The agent writes one thing: a slot whose process is gone from the
node (the library can tell only in its own PID namespace) is marked SLOT_GONE (`unlocked_slots`,
`hand_back`), and the library's next sweep refunds it. A file of another layout (magic, version or sizes differ) is skipped, never
reinterpreted. Keep this module in step with region.c; a test builds a region with the real library
and reads it back here, so drift fails there.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from collections.abc import Iterator
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
_SLOT_OWNER = struct.Struct("=IiQQ")
SLOT_OWNED = 1
SLOT_GONE = 2
"""`in_use` of a slot whose process the agent found gone: the library's next sweep gives its bytes back."""
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
    words = memoryview(header)[_DEVS_AT : _DEVS_AT + DEVICE_COUNT * _DEV_BYTES].cast("I")
    for i, ready in enumerate(words[_READY_AT // 4 :: _DEV_BYTES // 4]):
        if not ready:
            continue
        base = _DEVS_AT + i * _DEV_BYTES
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
    table = table[: len(table) - len(table) % EXPORT_BYTES]
    flags = memoryview(table).cast("I")[:: EXPORT_BYTES // 4]  # each entry's first field: live
    if not flags.tobytes().strip(b"\0"):
        return  # no entry live: the table of a claim that shares no memory
    for at in (i * EXPORT_BYTES for i, flag in enumerate(flags) if flag):
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
    for slot, chunk, at in _slots_in_use(fd):
        if _slot_alive(fd, slot):
            _add_used(totals, chunk, at)
    return totals


def _slots_in_use(fd: int) -> Iterator[tuple[int, bytes, int]]:
    """(slot index, the chunk of slots read with it, its offset in that chunk) of every slot marked in use, in
    order: slots are taken lowest first, so a chunk with none in use ends the table."""
    for first in range(0, SLOT_COUNT, _SLOT_CHUNK):
        chunk = os.pread(fd, _SLOT_CHUNK * SLOT_BYTES, SLOTS_AT + first * SLOT_BYTES)
        chunk = chunk[: len(chunk) - len(chunk) % SLOT_BYTES]
        in_use = memoryview(chunk).cast("I")[:: SLOT_BYTES // 4]  # each slot's first field
        busy = [i for i, flag in enumerate(in_use) if flag]
        if not busy:
            return
        for i in busy:
            yield first + i, chunk, i * SLOT_BYTES


def _add_used(totals: list[int], chunk: bytes, at: int) -> None:
    for d, used in enumerate(_SLOT_USED.unpack_from(chunk, at + _SLOT_USED_AT)):
        totals[d] += max(used, 0)


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


@dataclass(frozen=True)
class SlotOwner:
    """The process a slot names: its PID namespace's inode, its PID there and its start time (clock ticks)."""

    pidns: int
    pid: int
    start: int


def _slot_owner(raw: bytes) -> tuple[int, SlotOwner]:
    in_use, pid, pidns, start = _SLOT_OWNER.unpack_from(raw)
    return in_use, SlotOwner(pidns, pid, start)


def _lock_slot(fd: int, slot: int, kind: int) -> bool:
    """Takes (F_WRLCK) or drops (F_UNLCK) the slot's lock on this open file description; never waits."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, 1 + slot, 1, 0))
    except OSError:
        return False
    return True


def _open_for_hand_back(state_dir: Path | str) -> int | None:
    """The region open for writing when it is a regular file of this layout; never blocks."""
    try:
        fd = os.open(f"{state_dir}/{REGION_FILE}", os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            stat.S_ISREG(st.st_mode)
            and st.st_size == REGION_BYTES
            and parse_header(os.pread(fd, HEADER_BYTES, 0)) is not None
        ):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def unlocked_slots(state_dir: Path | str) -> list[tuple[int, SlotOwner]]:
    """The slots in use that no process holds the lock of, with the process each names: the candidates
    for `hand_back`. A slot that names no process (its /proc was unreadable) can never be proven gone."""
    fd = _open_for_hand_back(state_dir)
    if fd is None:
        return []
    out: list[tuple[int, SlotOwner]] = []
    try:
        for first in range(0, SLOT_COUNT, _SLOT_CHUNK):
            chunk = os.pread(fd, _SLOT_CHUNK * SLOT_BYTES, SLOTS_AT + first * SLOT_BYTES)
            chunk = chunk[: len(chunk) - len(chunk) % SLOT_BYTES]
            in_use = memoryview(chunk).cast("I")[:: SLOT_BYTES // 4]
            busy = [i for i, flag in enumerate(in_use) if flag]
            if not busy:
                break
            for i in busy:
                state, owner = _slot_owner(chunk[i * SLOT_BYTES : i * SLOT_BYTES + _SLOT_OWNER.size])
                named = owner.pid > 0 and owner.pidns and owner.start
                if state == SLOT_OWNED and named and not _slot_alive(fd, first + i):
                    out.append((first + i, owner))
    except OSError:
        return out
    finally:
        os.close(fd)
    return out


def hand_back(state_dir: Path | str, gone: list[tuple[int, SlotOwner]]) -> int:
    """Marks SLOT_GONE each of these slots (from `unlocked_slots`) that still names the same process and
    whose lock no process holds; returns how many it marked.

    The library can tell a dead owner only in its own PID namespace, so a slot of a pod that restarted or of
    a container that exited would stay charged for the claim's lifetime. The agent sees every process of the
    node; the caller passes only slots whose process it found gone *after* `unlocked_slots` read them (a
    process gone then stays gone). region.c's protocol: the slot's lock is taken without waiting, as a sweep
    takes it, the owner read again under it, and only then is the slot marked. No counter is changed (they
    are lock-free atomics the library updates): the claim's next process that sweeps - at its start, before
    it refuses an allocation, when it reports free memory - gives the bytes back and frees the slot."""
    if not gone:
        return 0
    fd = _open_for_hand_back(state_dir)
    if fd is None:
        return 0
    marked = 0
    try:
        for slot, owner in gone:
            if not _lock_slot(fd, slot, fcntl.F_WRLCK):
                continue  # a process claims or sweeps it right now
            try:
                at = SLOTS_AT + slot * SLOT_BYTES
                state, now = _slot_owner(os.pread(fd, _SLOT_OWNER.size, at))
                if state == SLOT_OWNED and now == owner:
                    os.pwrite(fd, struct.pack("=I", SLOT_GONE), at)
                    marked += 1
            finally:
                _lock_slot(fd, slot, fcntl.F_UNLCK)
    except OSError:
        return marked
    finally:
        os.close(fd)
    return marked


def read_region_slots(state_dir: Path | str) -> tuple[list[RegionDevice] | None, list[tuple[int, SlotOwner]]]:
    """`read_region`'s figures and `unlocked_slots`' candidates, from one open of the region and one look at
    each slot in use (a sample reads both for every claim): (None, []) where there is no region of this
    layout; no candidates where the file is not a whole region."""
    try:
        fd = os.open(f"{state_dir}/{REGION_FILE}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, []
    unlocked: list[tuple[int, SlotOwner]] = []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, []
        devices = parse_header(os.pread(fd, HEADER_BYTES, 0))
        if devices is None:
            return None, []
        whole = st.st_size == REGION_BYTES
        totals = [0] * DEVICE_COUNT
        _shared_bytes(fd, totals)
        for slot, chunk, at in _slots_in_use(fd):
            if _slot_alive(fd, slot):
                _add_used(totals, chunk, at)
            elif whole:
                state, owner = _slot_owner(chunk[at : at + _SLOT_OWNER.size])
                if state == SLOT_OWNED and owner.pid > 0 and owner.pidns and owner.start:
                    unlocked.append((slot, owner))
    except OSError:
        return None, []
    finally:
        os.close(fd)
    return [replace(d, used_bytes=min(d.used_bytes, totals[d.index])) for d in devices], unlocked


# -- The floor: what the driver says a claim's processes hold (region.c's struct floor_file) --------------

FLOOR_FILE = "dragpu-limiter.floor"
FLOOR_MAGIC = 0x314C464741524444
FLOOR_VERSION = 1
FLOOR_BYTES = 4096
_FLOOR_HEAD = struct.Struct("=QII")  # magic, version, device_count
_FLOOR_SEQ_AT = 16
_FLOOR_SEQ = struct.Struct("=Q")
_FLOOR_FIGURES = struct.Struct("=qq")  # an entry's figures, after its uuid
_FLOOR_DEVS_AT = 64
_FLOOR_DEV = struct.Struct(f"={_UUID_LEN}sqq")  # uuid, bytes (NVML), the region's count the agent read before
FLOOR_MODE = 0o644


def make_floor(path: Path | str, uuids: list[str]) -> None:
    """The floor file of a claim, beside its region (a read-only directory in the container): the claim's
    GPUs, each with no floor yet. Replaced whole: the agent makes it at prepare, before any process maps it.
    Not synced: after a power loss (the only case a sync covers) the claim's processes are gone, and the
    repeated prepare makes a floor again unless it is there whole, naming the claim's GPUs."""
    if len(uuids) > DEVICE_COUNT:
        raise ValueError(f"a floor holds at most {DEVICE_COUNT} GPUs, not {len(uuids)}")
    image = bytearray(FLOOR_BYTES)
    _FLOOR_HEAD.pack_into(image, 0, FLOOR_MAGIC, FLOOR_VERSION, DEVICE_COUNT)
    for i, uuid in enumerate(uuids):
        _FLOOR_DEV.pack_into(image, _FLOOR_DEVS_AT + i * _FLOOR_DEV.size, uuid.encode("ascii"), 0, 0)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, FLOOR_MODE)
    try:
        os.write(fd, bytes(image))
        os.fchmod(fd, FLOOR_MODE)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def floor_uuids(path: Path | str) -> list[str]:
    """The GPUs a floor file has entries for, in order; [] when it is not one."""
    try:
        with open(path, "rb") as f:
            image = f.read(FLOOR_BYTES)
    except OSError:
        return []
    if len(image) != FLOOR_BYTES or _FLOOR_HEAD.unpack_from(image) != (
        FLOOR_MAGIC,
        FLOOR_VERSION,
        DEVICE_COUNT,
    ):
        return []
    out = []
    for i in range(DEVICE_COUNT):
        raw = _FLOOR_DEV.unpack_from(image, _FLOOR_DEVS_AT + i * _FLOOR_DEV.size)[0].split(b"\0", 1)[0]
        if raw:
            out.append(raw.decode("ascii", "replace"))
    return out


def write_floor(path: Path | str, floors: dict[str, tuple[int, int]], uuids: list[str] | None = None) -> bool:
    """Publishes uuid -> (bytes NVML says the claim's processes hold, the region's count read before NVML) in
    place, under the file's sequence (odd while writing), as the library reads it. Only entries the file
    already has are written (`uuids`: its entries, when the caller knows them); False when the file is missing
    or not a floor."""
    uuids = uuids or floor_uuids(path)
    if not uuids:
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        publish_floor(fd, floors, uuids)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def open_floor(path: Path | str) -> int | None:
    """The floor file open for `publish_floor`, as `write_floor` opens it; None where it cannot be."""
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None


def publish_floor(fd: int, floors: dict[str, tuple[int, int]], uuids: list[str]) -> None:
    """`write_floor` on a floor file the caller keeps open (`uuids`: its entries, in order); OSError when it
    cannot be written."""
    (seq,) = _FLOOR_SEQ.unpack(os.pread(fd, 8, _FLOOR_SEQ_AT))
    seq += 2 if seq % 2 == 0 else 1
    os.pwrite(fd, _FLOOR_SEQ.pack(seq - 1), _FLOOR_SEQ_AT)
    for i, uuid in enumerate(uuids):
        if uuid in floors:
            at = _FLOOR_DEVS_AT + i * _FLOOR_DEV.size + _UUID_LEN
            os.pwrite(fd, _FLOOR_FIGURES.pack(*floors[uuid]), at)
    os.pwrite(fd, _FLOOR_SEQ.pack(seq), _FLOOR_SEQ_AT)


def region_counts(state_dir: Path | str) -> dict[str, int]:
    """The region's claim-wide count per GPU UUID, as the library admits against it (dead slots included)."""
    try:
        fd = os.open(f"{state_dir}/{REGION_FILE}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        devices = parse_header(os.pread(fd, HEADER_BYTES, 0)) or []
    except OSError:
        return {}
    finally:
        os.close(fd)
    return {d.uuid: d.used_bytes for d in devices}
