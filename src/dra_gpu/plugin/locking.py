"""The node-wide lock around every prepare and unprepare.

The kubelet may call us concurrently (grpcio runs handlers on a thread pool) and, during a rolling
update, two plugin processes serve the same node. Both must see one sequence of checkpoint
read-modify-writes and GPU-wide changes, so a call holds a process lock *and* an fcntl lock on a
file in the plugin data directory, as the Go helper does with ``serialize.lock``. The kernel drops the
file lock when a process dies, so a crashed plugin never blocks its successor.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE_NAME = "serialize.lock"


class LockTimeout(Exception):
    """The lock was not obtained in time; the message says who is likely holding it."""


class NodeLock:
    """A re-usable process + file lock; ``hold()`` is the only way in."""

    def __init__(self, path: Path, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._thread_lock = threading.Lock()
        self._fd: int | None = None

    def _file(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    @contextmanager
    def hold(self) -> Iterator[None]:
        deadline = time.monotonic() + self.timeout_s
        if not self._thread_lock.acquire(timeout=self.timeout_s):
            raise LockTimeout(
                f"another prepare/unprepare call in this plugin has run for more than {self.timeout_s:.0f}s"
            )
        try:
            fd = self._file()
            delay = 0.0005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(
                            f"another plugin process has held {self.path} for more than "
                            f"{self.timeout_s:.0f}s (a second plugin pod on this node during an update?)"
                        ) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
