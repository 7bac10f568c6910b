"""Which pod and container a host process belongs to, from `/proc/<pid>/cgroup`.

The kubelet names every pod's cgroup after the pod's UID, and the runtime names the container's
after its ID. Both cgroup versions and both cgroup drivers are understood:

- v2, systemd:  `0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
- v2, cgroupfs: `0::/kubepods/burstable/pod<uid>/<id>`
- v1: the same paths after `<n>:<controllers>:`, one line per hierarchy (any one names the pod).

systemd spells the UID's dashes as underscores. The agent reads the host's `/proc` (hostPID), so
`proc_root` is `/proc`; tests point it at a directory of their own.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from dra_gpu.limiter_abi.region import SlotOwner

_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")


def file_identity(path: Path | str) -> tuple[int, int] | None:
    """(device, inode) of a file as /proc/<pid>/maps names what a process mapped of it; None if it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True)
class PodRef:
    pod_uid: str
    container_id: str
    """The runtime's container ID (64 hex digits); empty where the cgroup path does not name one."""


def parse_cgroup(text: str) -> PodRef | None:
    """The pod and container named by the contents of a `/proc/<pid>/cgroup` file; None outside pods."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _POD.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        rest = path[match.end() :].lstrip("/").removeprefix(".slice").lstrip("/")
        leaf = rest.split("/", 1)[0]
        container = _CONTAINER.match(leaf)
        return PodRef(uid, container.group(1) if container else "")
    return None


@dataclass
class ProcessIndex:
    """Every process of the node as a limiter slot names it: (PID namespace inode, PID there, start time).

    Built from the host's /proc in one scan. What could not be read of a process that still exists makes
    the index unsure, never sure that a process is gone: `alive` answers None for any owner such a process
    might be (the same start time, or any owner when not even that was read)."""

    processes: set[tuple[int, int, int]] = field(default_factory=set)
    unsure_starts: set[int] = field(default_factory=set)
    blind: bool = False
    """A process of which nothing could be read, or the scan ran out of time."""

    def alive(self, owner: SlotOwner) -> bool | None:
        if (owner.pidns, owner.pid, owner.start) in self.processes:
            return True
        if self.blind or owner.start in self.unsure_starts:
            return None
        return False


SCAN_BUDGET_S = 2.0
"""At most this long for one scan of /proc; an unfinished scan is unsure of everything."""


class ProcReader:
    """Reads the few facts the monitor needs about host processes."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.root = proc_root
        self._prefix = f"{proc_root}/"  # plain strings: this runs for every GPU process every interval

    def pod_of(self, pid: int) -> PodRef | None:
        try:
            fd = os.open(f"{self._prefix}{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # gone, or not ours to read
        try:
            return parse_cgroup(os.read(fd, 65536).decode("utf-8", "replace"))
        except OSError:
            return None
        finally:
            os.close(fd)

    def command(self, pid: int) -> str | None:
        """The process's `comm` (its executable's name, at most 15 characters); None if it is gone."""
        try:
            with open(f"{self._prefix}{pid}/comm", "rb") as f:
                return f.read(64).decode("utf-8", "replace").strip()
        except OSError:
            return None

    def cgroup_text(self, pid: int) -> str | None:
        """The process's `/proc/<pid>/cgroup` as the host sees it; None if it is gone."""
        try:
            with open(f"{self._prefix}{pid}/cgroup", "rb") as f:
                return f.read(65536).decode("utf-8", "replace")
        except OSError:
            return None

    def start_time(self, pid: int) -> int | None:
        """The process's start time (field 22 of `stat`, clock ticks since boot); None if it is gone."""
        try:
            fd = os.open(f"{self._prefix}{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            try:
                text = os.read(fd, 4096)  # read at every floors pass for every GPU process: no file object
            finally:
                os.close(fd)
            return int(text[text.rindex(b")") + 2 :].split()[19])
        except (OSError, ValueError, IndexError):
            return None

    def has_limiter(self, pid: int, library: tuple[int, int] | None) -> bool | None:
        """Whether the process has mapped, executable, the very file the agent mounted as the limiter (its
        device and inode, `library`), never judged by a name: a tenant can give any file the library's name.
        None if its maps cannot be read or the agent's library is not known."""
        if library is None:
            return None
        device, inode = library
        wanted = f"{os.major(device):02x}:{os.minor(device):02x}".encode()
        wanted_inode = str(inode).encode()
        try:
            with open(f"{self._prefix}{pid}/maps", "rb") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if (
                        len(fields) >= 5
                        and fields[3] == wanted
                        and fields[4] == wanted_inode
                        and b"x" in fields[1]
                    ):
                        return True
        except OSError:
            return None
        return False

    def process_index(self, budget_s: float = SCAN_BUDGET_S) -> ProcessIndex:
        """Every process under the proc root: its PID namespace (the inode of `ns/pid`), its PID in that
        namespace (the last of `status`'s NSpid) and its start time (`stat` field 22)."""
        index = ProcessIndex()
        deadline = time.monotonic() + budget_s
        try:
            entries = [e.name for e in os.scandir(self.root) if e.name.isdigit()]
        except OSError:
            index.blind = True
            return index
        for name in entries:
            if time.monotonic() > deadline:
                index.blind = True
                break
            base = f"{self._prefix}{name}"
            start = self.start_time(int(name))
            try:
                with open(f"{base}/status", "rb") as f:
                    status = f.read(65536)
                ns_pid, zombie = _nspid(status)
                if zombie:
                    continue  # it has exited: its files, and its slot's lock, are closed
                pidns = os.stat(f"{base}/ns/pid").st_ino
            except (OSError, ValueError):
                if os.path.lexists(base):  # still there, but unreadable
                    if start is None:
                        index.blind = True
                    else:
                        index.unsure_starts.add(start)
                continue  # else gone meanwhile
            if start is None:
                if os.path.lexists(base):
                    index.blind = True
                continue
            index.processes.add((pidns, ns_pid, start))
        return index


def _nspid(status: bytes) -> tuple[int, bool]:
    """The PID in the process's own namespace (the last of NSpid) and whether it is a zombie or dead."""
    ns_pid: int | None = None
    zombie = False
    for line in status.splitlines():
        if line.startswith(b"State:"):
            zombie = line.split()[1:2] in ([b"Z"], [b"X"])
        elif line.startswith(b"NSpid:"):
            ns_pid = int(line.split()[-1])
    if ns_pid is None:
        raise ValueError("no NSpid")
    return ns_pid, zombie
