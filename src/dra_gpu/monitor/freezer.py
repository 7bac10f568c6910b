"""Freezing a container's cgroup: the kernel stops every task in it until it is thawed.

One interface for both hierarchies. cgroup v2 (every node a kubelet 1.35 accepts by default): write `1` or
`0` to the directory's `cgroup.freeze`; `cgroup.events` says `frozen 1` once every task has stopped.
cgroup v1 (older nodes, and hosts that still mount it beside v2): the `freezer` controller's
`freezer.state`, written `FROZEN` or `THAWED`, read back as `FREEZING` until every task has stopped.

Which one a process is under comes from the host's `/proc/<pid>/cgroup`, never from the container: where
the root of the cgroup mount is v2 (`cgroup.controllers` there), its `0::` line; else the `freezer` line of
v1; else, on a hybrid host, the `0::` line under `unified/` (a v2 mount beside v1's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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


def freezer_of(cgroup_text: str, cgroup_root: Path | str = "/sys/fs/cgroup") -> CgroupFreezer | None:
    """The freezer of the cgroup that a `/proc/<pid>/cgroup` text names; None where it names none (a
    process in the root cgroup, a v1 host without the freezer controller)."""
    root = str(cgroup_root).rstrip("/")
    unified: str | None = None
    v1: str | None = None
    for line in cgroup_text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            unified = path
        elif "freezer" in controllers.split(","):
            v1 = path
    if any(".." in p.split("/") for p in (unified or "", v1 or "")):
        return None  # a path outside the reader's cgroup namespace: not the host's view, never followed
    if unified is not None and os.path.isfile(f"{root}/cgroup.controllers"):
        return None if unified.strip("/") == "" else CgroupFreezer(f"{root}/{unified.strip('/')}", 2)
    if v1 is not None and v1.strip("/"):
        return CgroupFreezer(f"{root}/freezer/{v1.strip('/')}", 1)
    if unified is not None and unified.strip("/") and os.path.isfile(f"{root}/unified/cgroup.controllers"):
        return CgroupFreezer(f"{root}/unified/{unified.strip('/')}", 2)
    return None
