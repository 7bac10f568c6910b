"""Load CDI spec directories and resolve device names into what a container receives.

This reproduces the reference library's cache (``pkg/cdi/cache.go``) and edit application
(``container-edits.go``) closely enough for tests to assert what a runtime would inject:

- directories are scanned in order, later ones have higher priority; only ``*.json``/``*.yaml``
  directly inside a directory are read; a file that fails to parse or validate is skipped
  entirely and its error recorded (``Registry.errors``);
- a device defined in a higher-priority directory replaces the lower one; the same device defined
  twice at the same priority is a conflict and becomes unresolvable (even if a higher-priority
  file defines it too, as in the reference implementation);
- resolving applies each involved spec's spec-level edits once (when its first device is seen),
  then each device's edits, all merged before being applied once.

It works on paths and models only: it does not stat host device nodes (the real runtime fills in
type/major/minor from the host); ``cdi.runtime_check`` reports host paths that do not exist.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from cdi import names, validation
from cdi.errors import CDIError
from cdi.files import SPEC_EXTENSIONS, read_spec
from cdi.spec import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, LinuxNetDevice, Mount, Spec

_T = TypeVar("_T")
MAX_LOAD_ERRORS_IN_MESSAGE = 5


@dataclass
class ContainerConfig:
    """The OCI-level result of injecting CDI devices into an empty container."""

    env: dict[str, str] = field(default_factory=dict)
    device_nodes: list[DeviceNode] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)
    net_devices: dict[str, LinuxNetDevice] = field(default_factory=dict)
    intel_rdt: IntelRdt | None = None

    def env_list(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.env.items()]

    def hooks_named(self, hook_name: str) -> list[Hook]:
        return [h for h in self.hooks if h.hook_name == hook_name]

    def mount_for(self, container_path: str) -> Mount | None:
        return next((m for m in self.mounts if m.container_path == container_path), None)

    def device_node_for(self, container_path: str) -> DeviceNode | None:
        return next((d for d in self.device_nodes if d.path == container_path), None)


@dataclass(frozen=True)
class _Entry:
    spec: Spec
    device: Device
    path: Path
    priority: int


@dataclass
class Registry:
    """The CDI devices visible to a runtime configured with some spec directories."""

    _devices: dict[str, _Entry] = field(default_factory=dict)
    skipped: dict[Path, str] = field(default_factory=dict)
    """Spec files that failed to parse or validate, with the reason; none of their devices exist."""
    conflicts: dict[str, str] = field(default_factory=dict)
    """Devices defined twice at the same priority, with the conflict message; they are unresolvable."""

    @classmethod
    def load(cls, dirs: Sequence[Path]) -> Registry:
        """Scan ``dirs`` in priority order (later wins); missing directories are skipped."""
        reg = cls()
        for priority, directory in enumerate(dirs):
            for path in _spec_files(directory):
                try:
                    spec = read_spec(path)
                    validation.validate_spec(spec)
                except CDIError as e:
                    reg.skipped[path] = str(e)
                    continue
                for dev in spec.devices:
                    qualified = f"{spec.kind}={dev.name}"
                    old = reg._devices.get(qualified)
                    if old is not None and old.priority == priority:
                        reg.conflicts[qualified] = (
                            f"conflicting device {qualified!r} (specs {str(path)!r}, {str(old.path)!r})"
                        )
                        continue
                    reg._devices[qualified] = _Entry(spec, dev, path, priority)
        for qualified in reg.conflicts:
            reg._devices.pop(qualified, None)
        return reg

    @property
    def errors(self) -> list[str]:
        """Everything a runtime would log about these directories."""
        return [f"{p}: {m}" for p, m in sorted(self.skipped.items())] + sorted(self.conflicts.values())

    def device_names(self) -> list[str]:
        """All resolvable fully qualified device names, sorted."""
        return sorted(self._devices)

    def spec_path(self, qualified: str) -> Path | None:
        """The file that defines a resolvable device."""
        entry = self._devices.get(qualified)
        return entry.path if entry else None

    def resolve(self, qualified_names: Iterable[str]) -> ContainerConfig:
        """What a container gets when the runtime injects these devices (in this order)."""
        merged = ContainerEdits()
        seen_specs: set[Path] = set()
        unresolved: list[str] = []
        for qualified in qualified_names:
            entry = self._devices.get(qualified)
            if entry is None:
                unresolved.append(qualified)
                continue
            if entry.path not in seen_specs:
                seen_specs.add(entry.path)
                if entry.spec.container_edits is not None:
                    merged = _append(merged, entry.spec.container_edits)
            merged = _append(merged, entry.device.container_edits)
        if unresolved:
            raise CDIError(f"unresolvable CDI devices: {', '.join(unresolved)}{self._hints(unresolved)}")
        return _apply(merged)

    def _hints(self, unresolved: list[str]) -> str:
        """Why names did not resolve: bad syntax, conflicts, or spec files that failed to load."""
        hints: list[str] = []
        for qualified in unresolved:
            if qualified in self.conflicts:
                hints.append(self.conflicts[qualified])
                continue
            try:
                names.parse_qualified_name(qualified)
            except CDIError as e:
                hints.append(str(e))
        failed = [f"{p}: {m}" for p, m in sorted(self.skipped.items())]
        if failed:
            shown = failed[:MAX_LOAD_ERRORS_IN_MESSAGE]
            more = len(failed) - len(shown)
            hints.append("spec files skipped: " + "; ".join(shown) + (f"; and {more} more" if more else ""))
        return f" ({'; '.join(hints)})" if hints else ""


def _spec_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [Path(e.path) for e in entries if not e.is_dir() and Path(e.name).suffix in SPEC_EXTENSIONS]


def _cat(a: list[_T] | None, b: list[_T] | None) -> list[_T] | None:
    return (a or []) + (b or []) if (a or b) else None


def _append(into: ContainerEdits, other: ContainerEdits) -> ContainerEdits:
    """Concatenate edits like ``ContainerEdits.Append``; the last intelRdt wins."""
    return ContainerEdits(
        env=_cat(into.env, other.env),
        device_nodes=_cat(into.device_nodes, other.device_nodes),
        net_devices=_cat(into.net_devices, other.net_devices),
        hooks=_cat(into.hooks, other.hooks),
        mounts=_cat(into.mounts, other.mounts),
        intel_rdt=other.intel_rdt if other.intel_rdt is not None else into.intel_rdt,
        additional_gids=_cat(into.additional_gids, other.additional_gids),
    )


def _apply(edits: ContainerEdits) -> ContainerConfig:
    """Apply merged edits to an empty container like ``ContainerEdits.Apply``."""
    cfg = ContainerConfig(intel_rdt=edits.intel_rdt)
    for entry in edits.env or ():
        name, _, value = entry.partition("=")
        cfg.env[name] = value  # an existing variable keeps its position, the value is replaced
    for node in edits.device_nodes or ():
        filled = node.model_copy(update={"host_path": node.host_path or node.path})
        cfg.device_nodes = [d for d in cfg.device_nodes if d.path != node.path] + [filled]
    for mount in edits.mounts or ():
        cfg.mounts = [m for m in cfg.mounts if m.container_path != mount.container_path] + [mount]
    # Parents before children: stable sort by the depth of the container path.
    cfg.mounts.sort(key=lambda m: os.path.normpath(m.container_path).count(os.sep))
    cfg.hooks = list(edits.hooks or ())
    for gid in edits.additional_gids or ():
        if gid != 0 and gid not in cfg.additional_gids:
            cfg.additional_gids.append(gid)
    for net in edits.net_devices or ():
        cfg.net_devices[net.host_interface_name] = net
    return cfg
