"""A pod's container cgroup for the enforcement checks, made as the kubelet and the runtime make one.

The node agent finds a GPU process's pod and container by the names in its `/proc/<pid>/cgroup`
(`pod<uid>` and a 64-hex container ID) and freezes that container's cgroup when its claim runs past its
compute ceiling. The checks therefore put each workload in `<top>/pod<uid>/<container id>`, in the
hierarchy where the agent looks for the freezer (`dra_gpu.monitor.freezer.freezer_of`): the unified mount
where `/sys/fs/cgroup` is cgroup v2; else the v1 `freezer` controller's. `<top>` is a directory of the
check's own, removed with everything under it afterwards.

A program is put in its cgroup before it starts (`argv`: a shell writes its own PID to the container's
`cgroup.procs` and then execs the program), so every CUDA context it makes is the container's from the
first moment. `Watcher` samples the freezer's state from beside: when the agent froze the cgroup, as a
user of the container would see it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
TOOLKIT_CONFIG = Path("/etc/nvidia-container-runtime/config.toml")
TOOLKIT_SETTING = "accept-nvidia-visible-devices-envvar-when-unprivileged"
ENTER = 'echo 0 > "$0/cgroup.procs" && exec "$@"'
"""`sh -c ENTER <cgroup dir> <program> <args>`: the shell moves itself into the cgroup and becomes the program."""


@dataclass(frozen=True)
class Hierarchy:
    path: Path
    version: int
    """1: the v1 `freezer` controller's mount; 2: the unified hierarchy."""

    @property
    def state_file(self) -> str:
        return "cgroup.freeze" if self.version == 2 else "freezer.state"


def hierarchy(root: Path | None = None) -> tuple[Hierarchy | None, str]:
    """Where the agent would freeze a container on this host, in `freezer_of`'s order; None and why not."""
    root = CGROUP_ROOT if root is None else root
    if (root / "cgroup.controllers").is_file():
        return Hierarchy(root, 2), ""
    if (root / "freezer" / "cgroup.procs").is_file():
        return Hierarchy(root / "freezer", 1), ""
    if (root / "unified" / "cgroup.controllers").is_file():
        return Hierarchy(root / "unified", 2), ""
    return None, f"{root} has neither a cgroup v2 mount nor a v1 freezer controller"


@dataclass
class Container:
    """One pod's one container: its cgroup directory and the names the agent reads from it."""

    directory: Path
    pod_uid: str
    container_id: str
    hierarchy: Hierarchy

    def argv(self, program: Sequence[str | Path]) -> list[str]:
        """`program` started inside this container's cgroup."""
        return ["/bin/sh", "-c", ENTER, str(self.directory), *(str(a) for a in program)]

    def frozen(self) -> bool | None:
        """Whether the cgroup is frozen or freezing; None when its state cannot be read (gone)."""
        try:
            text = (self.directory / self.hierarchy.state_file).read_text().strip()
        except OSError:
            return None
        return text == "1" if self.hierarchy.version == 2 else text in ("FROZEN", "FREEZING")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.directory / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []


@dataclass
class Pods:
    """The check's pods' cgroups under one directory of its own (`top`), each with one container."""

    top: Path
    hierarchy: Hierarchy
    containers: dict[str, Container] = field(default_factory=dict)

    def add(self, name: str, pod_uid: str, container_id: str) -> Container:
        """The cgroup of pod `pod_uid`'s container `container_id` (64 hex digits), as the kubelet's cgroupfs
        driver and the runtime name it."""
        directory = self.top / f"pod{pod_uid}" / container_id
        directory.mkdir(parents=True)
        container = Container(directory, pod_uid, container_id, self.hierarchy)
        self.containers[name] = container
        return container

    def remove(self) -> list[str]:
        """Thaws every container, kills what is left in it, and removes the directories; what could not be
        removed, one line each (an empty list when everything went)."""
        problems = []
        for name, container in self.containers.items():
            thaw = b"0" if self.hierarchy.version == 2 else b"THAWED"
            with contextlib.suppress(OSError):
                (container.directory / self.hierarchy.state_file).write_bytes(thaw)
            for pid in container.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
            deadline = time.monotonic() + 5
            while container.pids() and time.monotonic() < deadline:
                time.sleep(0.01)
            if container.pids():
                problems.append(f"{name}: processes {container.pids()} outlived SIGKILL")
        for directory in sorted((p for p in self.top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                directory.rmdir()
            except OSError as exc:
                problems.append(f"cannot remove {directory}: {exc.strerror}")
        try:
            self.top.rmdir()
        except OSError as exc:
            problems.append(f"cannot remove {self.top}: {exc.strerror}")
        return problems


def container_id() -> str:
    """A new container ID, as a runtime makes one."""
    return secrets.token_hex(32)


def why_not(root: Path | None = None) -> str:
    """Why the checks cannot make pods' cgroups here; empty when they can."""
    if os.geteuid() != 0:
        return "making and freezing cgroups needs root"
    if shutil.which("sh") is None:
        return "no sh to start programs inside a cgroup"
    found, why = hierarchy(root)
    if found is None:
        return why
    probe = found.path / f"gpu-check-probe-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError as exc:  # a container's read-only cgroup mount, a hierarchy that refuses children
        return f"cannot make a cgroup under {found.path}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return ""


@contextlib.contextmanager
def pods(prefix: str, root: Path | None = None) -> Iterator[Pods]:
    """A directory of the check's own for pods' cgroups, removed with them however the block ends."""
    found, why = hierarchy(root)
    if found is None:
        raise OSError(why)
    top = found.path / f"{prefix}-{secrets.token_hex(4)}"
    top.mkdir()
    made = Pods(top, found)
    try:
        yield made
    finally:
        made.remove()


@dataclass
class Watcher:
    """Samples containers' freezer states every `period_s` on a thread of its own: when each was first seen
    frozen (time.monotonic), how many times it froze and for how long in all."""

    containers: dict[str, Container]
    period_s: float = 0.005
    first_frozen: dict[str, float] = field(default_factory=dict)
    freezes: dict[str, int] = field(default_factory=dict)
    frozen_s: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, name="freezer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        since: dict[str, float] = {}
        for name in self.containers:
            self.freezes[name] = 0
            self.frozen_s[name] = 0.0
        while True:
            stopping = self._stop.is_set()
            now = time.monotonic()
            for name, container in self.containers.items():
                frozen = container.frozen() and not stopping
                if frozen and name not in since:
                    since[name] = now
                    self.first_frozen.setdefault(name, now)
                    self.freezes[name] += 1
                elif not frozen and name in since:
                    self.frozen_s[name] += now - since.pop(name)
            if stopping:
                return
            self._stop.wait(self.period_s)


def toolkit_setting(config: Path | None = None) -> tuple[bool | None, str]:
    """Whether the NVIDIA container runtime accepts `NVIDIA_VISIBLE_DEVICES` from unprivileged containers
    (its default: true), read from its config.toml; None and why where there is no such file."""
    config = TOOLKIT_CONFIG if config is None else config
    try:
        text = config.read_text()
    except OSError as exc:
        return None, f"{config}: {exc.strerror or exc}"
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip() == TOOLKIT_SETTING:
            return value.strip().lower() != "false", f"{TOOLKIT_SETTING} = {value.strip()}"
    return True, f"{TOOLKIT_SETTING} not set in {config}: the runtime's default, true"
