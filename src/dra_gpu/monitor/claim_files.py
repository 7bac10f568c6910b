"""The limiter's per-claim files the watch reads at every floors pass (about once a second), on descriptors it
keeps: each claim's region header (its count per GPU, as the library admits against it) and its activity file
on each GPU's board. A pass then costs one pread per file, and a header that did not change since the last
read is not parsed again.

A descriptor is opened as the one-off reads open the file (non-blocking, no symbolic link, regular files only:
the claim's state directory is the tenant's to write on some hosts) and dropped when the claim is gone, when
the claims prepared change and at every full sample, so a file replaced in place (an upgrade's new activity
file, say) is read again within a sample; a file that cannot be opened is tried again then. At most a quarter
of the process's open-file limit is kept; past it, a file is opened for each read."""

from __future__ import annotations

import os
import resource
import stat
from collections.abc import Container

from dra_gpu.limiter_abi.board import ACTIVITY_READ, Activity, activity_name, parse_activity
from dra_gpu.limiter_abi.region import HEADER_BYTES, REGION_FILE, parse_header

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def fd_budget() -> int:
    """How many descriptors a reader of the claims' files may keep: a quarter of the open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 16 if soft == resource.RLIM_INFINITY else max(0, soft // 4)


class KeptFds:
    """Descriptors kept open by key, at most `fd_budget()` of them: past it, one handed in is closed."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._budget = fd_budget()

    def __len__(self) -> int:
        return len(self._fds)

    def get(self, key: str) -> int | None:
        return self._fds.get(key)

    def take(self, key: str) -> int | None:
        """The descriptor kept for key, no longer kept (the caller keeps it again or closes it)."""
        return self._fds.pop(key, None)

    def keep(self, key: str, fd: int) -> None:
        if len(self._fds) < self._budget:
            self._fds[key] = fd
        else:
            os.close(fd)

    def close(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def retain(self, keys: Container[str]) -> None:
        """Closes the descriptors of keys not in `keys`."""
        for key in [k for k in self._fds if k not in keys]:
            os.close(self._fds.pop(key))


class ClaimFiles:
    """Region counts and activity files of the claims, read on kept descriptors."""

    def __init__(self, claims_dir: str, boards_dir: str) -> None:
        self._claims_dir = claims_dir
        self._boards_dir = boards_dir
        self._fds = KeptFds()
        """path -> the descriptor kept open on it."""
        self._headers: dict[str, tuple[bytes, dict[str, int]]] = {}
        """claim uid -> the region header last read and the counts parsed from it."""
        self._missing: set[str] = set()
        """Paths that could not be opened: not tried again before the next `reopen` (a claim without an
        activity file, say, costs nothing between full samples)."""

    def counts(self, uid: str) -> dict[str, int]:
        """The region's claim-wide count per GPU UUID (dead slots included); {} when there is no region."""
        data = self._read(f"{self._claims_dir}/{uid}/limiter/{REGION_FILE}", HEADER_BYTES)
        if data is None:
            self._headers.pop(uid, None)
            return {}
        last = self._headers.get(uid)
        if last is not None and last[0] == data:
            return last[1]
        counts = {d.uuid: d.used_bytes for d in parse_header(data) or []}
        self._headers[uid] = (data, counts)
        return counts

    def activity(self, gpu: str, uid: str) -> Activity | None:
        """What the claim's activity file on the GPU's board says; None for one missing or damaged."""
        data = self._read(f"{self._boards_dir}/{gpu}/{activity_name(uid)}", ACTIVITY_READ)
        return None if data is None else parse_activity(data)

    def reopen(self) -> None:
        """Drops every kept descriptor: the next reads open the files again."""
        self._fds.close_all()
        self._missing.clear()

    def retain(self, uids: set[str]) -> None:
        """Forgets the headers of claims no longer prepared."""
        if not self._headers.keys() <= uids:
            self._headers = {uid: v for uid, v in self._headers.items() if uid in uids}

    def _read(self, path: str, size: int) -> bytes | None:
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return os.pread(fd, size, 0)
            except OSError:
                self._fds.close(path)
                return None
        if path in self._missing:
            return None
        try:
            fd = os.open(path, _FLAGS)
        except OSError:
            self._missing.add(path)
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                self._missing.add(path)
                return None
            data = os.pread(fd, size, 0)
        except OSError:
            os.close(fd)
            return None
        self._fds.keep(path, fd)
        return data
