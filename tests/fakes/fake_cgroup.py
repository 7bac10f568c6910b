"""A cgroup-v2 tree in a temporary directory, with the dmem controller's files, and a /proc to match.

Every directory has `cgroup.controllers` (that is how the code and the fake NVML tell a cgroup-v2
directory); with dmem delegated, every non-root directory also has `dmem.max` (`max` per region),
`dmem.min` and `dmem.low` (`0`) and `dmem.current`, as the kernel creates them. Regions are added
as GPUs appear (`nvidia/<pci bus id>`, this project's fake naming).
"""

from __future__ import annotations

import shutil
from pathlib import Path


class FakeCgroupTree:
    def __init__(self, base: Path, *, dmem: bool = True, regions: tuple[str, ...] = ()) -> None:
        self.root = base / "sys-fs-cgroup"
        self.proc = base / "proc"
        self.dmem = dmem
        self.regions = regions
        self.root.mkdir(parents=True)
        self.proc.mkdir()
        controllers = "cpuset cpu io memory pids" + (" dmem" if dmem else "")
        (self.root / "cgroup.controllers").write_text(controllers + "\n")
        (self.root / "cgroup.subtree_control").write_text(controllers + "\n")

    def mkdir(self, rel: str) -> Path:
        """Create `rel` and its missing parents, each a cgroup-v2 directory with its dmem files."""
        path = self.root
        for part in Path(rel.strip("/")).parts:
            path = path / part
            if path.is_dir():
                continue
            path.mkdir()
            (path / "cgroup.controllers").write_text((self.root / "cgroup.controllers").read_text())
            (path / "cgroup.procs").write_text("")
            if self.dmem:
                (path / "dmem.max").write_text("".join(f"{r} max\n" for r in self.regions))
                (path / "dmem.min").write_text("".join(f"{r} 0\n" for r in self.regions))
                (path / "dmem.low").write_text("".join(f"{r} 0\n" for r in self.regions))
                (path / "dmem.current").write_text("".join(f"{r} 0\n" for r in self.regions))
        return path

    def add_process(self, pid: int, rel: str) -> Path:
        leaf = self.mkdir(rel)
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(f"0::/{rel.strip('/')}\n")
        (leaf / "cgroup.procs").write_text(f"{pid}\n")
        return leaf

    def add_v1_process(self, pid: int) -> None:
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(
            "12:memory:/kubepods/pod1/c1\n11:cpu:/kubepods/pod1/c1\n"
        )

    def remove(self, rel: str) -> None:
        """rmdir as the runtime does when the container is gone (the ancestors' files stay as they are)."""
        shutil.rmtree(self.root / rel.strip("/"))

    def read(self, rel: str, name: str) -> dict[str, str]:
        path = self.root / rel.strip("/") / name
        values = {}
        for line in path.read_text().splitlines():
            region, _, value = line.rpartition(" ")
            values[region] = value
        return values
