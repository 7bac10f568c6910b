"""The arbitration board and activity files are laid out exactly as the limiter reads them.

The expected bytes are built here from the contract's table (offsets written out, not taken from the
module), so a change of the module's layout fails these tests.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from repo_paths import ROOT

from dra_gpu.limiter_abi import board
from dra_gpu.plugin.identity import MAX_UID


def contract_board(entries: list[tuple[bytes, int, int, int]], seq: int) -> bytes:
    """16384 bytes: magic, version 2, count, seq, 40 zero bytes, then 160-byte entries."""
    out = bytearray(16384)
    out[0:8] = b"DGPUBRD1"
    out[8:12] = (2).to_bytes(4, "little")
    out[12:16] = len(entries).to_bytes(4, "little")
    out[16:24] = seq.to_bytes(8, "little")
    for i, (uid, floor, ceiling, priority) in enumerate(entries):
        at = 64 + 160 * i
        out[at : at + len(uid)] = uid  # NUL-padded to 128
        out[at + 128 : at + 132] = floor.to_bytes(4, "little")
        out[at + 132 : at + 136] = ceiling.to_bytes(4, "little")
        out[at + 136 : at + 140] = priority.to_bytes(4, "little")
    return bytes(out)


def contract_board_v1(entries: list[tuple[bytes, int, int, int]], seq: int) -> bytes:
    """The previous release's layout (version 1): the same header with version 1, then 96-byte entries
    (claim UID NUL-terminated in 64 bytes, floor, ceiling, priority at 64, 68, 72)."""
    out = bytearray(16384)
    out[0:8] = b"DGPUBRD1"
    out[8:12] = (1).to_bytes(4, "little")
    out[12:16] = len(entries).to_bytes(4, "little")
    out[16:24] = seq.to_bytes(8, "little")
    for i, (uid, floor, ceiling, priority) in enumerate(entries):
        at = 64 + 96 * i
        out[at : at + len(uid)] = uid
        out[at + 64 : at + 68] = floor.to_bytes(4, "little")
        out[at + 68 : at + 72] = ceiling.to_bytes(4, "little")
        out[at + 72 : at + 76] = priority.to_bytes(4, "little")
    return bytes(out)


INFERENCE = board.Entry("4f0d7a52-3f0e-4b8e-9a8e-0c4b1d2e3f40", 30, 100, "latency")
TRAINING = board.Entry("9a1c2b3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d", 20, 100, "besteffort")
FIXED = board.Entry("1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b", 25, 25, "standard")


def test_the_board_the_agent_writes_is_the_contracts_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "board"
    assert board.make_board(path)
    assert path.read_bytes() == contract_board([], 0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444
    board.write_board(path, [TRAINING, INFERENCE, FIXED])
    expected = [
        (FIXED.claim_uid.encode(), 25, 25, 1),
        (INFERENCE.claim_uid.encode(), 30, 100, 0),
        (TRAINING.claim_uid.encode(), 20, 100, 2),
    ]
    assert path.read_bytes() == contract_board(expected, 2)
    board.write_board(path, [INFERENCE])
    assert path.read_bytes() == contract_board(expected[1:2], 4), "dropped entries leave zero slots"
    assert board.read_board(path) == [INFERENCE]


def test_the_board_is_rewritten_in_place_so_a_mapping_reader_keeps_seeing_it(tmp_path: Path) -> None:
    path = tmp_path / "board"
    board.make_board(path)
    inode = os.stat(path).st_ino
    with open(path, "rb") as mapped:
        board.write_board(path, [INFERENCE])
        assert os.stat(path).st_ino == inode
        assert os.pread(mapped.fileno(), 8, 12) == (1).to_bytes(4, "little") + (2).to_bytes(4, "little")


def test_a_seq_a_killed_writer_left_odd_is_passed_and_ends_even(tmp_path: Path) -> None:
    path = tmp_path / "board"
    path.write_bytes(contract_board([], 7))
    board.write_board(path, [FIXED])
    assert int.from_bytes(path.read_bytes()[16:24], "little") == 10


def test_a_rewrite_reads_back_what_another_writer_put_on_the_board_since(tmp_path: Path) -> None:
    """The agent skips reading a board it wrote last; a write by anyone else (another agent process during
    an update) moves seq on, and the next rewrite keeps that writer's entries."""
    path = tmp_path / "board"
    board.make_board(path)
    mine = board.rewrite_board(path, lambda entries: [*entries, INFERENCE])
    assert mine.entries == (INFERENCE,) and mine.seq == 2
    assert path.read_bytes() == contract_board([(INFERENCE.claim_uid.encode(), 30, 100, 0)], 2)
    board.write_board(path, [INFERENCE, TRAINING])  # the other writer, within the same clock tick
    again = board.rewrite_board(path, lambda entries: [*entries, FIXED], last=mine)
    assert again.entries == tuple(sorted([INFERENCE, TRAINING, FIXED])) == tuple(board.read_board(path))
    unread = board.rewrite_board(path, lambda entries: entries, last=again)
    assert unread == board.Written(again.inode, again.seq + 2, again.entries)
    path.write_bytes(b"x" * 16384)
    with pytest.raises(board.BoardError):
        board.rewrite_board(path, lambda entries: entries, last=unread)


def test_a_reader_never_sees_a_torn_board_while_the_agent_rewrites_it(tmp_path: Path) -> None:
    path = tmp_path / "board"
    board.make_board(path)
    sets = [[INFERENCE, TRAINING], [FIXED]]
    stop = threading.Event()
    seen: list[list[board.Entry]] = []

    def write() -> None:
        for n in range(400):
            board.write_board(path, sets[n % 2])
        stop.set()

    writer = threading.Thread(target=write)
    writer.start()
    while not stop.is_set():
        try:
            seen.append(board.read_board(path))
        except board.BoardError:
            continue  # kept changing: a reader retries later
    writer.join()
    valid = [[], sorted(sets[0]), sets[1]]
    assert all(s in valid for s in seen)


def test_a_board_of_layout_1_is_never_rewritten_in_this_layout_and_is_kept_in_its_own(tmp_path: Path) -> None:
    """The previous release's library checked the layout only when it mapped the board: the agent leaves
    a version-1 board as it is (OldBoard) and writes one it moved aside in version 1, under the same
    seqlock, every claim whose UID fits that layout on it."""
    path = tmp_path / "board.v1"
    path.write_bytes(contract_board_v1([(INFERENCE.claim_uid.encode(), 30, 100, 0)], 6))
    with pytest.raises(board.OldBoard):
        board.rewrite_board(path, lambda entries: [FIXED])
    assert board.read_board_v1(path) == [INFERENCE], "left as it was"
    long = board.Entry("x" * 64, 5, 5)
    board.write_board_v1(path, [TRAINING, long, FIXED, INFERENCE])
    expected = [
        (FIXED.claim_uid.encode(), 25, 25, 1),
        (INFERENCE.claim_uid.encode(), 30, 100, 0),
        (TRAINING.claim_uid.encode(), 20, 100, 2),
    ]
    assert path.read_bytes() == contract_board_v1(expected, 8), "a UID of 64 bytes does not fit: left off"
    board.write_board_v1(path, [])
    assert path.read_bytes() == contract_board_v1([], 10)
    path.write_bytes(contract_board([], 0))
    with pytest.raises(board.BoardError):
        board.write_board_v1(path, [FIXED])
    assert path.read_bytes() == contract_board([], 0), "a board of this layout is not written as version 1"


def test_an_activity_file_is_made_with_its_header_and_the_claim_may_write_it(tmp_path: Path) -> None:
    path = tmp_path / f"{INFERENCE.claim_uid}.activity"
    assert board.make_activity(path)
    data = path.read_bytes()
    assert len(data) == 4096 and data[:16] == b"DGPUACT1" + (2).to_bytes(4, "little") + bytes(4)
    boot = uuid.UUID(Path("/proc/sys/kernel/random/boot_id").read_text().strip()).bytes
    assert data[16:56] == bytes(40) and data[56:72] == boot, "the boot its words belong to, at 56"
    assert data[72:] == bytes(4096 - 72)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    with open(path, "r+b") as f:  # the library's fields: demand, used, borrowed, waiting, held
        f.seek(16)
        f.write(b"".join(v.to_bytes(8, "little") for v in (5, 3_000_000, 1_000_000, 2, 400)))
    assert board.read_activity(path) == board.Activity(5, 3_000_000, 1_000_000, 2, 400)
    assert not board.make_activity(path), "an existing file is kept"
    assert board.read_activity(path) is not None


def test_an_activity_file_the_claim_damaged_reports_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.activity"
    board.make_activity(path)
    with open(path, "r+b") as f:
        f.write(b"FORGED!!")
    assert board.read_activity(path) is None
    board.make_activity(path.with_name("y.activity"))
    with open(path.with_name("y.activity"), "r+b") as f:  # a negative count: the library's fields are int64
        f.seek(24)
        f.write((-5).to_bytes(8, "little", signed=True))
    assert board.read_activity(path.with_name("y.activity")) is None
    os.truncate(path, 20)
    assert board.read_activity(path) is None


@pytest.mark.parametrize(
    ("uid", "floor", "ceiling", "priority"),
    [("a" * 129, 10, 10, "standard"), ("u", 0, 10, "standard"), ("u", 50, 40, "standard"), ("u", 1, 1, "rt")],
)
def test_an_entry_the_library_would_refuse_is_never_written(
    uid: str, floor: int, ceiling: int, priority: str
) -> None:
    with pytest.raises(board.BoardError):
        board.Entry(uid, floor, ceiling, priority)


def test_a_board_that_is_not_one_is_refused_when_read(tmp_path: Path) -> None:
    path = tmp_path / "board"
    path.write_bytes(b"\0" * 16384)
    with pytest.raises(board.BoardError):
        board.read_board(path)
    path.write_bytes(contract_board([], 0)[:100])
    with pytest.raises(board.BoardError):
        board.read_board(path)


def test_a_claim_uid_as_long_as_the_agent_accepts_fills_its_entry(tmp_path: Path) -> None:
    path = tmp_path / "board"
    board.make_board(path)
    longest = board.Entry("u" * MAX_UID, 10, 40, "besteffort")
    board.write_board(path, [longest, FIXED])
    assert board.read_board(path) == sorted([longest, FIXED])
    assert path.read_bytes() == contract_board(
        [(FIXED.claim_uid.encode(), 25, 25, 1), (b"u" * 128, 10, 40, 2)], 2
    )


def test_floors_never_sum_past_the_gpu_so_the_board_never_overflows() -> None:
    ones = [board.Entry(f"c{i:03d}", 1, 100, "besteffort") for i in range(board.MAX_ENTRIES)]
    assert board.over_floors(ones[:-1], ones[-1]) is None
    problem = board.over_floors(ones, board.Entry("c100", 1, 1))
    assert problem is not None and "100 claims with floors summing to 100%" in problem
    assert board.over_floors(ones, ones[5]) is None, "a claim already on the board is not counted twice"
    sixty = board.Entry("a", 60, 60)
    assert board.over_floors([sixty], board.Entry("b", 41, 41)) is not None
    assert board.over_floors([sixty], board.Entry("b", 40, 40)) is None
    assert board.pack_entries(ones)[0] == board.MAX_ENTRIES


def test_a_contradicted_claim_is_marked_in_its_entrys_flags_word_and_the_mark_outlives_other_writes(
    tmp_path: Path,
) -> None:
    """The node's mark sits in the entry's word at offset 140 (zero in every board an older agent wrote, never
    read by an older library); a rewrite for another claim's prepare keeps it, a claim that leaves loses it,
    and a board mid-write is never rewritten for a mark."""
    path = tmp_path / "board"
    board.make_board(path)
    board.rewrite_board(path, lambda _: [INFERENCE, TRAINING])
    assert board.mark_board(path, {TRAINING.claim_uid, "not-on-the-board"})
    data = path.read_bytes()
    assert [int.from_bytes(data[64 + 160 * i + 140 : 64 + 160 * i + 144], "little") for i in range(2)] == [
        0,
        1,
    ]
    assert not board.mark_board(path, {TRAINING.claim_uid}), "the same marks: nothing written"
    written = board.rewrite_board(path, lambda entries: [*entries, FIXED])
    assert board.read_marks(path) == {TRAINING.claim_uid} and written.marked == {TRAINING.claim_uid}
    assert board.read_board(path) == sorted([INFERENCE, TRAINING, FIXED])
    board.rewrite_board(path, lambda entries: [e for e in entries if e != TRAINING], last=written)
    assert board.read_marks(path) == set()
    assert board.mark_board(path, {INFERENCE.claim_uid}) and not board.mark_board(tmp_path / "none", {"x"})
    assert board.mark_board(path, set()) and board.read_marks(path) == set()
    seq = int.from_bytes(path.read_bytes()[16:24], "little")
    with open(path, "r+b") as f:
        f.seek(16)
        f.write((seq + 1).to_bytes(8, "little"))  # a write a killed agent left
    assert not board.mark_board(path, {INFERENCE.claim_uid})
    assert path.read_bytes()[16:24] == (seq + 1).to_bytes(8, "little"), "left as it was"


def test_the_library_reads_the_layouts_the_agent_writes() -> None:
    """One version per layout, in the module and in the library's source: a layout change bumps both."""
    source = (ROOT / "native/limiter/src/arbiter.c").read_text()
    defined = dict(re.findall(r"^#define (\w+) (\d+)", source, re.MULTILINE))
    assert int(defined["BOARD_VERSION"]) == board.BOARD_VERSION
    assert int(defined["BOARD_MAX"]) == board.MAX_ENTRIES
    assert int(defined["UID_BYTES"]) == board.CLAIM_UID_BYTES == MAX_UID
    assert int(defined["BOARD_BYTES"]) == board.BOARD_BYTES
    assert int(defined["ACTIVITY_VERSION"]) == board.ACTIVITY_VERSION
    assert int(defined["ACTIVITY_BYTES"]) == board.ACTIVITY_BYTES
    assert re.search(rf"^#define FLAG_CONTRADICTED {board.FLAG_CONTRADICTED}u$", source, re.MULTILINE)


FULL_DISK = """
import errno, os, subprocess, sys
from pathlib import Path
from dra_gpu.limiter_abi import board
disk = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
try:
    board.make_file(disk / "region", b"head", 1 << 20, 0o666)
except OSError as exc:
    print("refused", errno.errorcode[exc.errno], sorted(os.listdir(disk)))
else:
    print("made", os.stat(disk / "region").st_blocks * 512)
assert board.make_activity(disk / "a.activity")
print("activity", os.stat(disk / "a.activity").st_blocks * 512)
"""


def test_a_file_the_library_maps_is_never_sparse_so_a_full_disk_fails_in_the_agent(tmp_path: Path) -> None:
    """A write through a shared mapping to a block the disk cannot give is SIGBUS in the tenant: the agent
    allocates every block when it makes the file, and a full disk fails there, with nothing left behind."""
    made = tmp_path / "made"
    assert board.make_file(made, b"x", 1 << 20, 0o666)
    assert os.stat(made).st_blocks * 512 >= 1 << 20, "every block allocated"
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("a full disk needs a small tmpfs, mounted in a user namespace with unshare(1)")
    disk = tmp_path / "disk"
    disk.mkdir()
    run = subprocess.run(
        [unshare, "--map-root-user", "--mount", sys.executable, "-c", FULL_DISK, str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if "Operation not permitted" in run.stderr:
        pytest.skip(f"no user namespace for the small tmpfs here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "refused ENOSPC []", "the 1 MiB file on a 64 KiB disk is refused, no file left"
    assert lines[1] == "activity 4096"
