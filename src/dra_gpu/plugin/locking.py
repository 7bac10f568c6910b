"""The locks around prepare and unprepare: one per GPU for slow work, one per node for shared files.

The kubelet may call us concurrently (grpcio runs handlers on a thread pool) and, during a rolling
update, two plugin processes serve the same node. Each lock is a process lock *and* an fcntl lock on
a file in the plugin data directory, as the Go helper does with ``serialize.lock``; the kernel drops
a file lock when its process dies, so a crashed plugin never blocks its successor.

- ``KeyLocks`` (per GPU, and per claim within the process) are held across the slow steps: API
  reads, ``nvidia-smi``, starting an MPS daemon. A GPU command that hangs blocks only the claims of
  that GPU.
- ``NodeLock`` is held only over read-modify-writes of the checkpoint and CDI spec writes, which
  take milliseconds. It is re-entrant within a thread, so a step that already holds it can call
  another that takes it. Order: key locks first, then the node lock, never the reverse.
- A claim's key (``claim:<uid>``) is locked across processes too when `KeyLocks` is given a claims
  directory: one file per claim, made for the hold and removed at its end, so that two plugin
  processes never prepare or unprepare the same claim at once, whatever its GPUs.
- ``LeaderLock`` is held for as long as a process does a node-wide duty only one may do at a time
  (publishing the node's ResourceSlices); the next one takes it when the holder leaves or dies.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

LOCK_FILE_NAME = "serialize.lock"
GPU_LOCK_DIR_NAME = "gpu-locks"
CLAIM_LOCK_DIR_NAME = "claim-locks"
"""In the state directory: each claim's lock file while a call works on it (`KeyLocks`)."""
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
KEPT_FILES = 64
"""Lock files kept open per KeyLocks: a node's GPUs (keys of MIG instances come and go beyond)."""


class LockTimeout(Exception):
    """The lock was not obtained in time; the message says who is likely holding it."""


def _flock(fd: int, deadline: float, busy: str) -> None:
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(busy) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.01)


class NodeLock:
    """A re-usable, re-entrant process + file lock; ``hold()`` is the only way in."""

    def __init__(self, path: Path, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._thread_lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._fd: int | None = None
        self.holds = 0
        """Counts the outermost holds: what was read under one of them stays true until it ends."""

    def _file(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    @contextmanager
    def hold(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        deadline = time.monotonic() + self.timeout_s
        if not self._thread_lock.acquire(timeout=self.timeout_s):
            raise LockTimeout(
                f"another call in this plugin has held the node's state files for more than {self.timeout_s:.0f}s"
            )
        try:
            fd = self._file()
            _flock(
                fd,
                deadline,
                f"another plugin process has held {self.path} for more than {self.timeout_s:.0f}s "
                f"(a second plugin pod on this node during an update?)",
            )
            self._owner, self._depth = me, 1
            self.holds += 1
            try:
                yield
            finally:
                self._owner, self._depth = None, 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class KeyLocks:
    """One lock per key, taken in sorted order so that two callers never wait on each other in a cycle.

    Keys of GPUs (their UUIDs) are also locked across processes, with one file per GPU under
    `directory`; keys starting with `claim:` serialize calls for one claim within the process only.
    """

    def __init__(
        self, directory: Path, timeout_s: float = 30.0, claims_directory: Path | None = None
    ) -> None:
        self.directory = directory
        self.timeout_s = timeout_s
        self.claims_directory = claims_directory
        """Where claims' lock files are made; None: claims are locked within the process only."""
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}
        """Key -> its lock and how many callers hold or wait for it; dropped when none does, so that
        the keys of claims long gone (one per claim UID ever seen) take no memory."""
        self._files: dict[str, int] = {}
        """Key -> its lock file, kept open (a GPU's is used by every call on it), at most KEPT_FILES."""

    @contextmanager
    def _lock(self, key: str) -> Iterator[threading.Lock]:
        with self._guard:
            lock, users = self._locks.get(key) or (threading.Lock(), 0)
            self._locks[key] = (lock, users + 1)
        try:
            yield lock
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    @contextmanager
    def _hold_one(self, key: str, deadline: float, call_deadline: bool = False) -> Iterator[None]:
        what = key.removeprefix("claim:") if key.startswith("claim:") else f"GPU {key}"
        busy = (
            f"{what} was busy with another prepare or unprepare until the deadline of the kubelet's call; "
            f"nothing was changed, the kubelet's next call tries again"
            if call_deadline
            else f"{what} has been busy with another prepare or unprepare for more than {self.timeout_s:.0f}s "
            f"(a GPU command that does not return?)"
        )
        with self._lock(key) as lock:
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise LockTimeout(busy)
            try:
                if key.startswith("claim:"):
                    if self.claims_directory is None:
                        yield
                    else:
                        with _claim_file(self.claims_directory, key.removeprefix("claim:"), deadline, busy):
                            yield
                    return
                fd, kept = self._file(key)
                try:
                    _flock(fd, deadline, busy)
                    try:
                        yield
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    if not kept:
                        os.close(fd)
            finally:
                lock.release()

    def _file(self, key: str) -> tuple[int, bool]:
        """The key's lock file (its thread lock held), and whether it stays open after the hold."""
        fd = self._files.get(key)
        if fd is not None:
            return fd, True
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{_SAFE_NAME.sub('_', key)}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with self._guard:
            if len(self._files) < KEPT_FILES:
                self._files[key] = fd
                return fd, True
        return fd, False

    @contextmanager
    def hold(self, keys: Iterable[str], deadline: float | None = None) -> Iterator[None]:
        """Hold every key, waiting at most the timeout, and never past `deadline` (time.monotonic)."""
        limit = time.monotonic() + self.timeout_s
        by_call = deadline is not None and deadline < limit
        if deadline is not None and by_call:
            limit = deadline
        with ExitStack() as stack:
            for key in sorted(set(keys)):
                stack.enter_context(self._hold_one(key, limit, by_call))
            yield


@contextmanager
def _claim_file(directory: Path, uid: str, deadline: float, busy: str) -> Iterator[None]:
    """Hold `<directory>/<uid>.lock`, made for the hold and removed at its end.

    A waiter may lock a file the holder has just removed: it finds the name gone (or another file
    under it) and starts over, so exactly one process holds the claim's current file. `uid` is a
    claim UID checked at the gRPC boundary (a path component)."""
    path = directory / f"{_SAFE_NAME.sub('_', uid)}.lock"
    while True:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            _flock(fd, deadline, busy)
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)  # still holding it: a waiter on this file starts over on a new one
        finally:
            os.close(fd)


class LeaderLock:
    """An exclusive lock on a file, held until `release()` or the process's end (the kernel drops it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never waits."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, b"%d\n" % os.getpid())  # who holds it, for a person looking
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
