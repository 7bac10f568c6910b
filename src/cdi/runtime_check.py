"""Would a real container runtime accept this spec? A check that runs before any container starts.

Runtimes skip a spec file they cannot load and then fail container creation with only
"unresolvable CDI devices", and fail again at injection if a host path is missing. This lists
those problems up front, in words that name the version, path or name at fault. ``max_version``
models the newest ``cdiVersion`` the runtime's vendored CDI library knows (the default, 0.5.0, is
what Debian bookworm's podman accepts; a newer version there makes every device "unresolvable");
``host_root`` lets tests point at a fake host filesystem.
"""

from __future__ import annotations

import stat
from pathlib import Path

from cdi import validation
from cdi.errors import CDIError
from cdi.files import read_spec
from cdi.spec import ContainerEdits, Spec

DEFAULT_MAX_VERSION = "0.5.0"


def check_spec_for_runtime(
    spec_or_path: Spec | Path,
    max_version: str = DEFAULT_MAX_VERSION,
    host_root: Path = Path("/"),
) -> list[str]:
    """Human-readable reasons a runtime would refuse this spec or its containers; empty if none."""
    if isinstance(spec_or_path, Path):
        try:
            spec = read_spec(spec_or_path)
        except CDIError as e:
            return [str(e)]
    else:
        spec = spec_or_path
    problems = validation.spec_problems(spec, max_version=max_version)
    edits: list[tuple[str, ContainerEdits]] = []
    if spec.container_edits is not None:
        edits.append(("spec containerEdits", spec.container_edits))
    edits += [(f"device {d.name!r}", d.container_edits) for d in spec.devices]
    for where, container_edits in edits:
        problems += _host_path_problems(where, container_edits, host_root)
    return problems


def _on_host(host_root: Path, path: str) -> Path:
    return host_root / path.lstrip("/")


def _host_path_problems(where: str, edits: ContainerEdits, host_root: Path) -> list[str]:
    problems: list[str] = []
    for node in edits.device_nodes or ():
        # Like the reference library, the runtime stats the host node only for what is not given.
        if node.type and (node.major or node.type == "p"):
            continue
        host = node.host_path or node.path
        try:
            mode = _on_host(host_root, host).lstat().st_mode
        except FileNotFoundError:
            problems.append(f"{where}: device node {node.path!r}: host path {host!r} does not exist")
            continue
        host_type = (
            "c" if stat.S_ISCHR(mode) else "b" if stat.S_ISBLK(mode) else "p" if stat.S_ISFIFO(mode) else None
        )
        if host_type is None:
            problems.append(f"{where}: device node {node.path!r}: host path {host!r} is not a device node")
        elif node.type and node.type != host_type:
            problems.append(
                f"{where}: device node {node.path!r}: type {node.type!r} does not match the host's {host_type!r}"
            )
    for mount in edits.mounts or ():
        if mount.host_path and not _on_host(host_root, mount.host_path).exists():
            problems.append(
                f"{where}: mount {mount.container_path!r}: host path {mount.host_path!r} does not exist"
            )
    for hook in edits.hooks or ():
        if hook.path and not _on_host(host_root, hook.path).exists():
            problems.append(f"{where}: {hook.hook_name} hook: path {hook.path!r} does not exist")
    return problems
