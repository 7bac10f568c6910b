"""A container's cgroup-v2 leaf, and the `dmem` files the kernel's device-memory controller keeps.

The driver's memory limits must sit on the container's own (leaf) cgroup: a leaf has its own
`dmem.max`, which would shadow a limit set on a parent for what the container sees as its total.
Under `dmem`, a soft limit (`dmem.min` on the leaf) is also counted into every ancestor's `dmem.min`;
when the leaf goes before its soft limit is cleared, the ancestors keep that reservation. For that
case `release_ancestors` takes it back, using the region names recorded when the limit was set.
"""

from __future__ import annotations

from pathlib import Path

DMEM_MIN = "dmem.min"


class CgroupError(Exception):
    """The kernel's cgroup layout cannot carry the limit; the message says what is wrong."""


def leaf_of_pid(pid: int, proc_root: Path, cgroup_root: Path) -> Path:
    """The cgroup-v2 directory of `pid` (`0::/path` in /proc/<pid>/cgroup) under `cgroup_root`."""
    source = proc_root / str(pid) / "cgroup"
    try:
        lines = source.read_text().splitlines()
    except OSError as exc:
        raise CgroupError(f"cannot read {source}: {exc.strerror or exc}") from None
    unified = [line[3:] for line in lines if line.startswith("0::")]
    if not unified:
        raise CgroupError(
            f"process {pid} has no cgroup-v2 entry in {source} (cgroup v1 only); driver memory limits "
            f"need the unified cgroup-v2 hierarchy"
        )
    leaf = cgroup_root / unified[0].lstrip("/")
    if not (leaf / "cgroup.controllers").is_file():
        raise CgroupError(
            f"the container's cgroup {leaf} is not a cgroup-v2 directory (is {cgroup_root} cgroup v2?)"
        )
    return leaf


def read_dmem(path: Path) -> dict[str, str]:
    """`region value` lines of a dmem file; empty when the file is absent (no dmem controller here)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        region, _, value = line.strip().rpartition(" ")
        if region:
            values[region] = value
    return values


def regions_holding(leaf: Path, soft: int) -> list[str]:
    """The dmem regions whose `dmem.min` on `leaf` equals `soft`: where the driver put the soft limit."""
    if soft <= 0:
        return []
    return [region for region, value in read_dmem(leaf / DMEM_MIN).items() if value == str(soft)]


def release_ancestors(leaf: Path, cgroup_root: Path, regions: dict[str, int]) -> list[Path]:
    """Lower every ancestor's `dmem.min` by what the removed `leaf` had reserved; the cgroups changed."""
    changed: list[Path] = []
    parent = leaf.parent
    while parent != cgroup_root and cgroup_root in parent.parents:
        current = read_dmem(parent / DMEM_MIN)
        lowered = {
            region: str(max(int(current[region]) - amount, 0))
            for region, amount in regions.items()
            if current.get(region, "").isdigit()
        }
        if lowered:
            text = "".join(f"{region} {lowered.get(region, value)}\n" for region, value in current.items())
            (parent / DMEM_MIN).write_text(text)
            changed.append(parent)
        parent = parent.parent
    return changed
