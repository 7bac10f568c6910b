"""A limiter claim's place in its GPU's compute arbitration: the per-GPU directory, board and activity file.

For each GPU on which a claim has a limiter compute share below 100 %, the claim holds
``arbitration:<gpu>:<claim-uid>``; applying it (under the GPU's lock, as every hold naming a GPU)

1. makes ``<state dir>/gpus/<gpu-uuid>/`` (root, 0755) and its empty ``board`` if they are not there;
2. makes the claim's ``<claim-uid>.activity`` there (kept if present: the claim may be reporting in it)
   and hard-links it as ``<claim dir>/limiter/<gpu-uuid>.activity``, the source of the claim's own
   read-write file mount;
3. rewrites the board with the claim's entry (floor, ceiling, priority) added or replaced.

A board of layout version 1 (the previous release's) is never rewritten in this layout: its library
checked the version only when it mapped the board. The first rewrite moves it aside to ``board.v1``
(the same inode, so those mappings keep it), makes a new board with its entries, and every rewrite
after that writes the v1 board too, in its own layout (a claim UID too long for it left off). A claim
whose activity file this release made while ``board.v1`` is kept is named there by its stand-in
(``layout.V1_STAND_IN_SUFFIX``), an activity file of version 1 that says it is always active: the
previous release's library maps no activity file of version 2, and would otherwise take the claim for
idle and borrow its floor.

Releasing it takes the entry off the board first (the library stops counting the claim before its
file goes), then removes both names of the activity file. The GPU's directory and board stay when its
last claim goes (the next claim on the GPU would make them again): the stale-claim sweep removes the
directory of a GPU that no claim is on (`remove_if_empty`), whether the GPU is still on the node or not.
Every step is idempotent, so a repeated prepare or a restore after a crash or a reboot converges, and
the board always lists exactly the claims whose holds were applied and not released. The board is
its own record: a claim's entry is read back from it (or from what this process last wrote there, while
the board's inode and seq say nobody wrote since), so the handler needs no other claim's hold.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Set
from pathlib import Path

from dra_gpu.inventory import GpuInfo
from dra_gpu.limiter_abi import board as layout
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.sharing.plan import NodeContext, setup_failed
from dra_gpu.plugin.sharing.steps.directories import temp_files

KIND = "arbitration"
DIR_MODE = 0o755


def gpus_root(node: NodeContext) -> str:
    """The directory of every GPU's arbitration directory (a string: prepare joins paths on it per claim)."""
    return os.path.join(node.state_dir, layout.GPUS_DIR)


def gpu_dir(node: NodeContext, gpu_uuid: str) -> str:
    return os.path.join(node.state_dir, layout.GPUS_DIR, gpu_uuid)


def hold_key(gpu_uuid: str, claim_uid: str) -> str:
    return f"{KIND}:{gpu_uuid}:{claim_uid}"


def _entry(hold: Hold) -> layout.Entry:
    p = hold.params
    return layout.Entry(str(p["claim"]), int(p["floor"]), int(p["ceiling"]), str(p["priority"]))


_read_boards: dict[str, tuple[tuple[int, int, int, int, int], list[layout.Entry]]] = {}
"""board -> (its file's stat signature, its entries): the supervisor checks every claim's hold every few
seconds, and a GPU's 50 claims need not read its board 50 times. Only the agent writes a board, and
every write of ours drops the entry here."""
_written: dict[str, layout.Written] = {}
"""board -> what this process last wrote there: a rewrite reads the entries back only if someone wrote
since (its seq moved on, or it is another file)."""


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)


def _sound_entries(board: str) -> list[layout.Entry] | None:
    """The entries of a sound board (None: missing or not a board), read again only when it changed."""
    try:
        signature = _signature(os.lstat(board))
    except OSError:
        return None
    cached = _read_boards.get(board)
    if cached is not None and cached[0] == signature:
        return cached[1]
    if not layout.board_is_sound(Path(board)):
        return None
    try:
        entries = layout.read_board(Path(board))
    except (layout.BoardError, OSError, UnicodeDecodeError):
        return None
    _read_boards[board] = (signature, entries)
    return entries


def _entries(board: str) -> list[layout.Entry]:
    """The board's entries (those of a board of layout version 1 the next rewrite moves aside too); a
    board that cannot be read as one starts empty (only the agent writes it, so this is a file a
    killed agent or someone on the host broke: it is rebuilt from the holds)."""
    try:
        return layout.read_board(Path(board))
    except (layout.BoardError, OSError, UnicodeDecodeError):
        pass
    try:
        return layout.read_board_v1(board)
    except (layout.BoardError, OSError):
        return []


def over_floors(node: NodeContext, gpu_uuid: str, claim_uid: str, floor: int) -> str | None:
    """Why a claim with `floor` may not join the GPU's board (the floors there would sum past 100 %,
    or it would hold more claims than it can); None when it may. The caller holds the GPU's lock."""
    board = os.path.join(gpu_dir(node, gpu_uuid), layout.BOARD_FILE)
    return layout.over_floors(_entries(board), layout.Entry(claim_uid, floor, floor))


def _make_dir(path: str) -> None:
    """`path` a directory of mode 0755 (explicit: every UID of every claim reads the board), made if missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, DIR_MODE)
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _link(target: str, link: str) -> None:
    """`link` becomes another name of `target`, replacing whatever was there in one rename."""
    try:
        os.link(target, link)  # the common case: nothing there yet
        return
    except FileExistsError:
        if _same_file(target, link):
            return
    directory, name = os.path.split(link)
    tmp = os.path.join(directory, f".{name}.{os.getpid() % 2**32:08x}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.link(target, tmp)
    os.replace(tmp, link)


def _unlink(path: str) -> None:
    for leftover in [path, *map(str, temp_files(Path(path)))]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)


def update_board(
    directory: Path | str,
    put: layout.Entry | None = None,
    drop: Set[str] = frozenset(),
    made: bool = False,
) -> list[str]:
    """Rewrite the GPU's board with `put` added or replaced and the claims in `drop` taken off; the
    claim UIDs left on it. A board that is missing or no board is made anew first. `made`: `put`'s
    activity file was made by this release, so where a ``board.v1`` is kept it gets a stand-in there."""
    board = os.path.join(directory, layout.BOARD_FILE)

    def change(entries: list[layout.Entry]) -> list[layout.Entry]:
        kept = [
            e for e in entries if e.claim_uid not in drop and (put is None or e.claim_uid != put.claim_uid)
        ]
        return kept if put is None else [*kept, put]

    v1 = os.path.join(directory, layout.BOARD_V1_FILE)
    _read_boards.pop(board, None)
    try:
        written = layout.rewrite_board(board, change, _written.get(board))
    except layout.OldBoard:  # the previous release's: its library may have it mapped, so it moves aside
        _written.pop(board, None)
        carried = _entries(board)[: layout.MAX_ENTRIES - 1]
        fresh = os.path.join(directory, f".{layout.BOARD_FILE}.{os.getpid() % 2**32:08x}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fresh)
        layout.make_board(Path(fresh))
        written = layout.rewrite_board(fresh, lambda _: change(carried))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(v1)  # one an earlier rollback left: what is at the path now is newer
        os.link(board, v1)
        os.replace(fresh, board)  # the path is never without a board
    except (layout.BoardError, OSError):  # missing, or broken by a killed agent or someone on the host
        _written.pop(board, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(board)
        layout.make_board(Path(board))
        written = layout.rewrite_board(board, change)
    _written[board] = written
    if os.path.lexists(v1):
        if (
            put is not None
            and made
            and len(layout.v1_stand_in(put.claim_uid).encode()) < layout.V1_CLAIM_UID_BYTES
        ):
            layout.make_v1_stand_in(
                os.path.join(directory, layout.activity_name(layout.v1_stand_in(put.claim_uid)))
            )
        with contextlib.suppress(FileNotFoundError, layout.BoardError):
            layout.write_board_v1(v1, [_v1_entry(directory, e) for e in written.entries])
    return [e.claim_uid for e in written.entries]


def _v1_entry(directory: Path | str, entry: layout.Entry) -> layout.Entry:
    """A claim's entry on ``board.v1``: under its stand-in where it has one."""
    stand_in = os.path.join(directory, layout.activity_name(layout.v1_stand_in(entry.claim_uid)))
    return layout.v1_entry(entry) if os.path.lexists(stand_in) else entry


def remove_if_empty(directory: Path | str) -> bool:
    """Remove the GPU's directory if no claim is on it: the board lists nobody and no claim's activity
    file is left (a board made by a prepare that is still running keeps it). A stand-in left then is
    one whose claim an agent that knows nothing of stand-ins unprepared (a rollback): it goes too. The
    caller holds the GPU's lock. Whether it is gone."""
    board = os.path.join(directory, layout.BOARD_FILE)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return True
    stand_ins = [n for n in names if n.endswith(layout.V1_STAND_IN_SUFFIX + layout.ACTIVITY_SUFFIX)]
    if any(n.endswith(layout.ACTIVITY_SUFFIX) for n in names if n not in stand_ins) or _entries(board):
        return False
    _read_boards.pop(board, None)
    _written.pop(board, None)
    for name in stand_ins:
        _unlink(os.path.join(directory, name))
    _unlink(board)
    _unlink(os.path.join(directory, layout.BOARD_V1_FILE))
    with contextlib.suppress(OSError):
        os.rmdir(directory)
    return not os.path.lexists(directory)


def gpu_dirs(node: NodeContext) -> list[str]:
    """The GPU UUIDs that have an arbitration directory under the state directory."""
    try:
        return sorted(e.name for e in os.scandir(gpus_root(node)) if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


class ClaimArbitration:
    kind = KIND

    def apply(self, hold: Hold, node: NodeContext) -> None:
        entry = _entry(hold)
        root = gpus_root(node)
        directory = os.path.join(root, str(hold.params["gpu"]))
        activity = os.path.join(directory, layout.activity_name(entry.claim_uid))
        try:
            _make_dir(root)
            _make_dir(directory)
            made = layout.make_activity(Path(activity))
            if not made:
                layout.upgrade_activity(activity)  # kept: one made before an upgrade gets this layout
            _link(activity, str(hold.params["link"]))
            update_board(directory, put=entry, made=made)
        except OSError as exc:
            raise setup_failed(f"setting up {directory} for claim {entry.claim_uid}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        claim = str(hold.params["claim"])
        directory = gpu_dir(node, str(hold.params["gpu"]))
        try:
            if os.path.isdir(directory):
                update_board(directory, drop={claim})
            # Temporary files of an interrupted link or activity file are not looked for here: the
            # claim's directory goes whole with its `dir` hold, and the sweep removes old ones in the GPU's.
            for name in (
                str(hold.params["link"]),
                os.path.join(directory, layout.activity_name(claim)),
                os.path.join(directory, layout.activity_name(layout.v1_stand_in(claim))),
            ):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
        except OSError as exc:
            raise setup_failed(f"taking claim {claim} off {directory}", exc) from None

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        entry = _entry(hold)
        directory = gpu_dir(node, str(hold.params["gpu"]))
        activity = os.path.join(directory, layout.activity_name(entry.claim_uid))
        entries = _sound_entries(os.path.join(directory, layout.BOARD_FILE))
        return (
            entries is not None
            and entry in entries
            and _same_file(activity, str(hold.params["link"]))
            and layout.activity_is_current(activity)
        )

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        """After the checkpoint was rebuilt: claims on the GPU's board that no record holds come off,
        with their activity files. (Only the GPU's own directory: the caller holds that GPU's lock, not
        its MIG devices'; a MIG device's entries go with their claims' unprepare.)"""
        directory = gpu_dir(node, gpu.uuid)
        if not os.path.isdir(directory):
            return
        listed = {e.claim_uid for e in _entries(os.path.join(directory, layout.BOARD_FILE))}
        files = {
            layout.claim_of(n[: -len(layout.ACTIVITY_SUFFIX)])
            for n in os.listdir(directory)
            if n.endswith(layout.ACTIVITY_SUFFIX)
        }
        stale = {uid for uid in listed | files if hold_key(gpu.uuid, uid) not in held}
        if stale:
            update_board(directory, drop=stale)
            for uid in stale:
                _unlink(os.path.join(directory, layout.activity_name(uid)))
                _unlink(os.path.join(directory, layout.activity_name(layout.v1_stand_in(uid))))
        remove_if_empty(directory)


HOLD_HANDLERS = (ClaimArbitration(),)
