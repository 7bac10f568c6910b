"""Per-claim directories and files on the host (the limiter's shared accounting state, the claim's
limits file), removed on unprepare.

Files are written to a temporary name and renamed, without an fsync: a killed agent leaves the old
file or the new one, and after a power loss (the only case an fsync would cover) the claim's record
is from another boot, so the repeated prepare rewrites every file whose content is not what the
record says before it rewrites the CDI spec that mounts it. A kill between creating the temporary
file and renaming it leaves `.<name>.XXXXXXXX` behind: releasing the file removes those too, and the
stale-claim sweep removes old ones anywhere in the claims' directories.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Set
from pathlib import Path

from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.plan import NodeContext, setup_failed


class ClaimDirectory:
    kind = "dir"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        path = str(hold.params["path"])
        try:
            _make_dirs(path)
            # Explicit chmod: the umask must not decide whether a pod's non-root user may write here.
            os.chmod(path, int(hold.params.get("mode", 0o700)))
        except OSError as exc:
            raise setup_failed(f"creating {path}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        path = str(hold.params["path"])
        try:
            os.rmdir(path)  # the common case: the holds released before it emptied it
        except FileNotFoundError:
            pass
        except OSError:
            remove_tree(Path(path))
        _remove_empty_parents(path, node)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return os.path.isdir(str(hold.params["path"]))

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


def _make_dirs(path: str) -> None:
    """`path` and its missing parents, made as `Path.mkdir(parents=True, exist_ok=True)` does."""
    try:
        os.mkdir(path)
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def remove_tree(path: Path) -> None:
    """Remove a directory and everything in it (nothing there is fine); PrepareError naming the first
    file that could not be removed, and how many more."""
    problems: list[OSError] = []

    def failed(_function: object, _path: str, exc_info: tuple[type, BaseException, object]) -> None:
        if isinstance(exc_info[1], OSError) and not isinstance(exc_info[1], FileNotFoundError):
            problems.append(exc_info[1])

    shutil.rmtree(path, onerror=failed)
    if problems:
        error = setup_failed(f"removing {path}", problems[0])
        if len(problems) > 1:
            error = PrepareError(f"{error.message} (and {len(problems) - 1} more)", reason=error.reason)
        raise error


def _remove_empty_parents(path: str, node: NodeContext) -> None:
    """The directories between `path` and the claims' directory that are empty now, bottom up (one that
    is not empty keeps its parents)."""
    claims_root = os.path.join(node.state_dir, "claims")
    parent = os.path.dirname(path)
    while parent != claims_root and parent.startswith(claims_root + os.sep):
        try:
            os.rmdir(parent)
        except FileNotFoundError:
            pass
        except OSError:
            return
        parent = os.path.dirname(parent)


TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}")
"""`tempfile.mkstemp(prefix=f".{name}.")`: what an interrupted write of `name` leaves."""


def temp_files(path: Path) -> list[Path]:
    """The temporary files an interrupted write of `path` left beside it."""
    return [path.parent / n for n in _temp_names(str(path))]


def _temp_names(path: str) -> list[str]:
    directory, name = os.path.split(path)
    prefix = f".{name}."
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [n for n in names if n.startswith(prefix) and len(n) == len(prefix) + 8 and TEMP_NAME.fullmatch(n)]


def claim_temp_files(claims_root: Path) -> list[Path]:
    """Temporary files of interrupted writes in every directory under `claims_root` (each claim's, where
    `ClaimFile`s are; each GPU's arbitration directory)."""
    found: list[Path] = []
    try:
        claims = list(os.scandir(claims_root))
    except OSError:
        return found
    for claim in claims:
        if not claim.is_dir(follow_symlinks=False):
            continue
        try:
            names = os.listdir(claim.path)
        except OSError:
            continue
        found += [Path(claim.path) / n for n in names if n.startswith(".") and TEMP_NAME.fullmatch(n)]
    return found


class ClaimFile:
    """A file with fixed content (e.g. the claim's limits), replaced atomically: a reader sees the
    old file or the new one, never a part."""

    kind = "file"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        path = str(hold.params["path"])
        content = str(hold.params["content"]).encode()
        if _holds(path, content):
            return
        directory, name = os.path.split(path)
        try:
            try:
                fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
            except (FileNotFoundError, NotADirectoryError):  # made here, or failing with the directory's name
                _make_dirs(directory)
                fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
            try:
                try:
                    view = memoryview(content)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fchmod(fd, int(hold.params.get("mode", 0o444)))
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise setup_failed(f"writing {path}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        path = str(hold.params["path"])
        directory = os.path.dirname(path)
        for leftover in [path, *(os.path.join(directory, n) for n in _temp_names(path))]:
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise setup_failed(f"removing {leftover}", exc) from None
        _remove_empty_parents(path, node)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return _holds(str(hold.params["path"]), str(hold.params["content"]).encode())

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


def _holds(path: str, content: bytes) -> bool:
    """Whether the file at `path` holds exactly `content`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, len(content) + 1) == content
    except OSError:
        return False
    finally:
        os.close(fd)


HOLD_HANDLERS = (ClaimDirectory(), ClaimFile())
