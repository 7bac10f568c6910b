"""The per-GPU arbitration files of elastic compute: the agent's board and each claim's activity file.

Every limiter claim with a compute share below 100 % on a GPU takes part in that GPU's arbitration
(the limiter's arbitration.c reads these files; the layouts are in docs/elastic-compute.md):

- ``board`` (16 KiB, root, 0444, mounted read-only): what the agent decided, one entry per claim
  (its floor, ceiling and priority class), at most ``MAX_ENTRIES``: floors are whole percents of at
  least 1 and the agent never lets a GPU's floors sum past 100 (``over_floors``). Only the agent writes it, in place through its own fd, under
  a seqlock (``seq`` odd while it writes), because the library keeps it mapped: a reader copies the
  entries and retries while ``seq`` is odd or changed.
- ``<claim-uid>.activity`` (4 KiB, root, 0666): what the claim's processes say about themselves
  (demand, GPU time used and borrowed). The agent makes it with its header and reads it for metrics;
  a claim's processes can write only their own (the directory is mounted read-only, their own file
  read-write over it), so what it says is the claim's own word, never trusted for anyone's share.

A board entry's flags word (layout version 2's reserved word, zero in every board an older agent wrote, and
never read by an older library: no new layout version) carries the node's marks on a claim, which the
claim cannot write: ``FLAG_CONTRADICTED``, its activity file says it wants the GPU while the driver sees
its processes run nothing, so the library counts none of its demand (it holds no one back) until the
agent clears the mark (``mark_board``).

This module owns both layouts: the hold handler that keeps them (``plugin.sharing.arbitration``) and
the monitor that reads them go through it.

Longer than 500 lines: it is the one place that knows the byte layouts the library reads (both board
versions, their seqlock writes and the marks, the activity file), and a split would put two halves of
one layout in two modules.
"""

from __future__ import annotations

import contextlib
import operator
import os
import struct
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from pathlib import Path

from dra_gpu.limiter_abi.limits import DEFAULT_PRIORITY, Priority

GPUS_DIR = "gpus"
"""`<agent state dir>/gpus/<gpu-uuid>/`: each GPU's arbitration directory."""
BOARD_FILE = "board"
BOARD_BYTES = 16384
BOARD_MAGIC = b"DGPUBRD1"
BOARD_VERSION = 2
"""Version 2: 160-byte entries with room for a claim UID of 128 bytes, at most 100 of them."""
BOARD_MODE = 0o444
FLOOR_TOTAL = 100
"""What the floors of a GPU's claims may sum to, in percent of the GPU."""
MAX_ENTRIES = FLOOR_TOTAL
"""Claims one GPU's board holds: every floor is at least 1 % and the floors sum to at most 100 %."""
HEADER_BYTES = 64
ENTRY_BYTES = 160
CLAIM_UID_BYTES = 128
"""The longest claim UID the agent accepts (`plugin.identity.MAX_UID`), NUL-padded, not NUL-terminated."""
SEQ_OFFSET = 16
BOARD_V1_FILE = "board.v1"
"""A board of layout version 1 the agent found at ``board`` after an upgrade, moved aside (same inode) so
the previous release's library in processes that mapped it keeps reading version 1 there; the agent
keeps it current (``write_board_v1``) until the GPU's directory goes."""
V1_STAND_IN_SUFFIX = "~v1"
"""``<claim-uid>~v1.activity``: an activity file of layout version 1 for a claim prepared by this release on a
GPU whose ``board.v1`` is still kept, named on ``board.v1`` in the claim's place (``v1_stand_in``). The previous
release's library maps another claim's activity file only of version 1, so without it a process of that library
would count the claim as idle and could borrow its floor. The stand-in is the agent's (root, 0444) and says the
claim is active, always: those processes never take its floor, and never borrow its idle time either, until they
restart."""
V1_STAND_IN_MODE = 0o444
V1_MAX_ENTRIES = 128
V1_ENTRY_BYTES = 96
V1_CLAIM_UID_BYTES = 64
"""Version 1 holds a claim UID of at most 63 bytes (NUL-terminated): a longer one is left off it."""
ACTIVITY_SUFFIX = ".activity"
ACTIVITY_BYTES = 4096
ACTIVITY_MAGIC = b"DGPUACT1"
ACTIVITY_VERSION = 2
"""Version 2: the boot the claim's words belong to, at offset 56 (a word of another boot never counts)."""
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
ACTIVITY_MODE = 0o666
FLAG_CONTRADICTED = 1
"""A board entry's flag: the driver contradicts the claim's activity file; its demand is not counted."""
PRIORITIES = tuple(p.value for p in Priority)
"""Priority classes by their code on the board (0 latency, 1 standard, 2 besteffort)."""

_HEADER = struct.Struct("<8sII")  # magic, version, entry count
_SEQ = struct.Struct("<Q")
_ENTRY = struct.Struct("<128sIIII16x")  # claim uid, floor, ceiling, priority, flags
_V1_ENTRY = struct.Struct("<64sIIII16x")  # version 1: claim uid, floor, ceiling, priority, reserved
_ACTIVITY_HEADER = struct.Struct("<8sII")  # magic, version, zero
_ACTIVITY_FIELDS = struct.Struct("<qqqqq")  # demand_until_ns, used_ns, borrowed_ns, waiting, held_ns (int64)
_BOOT_OFFSET = 56  # 16 bytes: the kernel's boot_id, as uuid.UUID(text).bytes
READ_TRIES = 1000
_WRITING = threading.Lock()
"""The agent's writers of a board (prepare's hold handler, the monitor's marks) take turns: each write is a
read, a change and a seqlock write of the whole entry area."""


class BoardError(ValueError):
    """A board that is not one the agent wrote (wrong size, magic or version, or a bad entry)."""


class OldBoard(BoardError):
    """A board of layout version 1: the previous release's library may have it mapped, so it is moved
    aside (``BOARD_V1_FILE``), never rewritten in this layout."""


@dataclass(frozen=True, order=True)
class Entry:
    """One claim's place in its GPU's arbitration."""

    claim_uid: str
    floor: int
    ceiling: int
    priority: str = DEFAULT_PRIORITY.value

    def __post_init__(self) -> None:
        uid = self.claim_uid.encode()
        if not uid or len(uid) > CLAIM_UID_BYTES or b"\0" in uid or "/" in self.claim_uid:
            raise BoardError(f"claim UID {self.claim_uid[:140]!r} cannot name an activity file on the board")
        if not 1 <= self.floor <= self.ceiling <= 100:
            raise BoardError(
                f"floor {self.floor} and ceiling {self.ceiling} are not 1 <= floor <= ceiling <= 100"
            )
        if self.priority not in PRIORITIES:
            raise BoardError(f"unknown priority {self.priority!r}; allowed: {', '.join(PRIORITIES)}")


_ORDER = operator.attrgetter("claim_uid", "floor", "ceiling", "priority")
"""Entries' order on the board (their dataclass order, compared in C: a GPU holds up to 100 of them)."""


@dataclass(frozen=True)
class Activity:
    """What a claim's processes report in their activity file, cumulative since it was made."""

    demand_until_ns: int
    used_ns: int
    borrowed_ns: int
    waiting: int
    held_ns: int


def activity_name(claim_uid: str) -> str:
    return claim_uid + ACTIVITY_SUFFIX


def over_floors(entries: Iterable[Entry], put: Entry) -> str | None:
    """Why `put` may not join a board with `entries` (its own earlier entry aside): the floors would sum
    past FLOOR_TOTAL; None when it may."""
    others = [e for e in entries if e.claim_uid != put.claim_uid]
    taken = sum(e.floor for e in others)
    if taken + put.floor <= FLOOR_TOTAL:
        return None
    return (
        f"{len(others)} claims with floors summing to {taken}% are on it, and this claim's floor of "
        f"{put.floor}% would take it past {FLOOR_TOTAL}% (a GPU takes at most {MAX_ENTRIES} claims of 1%)"
    )


def board_header(count: int, seq: int) -> bytes:
    return _HEADER.pack(BOARD_MAGIC, BOARD_VERSION, count) + _SEQ.pack(seq)


def pack_entries(entries: Iterable[Entry], marked: Set[str] = frozenset()) -> tuple[int, bytes]:
    """(count, the whole entry area): entries in claim UID order, every unused slot zero; the claims in
    `marked` flagged FLAG_CONTRADICTED."""
    ordered = sorted(entries, key=_ORDER)
    if len(ordered) > MAX_ENTRIES:
        raise BoardError(f"{len(ordered)} claims on one GPU; the board holds at most {MAX_ENTRIES}")
    packed = b"".join(
        _ENTRY.pack(
            e.claim_uid.encode(),
            e.floor,
            e.ceiling,
            PRIORITIES.index(e.priority),
            FLAG_CONTRADICTED if e.claim_uid in marked else 0,
        )
        for e in ordered
    )
    return len(ordered), packed.ljust(BOARD_BYTES - HEADER_BYTES, b"\0")


def board_bytes(entries: Iterable[Entry], seq: int = 0, marked: Set[str] = frozenset()) -> bytes:
    """A whole board file as the agent writes it (seq even)."""
    count, area = pack_entries(entries, marked)
    return board_header(count, seq).ljust(HEADER_BYTES, b"\0") + area


def _marks(header: bytes, area: bytes) -> set[str]:
    """The claim UIDs whose entries carry FLAG_CONTRADICTED (of a board `_unpack` took)."""
    (count,) = struct.unpack_from("<I", header, 12)
    marked = set()
    for i in range(min(count, MAX_ENTRIES)):
        raw, _, _, _, flags = _ENTRY.unpack_from(area, i * ENTRY_BYTES)
        if flags & FLAG_CONTRADICTED:
            marked.add(raw.rstrip(b"\0").decode(errors="replace"))
    return marked


def _unpack(header: bytes, area: bytes) -> list[Entry]:
    magic, version, count = _HEADER.unpack_from(header)
    if magic != BOARD_MAGIC or version != BOARD_VERSION or count > MAX_ENTRIES:
        raise BoardError(
            f"not a board of layout version {BOARD_VERSION} (magic {magic!r}, version {version})"
        )
    entries = []
    for i in range(count):
        raw, floor, ceiling, priority, _ = _ENTRY.unpack_from(area, i * ENTRY_BYTES)
        if priority >= len(PRIORITIES):
            raise BoardError(f"board entry {i} has priority code {priority}")
        entries.append(
            Entry(raw.rstrip(b"\0").decode(errors="replace"), floor, ceiling, PRIORITIES[priority])
        )
    return entries


def _read_consistent(path: Path | str) -> tuple[bytes, bytes]:
    """A board file's header and entry area as one write left them (seqlock: seq even and unchanged across
    the read), whatever its layout version; BoardError if it is not a board's size or keeps changing,
    OSError if unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != BOARD_BYTES:
            raise BoardError(f"{path} is {os.fstat(fd).st_size} bytes, not {BOARD_BYTES}")
        seq = 0
        for _ in range(READ_TRIES):
            header = os.pread(fd, HEADER_BYTES, 0)
            (seq,) = _SEQ.unpack_from(header, SEQ_OFFSET)
            area = os.pread(fd, BOARD_BYTES - HEADER_BYTES, HEADER_BYTES)
            (again,) = _SEQ.unpack(os.pread(fd, _SEQ.size, SEQ_OFFSET))
            if seq % 2 == 0 and seq == again:
                return header, area
        raise BoardError(f"{path} kept changing while read (seq {seq})")
    finally:
        os.close(fd)


def read_board(path: Path) -> list[Entry]:
    """The board's entries, read consistently (seqlock); BoardError if it is no board, OSError if unreadable."""
    return _unpack(*_read_consistent(path))


def read_marks(path: Path | str) -> set[str]:
    """The claim UIDs the board marks FLAG_CONTRADICTED (read as `read_board`)."""
    header, area = _read_consistent(path)
    _unpack(header, area)
    return _marks(header, area)


def make_file(path: Path | str, content: bytes, size: int, mode: int, durable: bool = False) -> bool:
    """Create path with content, size and mode unless something is there (True when it made it); the
    file appears whole (a temporary file linked into place) and never replaces another, with every
    block allocated (the library maps these files: a write to a hole of a shared mapping on a full
    disk is SIGBUS in the tenant, so a full disk fails here, in the agent, with ENOSPC). `durable`
    syncs it before it appears, for a file that must not come back empty after a power loss (the
    claim's region: one the library finds zeroed is refused, never made again). Every file the agent
    makes for the limiter is made here."""
    if os.path.lexists(path):
        return False
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        os.write(fd, content)
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        os.fchmod(fd, mode)  # explicit: the umask must not decide who may read or write it
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return True


def make_board(path: Path) -> bool:
    """An empty board at path unless one is there (True when it made it)."""
    return make_file(path, board_bytes([]), BOARD_BYTES, BOARD_MODE)


def board_is_sound(path: Path) -> bool:
    """Whether path is a board the agent can rewrite in place (a regular file of the size and magic)."""
    try:
        st = os.lstat(path)
        with open(path, "rb") as f:
            magic = f.read(len(BOARD_MAGIC))
    except OSError:
        return False
    return (st.st_mode & 0o170000) == 0o100000 and st.st_size == BOARD_BYTES and magic == BOARD_MAGIC


def write_board(path: Path, entries: Iterable[Entry]) -> None:
    """Rewrite the board's entries in place under the seqlock: seq made odd, the count and every
    entry slot written, seq made even. Readers that map the file never see a torn entry array."""
    count, area = pack_entries(entries)
    with _WRITING:
        _write_area(path, count, area)


def _write_area(path: Path | str, count: int, area: bytes) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        (seq,) = _SEQ.unpack(os.pread(fd, _SEQ.size, SEQ_OFFSET))
        _publish(fd, seq, count, area)
    finally:
        os.close(fd)


def _publish(fd: int, seq: int, count: int, area: bytes) -> int:
    """Write `count` entries' `area` under the sequence lock: an odd sequence while it is written, the next
    even one after; the sequence it leaves."""
    odd = seq + 1 if seq % 2 == 0 else seq + 2  # an odd seq is a write a killed agent left: past it
    os.pwrite(fd, _SEQ.pack(odd), SEQ_OFFSET)
    os.pwrite(fd, area, HEADER_BYTES)
    os.pwrite(fd, _HEADER.pack(BOARD_MAGIC, BOARD_VERSION, count), 0)
    os.pwrite(fd, _SEQ.pack(odd + 1), SEQ_OFFSET)
    return odd + 1


@dataclass(frozen=True)
class Written:
    """A board as one writer last wrote it: while the file has this inode and seq, nobody wrote since
    (every write moves seq on), so its entries need not be read again."""

    inode: int
    seq: int
    entries: tuple[Entry, ...]
    marked: frozenset[str] = frozenset()


def rewrite_board(
    path: Path | str,
    change: Callable[[list[Entry]], list[Entry]],
    last: Written | None = None,
    marks: Callable[[set[str]], Set[str]] | None = None,
) -> Written:
    """Rewrite the board's entries with `change(entries)`, in place as `write_board` does, through one
    descriptor; what it wrote. The entries are read from the file unless `last` still describes it; a
    board left mid-write (seq odd) or with an entry that is no entry gives []. The marks
    (FLAG_CONTRADICTED) of the claims that stay on it are kept, or become `marks(marked)`. BoardError
    when the file is no board (wrong size or magic), OldBoard when it is one of layout version 1 (left as
    it is), OSError when it cannot be opened (missing, a symlink)."""
    with _WRITING:
        return _rewrite(path, change, last, marks)


def _rewrite(
    path: Path | str,
    change: Callable[[list[Entry]], list[Entry]],
    last: Written | None,
    marks: Callable[[set[str]], Set[str]] | None,
) -> Written:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_size != BOARD_BYTES:
            raise BoardError(f"{path} is no board ({st.st_size} bytes, mode {st.st_mode:o})")
        header = os.pread(fd, HEADER_BYTES, 0)
        if header[: len(BOARD_MAGIC)] != BOARD_MAGIC:
            raise BoardError(f"{path} is no board (magic {header[: len(BOARD_MAGIC)]!r})")
        (seq,) = _SEQ.unpack_from(header, SEQ_OFFSET)
        if _HEADER.unpack_from(header)[1] == 1:
            raise OldBoard(f"{path} is a board of layout version 1")
        entries: list[Entry] = []
        marked: set[str] = set()
        if last is not None and (last.inode, last.seq) == (st.st_ino, seq):
            entries, marked = list(last.entries), set(last.marked)
        elif seq % 2 == 0:
            with contextlib.suppress(BoardError):
                area = os.pread(fd, BOARD_BYTES - HEADER_BYTES, HEADER_BYTES)
                entries, marked = _unpack(header, area), _marks(header, area)
        new = sorted(change(entries), key=_ORDER)
        kept = frozenset(set(marked if marks is None else marks(marked)) & {e.claim_uid for e in new})
        count, area = pack_entries(new, kept)
        written = _publish(fd, seq, count, area)
    finally:
        os.close(fd)
    return Written(st.st_ino, written, tuple(new), kept)


def mark_board(path: Path | str, marked: Set[str]) -> bool:
    """Mark exactly the claims of `marked` on the board FLAG_CONTRADICTED (the others' marks cleared),
    their entries as they are; whether it wrote (nothing is written when the marks are already these). A
    board that is missing, no board of this layout or mid-write is left alone (False): the marks are
    never worth a board's entries."""
    with _WRITING:
        try:
            header, area = _read_consistent(path)
            entries = _unpack(header, area)
        except (BoardError, OSError, UnicodeDecodeError):
            return False
        want = set(marked) & {e.claim_uid for e in entries}
        if want == _marks(header, area):
            return False
        _rewrite(path, lambda _: entries, None, lambda _: want)
        return True


def _v1_area(entries: Iterable[Entry]) -> tuple[int, bytes]:
    """(count, entry area) in layout version 1: the entries whose claim UID fits it, in board order."""
    fitting = [e for e in sorted(entries, key=_ORDER) if len(e.claim_uid.encode()) < V1_CLAIM_UID_BYTES]
    packed = b"".join(
        _V1_ENTRY.pack(e.claim_uid.encode(), e.floor, e.ceiling, PRIORITIES.index(e.priority), 0)
        for e in fitting[:V1_MAX_ENTRIES]
    )
    return min(len(fitting), V1_MAX_ENTRIES), packed.ljust(BOARD_BYTES - HEADER_BYTES, b"\0")


def read_board_v1(path: Path | str) -> list[Entry]:
    """The entries of a board of layout version 1 (seqlock, as `read_board`) that are entries of this
    one; BoardError if it is no such board, OSError if unreadable."""
    header, area = _read_consistent(path)
    magic, version, count = _HEADER.unpack_from(header)
    if magic != BOARD_MAGIC or version != 1 or count > V1_MAX_ENTRIES:
        raise BoardError(f"not a board of layout version 1 (magic {magic!r}, version {version})")
    entries = []
    for i in range(count):
        raw, floor, ceiling, priority, _ = _V1_ENTRY.unpack_from(area, i * V1_ENTRY_BYTES)
        with contextlib.suppress(BoardError, UnicodeDecodeError, IndexError):
            entries.append(Entry(raw.rstrip(b"\0").decode(), floor, ceiling, PRIORITIES[priority]))
    return entries


def write_board_v1(path: Path | str, entries: Iterable[Entry]) -> None:
    """Rewrite a board of layout version 1 in place with `entries` as the previous release did (seq
    odd, entries, header, seq even), for the processes that still map it; an entry whose claim UID does
    not fit version 1 is left off. OSError when it cannot be opened (FileNotFoundError: there is none),
    BoardError when it is no board of version 1 (left as it is)."""
    count, area = _v1_area(entries)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        header = os.pread(fd, HEADER_BYTES, 0)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_size != BOARD_BYTES or len(header) < 24:
            raise BoardError(f"{path} is no board ({st.st_size} bytes, mode {st.st_mode:o})")
        magic, version, _ = _HEADER.unpack_from(header)
        if magic != BOARD_MAGIC or version != 1:
            raise BoardError(f"{path} is no board of layout version 1 (magic {magic!r}, version {version})")
        (seq,) = _SEQ.unpack_from(header, SEQ_OFFSET)
        odd = seq + 1 if seq % 2 == 0 else seq + 2
        os.pwrite(fd, _SEQ.pack(odd), SEQ_OFFSET)
        os.pwrite(fd, area, HEADER_BYTES)
        os.pwrite(fd, _HEADER.pack(BOARD_MAGIC, 1, count), 0)
        os.pwrite(fd, _SEQ.pack(odd + 1), SEQ_OFFSET)
    finally:
        os.close(fd)


def v1_stand_in(claim_uid: str) -> str:
    """The name on ``board.v1`` of a claim whose activity file the previous release's library cannot map."""
    return claim_uid + V1_STAND_IN_SUFFIX


def claim_of(name: str) -> str:
    """The claim UID an activity file's name (less its suffix) belongs to: its own, or the one it stands in for."""
    return name.removesuffix(V1_STAND_IN_SUFFIX)


def v1_entry(entry: Entry) -> Entry:
    """A claim's entry on ``board.v1`` under its stand-in. A latency claim is written as a standard one: its
    stand-in is always active, and an always-active latency claim would hold every claim of the previous
    release's library to its floor (a besteffort one to nothing) for as long as it is on the GPU."""
    priority = Priority.STANDARD.value if entry.priority == Priority.LATENCY else entry.priority
    return Entry(v1_stand_in(entry.claim_uid), entry.floor, entry.ceiling, priority)


def make_v1_stand_in(path: Path | str) -> bool:
    """A stand-in activity file of layout version 1 (``V1_STAND_IN_SUFFIX``) unless one is there (True when
    made): the header of version 1 and a demand that never runs out (the library of version 1 counts a claim
    active while its ``demand_until_ns`` lies ahead)."""
    content = _ACTIVITY_HEADER.pack(ACTIVITY_MAGIC, 1, 0) + _ACTIVITY_FIELDS.pack(2**63 - 1, 0, 0, 0, 0)
    return make_file(path, content, ACTIVITY_BYTES, V1_STAND_IN_MODE)


def boot_id() -> bytes:
    """This boot's id as the library reads it (16 bytes; zero where the kernel does not say)."""
    try:
        with open(BOOT_ID_PATH) as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return bytes(16)


def activity_header(boot: bytes | None = None) -> bytes:
    """The agent's part of an activity file: magic, version and the boot (this one unless given)."""
    head = _ACTIVITY_HEADER.pack(ACTIVITY_MAGIC, ACTIVITY_VERSION, 0)
    return head.ljust(_BOOT_OFFSET, b"\0") + (boot_id() if boot is None else boot)


def make_activity(path: Path) -> bool:
    """A claim's activity file, header filled and the rest zero, unless one is there (True when made).
    An existing one is kept: the claim's processes may be reporting in it (a file kept over a reboot
    carries the boot it was written in, and the library counts none of its words until the claim's
    processes write it again in this one)."""
    return make_file(path, activity_header(), ACTIVITY_BYTES, ACTIVITY_MODE)


def activity_is_current(path: Path | str) -> bool:
    """Whether path is an activity file of this layout version (one of an older layout is upgraded)."""
    try:
        with open(path, "rb", buffering=0) as f:
            head = f.read(_ACTIVITY_HEADER.size)
    except OSError:
        return False
    return head[:12] == _ACTIVITY_HEADER.pack(ACTIVITY_MAGIC, ACTIVITY_VERSION, 0)[:12]


def upgrade_activity(path: Path | str) -> bool:
    """Bring an activity file of layout version 1 to this one in place (its words keep their offsets;
    version 2 adds the boot they belong to), so that a claim prepared before an upgrade keeps its file
    and its processes' mappings. Whether the file is of this layout now (False: missing or no activity
    file, which the caller makes or leaves)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        magic, version, _ = _ACTIVITY_HEADER.unpack(os.pread(fd, _ACTIVITY_HEADER.size, 0).ljust(16, b"\0"))
        if magic != ACTIVITY_MAGIC or version not in (1, ACTIVITY_VERSION):
            return False
        if version == 1:
            os.pwrite(fd, boot_id(), _BOOT_OFFSET)
            os.pwrite(fd, struct.pack("<I", ACTIVITY_VERSION), len(ACTIVITY_MAGIC))
        return True
    finally:
        os.close(fd)


def read_activity(path: Path) -> Activity | None:
    """What the claim reports, or None for a file that is missing or not an activity file (a claim
    that damaged its own file reports nothing)."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read(ACTIVITY_READ)
    except OSError:
        return None
    return parse_activity(data)


ACTIVITY_READ = _ACTIVITY_HEADER.size + _ACTIVITY_FIELDS.size
"""The bytes of an activity file a reader takes (`parse_activity`)."""


def parse_activity(data: bytes) -> Activity | None:
    """The first ACTIVITY_READ bytes of an activity file, read; None when they are not an activity file's."""
    if len(data) < _ACTIVITY_HEADER.size + _ACTIVITY_FIELDS.size:
        return None
    magic, version, _ = _ACTIVITY_HEADER.unpack_from(data)
    fields = _ACTIVITY_FIELDS.unpack_from(data, _ACTIVITY_HEADER.size)
    if magic != ACTIVITY_MAGIC or version != ACTIVITY_VERSION or min(fields) < 0:
        return None
    return Activity(*fields)
