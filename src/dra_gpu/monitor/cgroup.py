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
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")
LIMITER_MARK = b"libdragpu-limiter"


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

    def start_time(self, pid: int) -> int | None:
        """The process's start time (field 22 of `stat`, clock ticks since boot); None if it is gone."""
        try:
            with open(f"{self._prefix}{pid}/stat", "rb") as f:
                text = f.read(4096)
            return int(text[text.rindex(b")") + 2 :].split()[19])
        except (OSError, ValueError, IndexError):
            return None

    def has_limiter(self, pid: int) -> bool | None:
        """Whether the process has the limiter library mapped; None if its maps cannot be read."""
        try:
            with open(f"{self._prefix}{pid}/maps", "rb") as f:
                for line in f:
                    if LIMITER_MARK in line:
                        return True
        except OSError:
            return None
        return False
