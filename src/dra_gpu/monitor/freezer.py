"""Freezing a container's cgroup: the kernel stops every task in it until it is thawed.

One interface for both hierarchies. cgroup v2 (every node a kubelet 1.35 accepts by default): write `1` or
`0` to the directory's `cgroup.freeze`; `cgroup.events` says `frozen 1` once every task has stopped.
cgroup v1 (older nodes, and hosts that still mount it beside v2): the `freezer` controller's
`freezer.state`, written `FROZEN` or `THAWED`, read back as `FREEZING` until every task has stopped.

Which one a process is under comes from the host's `/proc/<pid>/cgroup`, never from the container: where
the root of the cgroup mount is v2 (`cgroup.controllers` there), its `0::` line; else the `freezer` line of
v1; else, on a hybrid host, the `0::` line under `unified/` (a v2 mount beside v1's).

The kernel writes those paths relative to the *reader's* cgroup namespace. The agent's container usually has
a namespace of its own (containerd and CRI-O give every container one on cgroup v2, and Kubernetes has no
field to share the host's), so a tenant's path reads `/../../kubepods.slice/...`: up from the agent's own
namespace root, then down. `namespace_root()` finds that root's place in the host's tree (the mounted
hierarchy's directory whose `cgroup.procs` lists the agent), and `freezer_of` resolves such a path against
it; without it, a path that leaves the namespace is never followed.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class FreezeError(Exception):
    """The cgroup cannot be frozen or thawed (gone, or not a freezer); the message says which."""


@dataclass(frozen=True)
class CgroupFreezer:
    path: str
    """The cgroup's directory."""
    version: int
    """1: the v1 `freezer` controller; 2: the unified hierarchy."""

    def freeze(self) -> None:
        self._write(b"1" if self.version == 2 else b"FROZEN")

    def thaw(self) -> None:
        self._write(b"0" if self.version == 2 else b"THAWED")

    def frozen(self) -> bool:
        """Whether the cgroup is asked to be frozen (its tasks may still be stopping)."""
        try:
            if self.version == 2:
                with open(f"{self.path}/cgroup.freeze", "rb") as f:
                    return f.read().strip() == b"1"
            with open(f"{self.path}/freezer.state", "rb") as f:
                return f.read().strip() in (b"FROZEN", b"FREEZING")
        except OSError as exc:
            raise FreezeError(f"cannot read the freezer of {self.path}: {exc.strerror or exc}") from None

    def _write(self, value: bytes) -> None:
        name = "cgroup.freeze" if self.version == 2 else "freezer.state"
        try:
            fd = os.open(f"{self.path}/{name}", os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise FreezeError(f"cannot open {self.path}/{name}: {exc.strerror or exc}") from None
        try:
            os.write(fd, value)
        except OSError as exc:
            raise FreezeError(
                f"cannot write {value.decode()} to {self.path}/{name}: {exc.strerror or exc}"
            ) from None
        finally:
            os.close(fd)


NAMESPACE_SEARCH_LIMIT = 50_000
"""The most cgroup directories `namespace_root` reads looking for the agent (a node with 110 pods has a few
thousand); past it the agent's namespace is taken as unknown and paths that leave it are not followed."""


def _paths(cgroup_text: str) -> tuple[str | None, str | None]:
    """(the unified hierarchy's path, the v1 freezer's path) of a `/proc/<pid>/cgroup` text."""
    unified: str | None = None
    v1: str | None = None
    for line in cgroup_text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            unified = path
        elif "freezer" in controllers.split(","):
            v1 = path
    return unified, v1


def _hierarchies(root: str) -> list[tuple[str, int]]:
    """(directory, index into `_paths`) of the hierarchies a freezer may be in, in `freezer_of`'s order."""
    if os.path.isfile(f"{root}/cgroup.controllers"):
        return [(root, 0)]
    return [(f"{root}/freezer", 1), (f"{root}/unified", 0)]


def _find_procs(top: str, pid: int) -> str | None:
    """The directory under `top` whose `cgroup.procs` lists `pid` (breadth first, bounded)."""
    wanted = str(pid)
    queue, seen = collections.deque([top]), 0
    while queue and seen < NAMESPACE_SEARCH_LIMIT:
        here = queue.popleft()
        seen += 1
        with contextlib.suppress(OSError), open(f"{here}/cgroup.procs") as f:
            if wanted in f.read().split():
                return here
        with contextlib.suppress(OSError), os.scandir(here) as entries:
            queue.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    return None


def namespace_root(
    own_cgroup_text: str, pid: int, cgroup_root: Path | str = "/sys/fs/cgroup"
) -> dict[str, str]:
    """Where the reader's cgroup namespace root is in the host's tree, per hierarchy directory: the directory
    that lists `pid` (the reader, as the host numbers it) minus the reader's own path in its namespace
    (`own_cgroup_text`, its `/proc/self/cgroup`). Empty for a hierarchy where the reader is not found."""
    roots: dict[str, str] = {}
    paths = _paths(own_cgroup_text)
    for top, index in _hierarchies(str(cgroup_root).rstrip("/")):
        own = paths[index]
        if own is None or ".." in own.split("/"):
            continue
        found = _find_procs(top, pid)
        if found is None:
            continue
        inner = own.strip("/")
        if inner and not found.endswith(f"/{inner}"):
            continue
        roots[top] = found[: len(found) - len(inner)].rstrip("/") if inner else found
    return roots


def _resolve(path: str | None, top: str, roots: dict[str, str]) -> str | None:
    """`path` (relative to the reader's namespace) as a path under `top`, or None where it cannot be placed."""
    if path is None or ".." not in path.split("/"):
        return path
    base = roots.get(top)
    if base is None:
        return None  # outside the reader's namespace, whose place in the host's tree is unknown: not followed
    joined = os.path.normpath(f"{base}/{path.strip('/')}")
    if joined != top and not joined.startswith(f"{top}/"):
        return None  # above the hierarchy's root: never
    return "/" + joined[len(top) :].strip("/")


def freezer_of(
    cgroup_text: str, cgroup_root: Path | str = "/sys/fs/cgroup", roots: dict[str, str] | None = None
) -> CgroupFreezer | None:
    """The freezer of the cgroup that a `/proc/<pid>/cgroup` text names; None where it names none (a
    process in the root cgroup, a v1 host without the freezer controller). `roots`: the reader's namespace
    root per hierarchy (`namespace_root`), to place paths that leave the reader's namespace."""
    root = str(cgroup_root).rstrip("/")
    unified, v1 = _paths(cgroup_text)
    places = roots or {}
    if os.path.isfile(f"{root}/cgroup.controllers"):
        unified = _resolve(unified, root, places)
    else:
        v1 = _resolve(v1, f"{root}/freezer", places)
        unified = _resolve(unified, f"{root}/unified", places)
    if any(".." in p.split("/") for p in (unified or "", v1 or "")):
        return None  # never followed (`_resolve` placed what it could)
    if unified is not None and os.path.isfile(f"{root}/cgroup.controllers"):
        return None if unified.strip("/") == "" else CgroupFreezer(f"{root}/{unified.strip('/')}", 2)
    if v1 is not None and v1.strip("/"):
        return CgroupFreezer(f"{root}/freezer/{v1.strip('/')}", 1)
    if unified is not None and unified.strip("/") and os.path.isfile(f"{root}/unified/cgroup.controllers"):
        return CgroupFreezer(f"{root}/unified/{unified.strip('/')}", 2)
    return None


RECORDS_DIR = "frozen-cgroups"
"""In the agent's state directory: one record per cgroup the agent has frozen and not yet thawed."""


class FreezeRecords:
    """The cgroups this agent froze, one file each in a directory of its own state (never a place a container
    can write): written before the freeze, removed after the thaw. An agent killed between the two leaves the
    record, and the next agent thaws every recorded cgroup when it starts (`thaw_left`), before it holds
    anything: a claim is never left frozen by an agent that is gone. `directory` None: nothing recorded."""

    def __init__(self, directory: Path | None, cgroup_root: Path | str = "/sys/fs/cgroup") -> None:
        self.directory = directory
        self._root = str(cgroup_root).rstrip("/")

    def _file(self, freezer: CgroupFreezer) -> Path:
        assert self.directory is not None
        name = hashlib.sha256(freezer.path.encode()).hexdigest()[:32]
        return self.directory / f"{name}.v{freezer.version}"

    def add(self, freezer: CgroupFreezer) -> bool:
        """Records `freezer` as frozen by this agent (atomically); False when it cannot be written."""
        if self.directory is None:
            return True
        target = self._file(freezer)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            temp = target.with_suffix(".tmp")
            temp.write_text(freezer.path)
            os.replace(temp, target)
        except OSError as exc:
            log.warning(
                "cannot record a cgroup before freezing it",
                extra={"cgroup": freezer.path, "error": exc.strerror or str(exc)},
            )
            return False
        return True

    def remove(self, freezer: CgroupFreezer) -> None:
        if self.directory is not None:
            with contextlib.suppress(OSError):
                self._file(freezer).unlink()

    def recorded(self) -> list[CgroupFreezer]:
        """The cgroups recorded as frozen; a record that names no cgroup under the mount is ignored."""
        if self.directory is None:
            return []
        out = []
        with contextlib.suppress(OSError):
            for entry in sorted(self.directory.iterdir()):
                stem, _, version = entry.name.rpartition(".v")
                if not stem or version not in ("1", "2"):
                    continue
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    path = entry.read_text()
                    if path.startswith(f"{self._root}/") and ".." not in path.split("/"):
                        out.append(CgroupFreezer(path, int(version)))
        return out

    def thaw_left(self) -> list[str]:
        """Thaws every recorded cgroup (one gone meanwhile needs nothing) and drops its record: what an agent
        that stopped without thawing left. Returns the paths thawed."""
        if self.directory is None:
            return []
        thawed = []
        for freezer in self.recorded():
            try:
                freezer.thaw()
                thawed.append(freezer.path)
            except FreezeError:
                pass  # the cgroup is gone with its container: nothing is left frozen
            self.remove(freezer)
        with contextlib.suppress(OSError):
            for entry in self.directory.iterdir():  # a record of no cgroup, a temporary file
                entry.unlink()
        if thawed:
            log.warning(
                "thawed the cgroups a previous agent left frozen", extra={"cgroups": ", ".join(thawed)}
            )
        return thawed
