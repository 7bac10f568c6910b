"""Limiter claims of one GPU laid out as the node agent lays them out, for the elastic-compute checks.

The library takes a claim's floor, ceiling and class only from a limits file under its claims root
(`CLAIMS_ROOT`, /run/dra-gpu/claims in the build the check uses) that is the root of a read-only mount,
and it trusts the GPU's board only under its GPUs root (`GPUS_ROOT`, /run/dra-gpu/gpus) on a read-only
mount owned by root (native/limiter/README.md). So each claim's process runs, as root, in a private mount
namespace of its own that shows it what a container of the claim sees: the GPU's arbitration directory
read-only at GPUS_ROOT, and only its own claim's directory at CLAIMS_ROOT, its limits file a read-only
mount of its own. Nothing is mounted outside those namespaces; the roots are made on the host only when
missing, and removed again.

Here, on the host side: the board and each claim's activity file (hard-linked into its state directory),
its region and its limits file. The board, activity and region layouts are the agent's own code
(`dra_gpu.limiter_abi.board`, `dra_gpu.limiter_abi.region`), loaded from their files (`agent.module`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpucheck import agent

CLAIMS_ROOT = Path("/run/dra-gpu/claims")
GPUS_ROOT = Path("/run/dra-gpu/gpus")
LIBRARY_LINE = "dragpu-limiter:"
NOT_ELASTIC = ("runs its fixed floor", "error:")
"""What the library logs when it does not take a claim into arbitration, or refuses it."""
NAMESPACE = "gpu-check"
"""The namespace of the claims' `claim=` lines (the library names a claim so in its log lines)."""

# In the claim's own mount namespace: the GPUs directory read-only at the GPUs root, the claim's
# directory at the claims root, its limits file bind-mounted read-only onto itself; then the program.
MOUNT_SCRIPT = """set -e
mount --bind "$1" "$2"
mount -o remount,bind,ro "$2"
mount --bind "$3" "$4"
mount --bind "$5" "$5"
mount -o remount,bind,ro "$5"
shift 5
exec "$@"
"""


def board() -> ModuleType:
    return agent.module("limiter_abi/board.py")


def region() -> ModuleType:
    return agent.module("limiter_abi/region.py")


@dataclass(frozen=True)
class Claim:
    """A limiter claim's share of the GPU: floor (`cores`), ceiling (`limit`, default the floor), class."""

    uid: str
    floor: int
    ceiling: int = 0
    priority: str = "standard"

    @property
    def top(self) -> int:
        return self.ceiling or self.floor

    def describe(self) -> str:
        text = f"{self.floor}" + (f"-{self.top}" if self.top != self.floor else "") + " %"
        return text + ("" if self.priority == "standard" else f" {self.priority}")


def library_lines(output: str) -> list[str]:
    """The library's log lines in a process's output."""
    return [line.strip() for line in output.splitlines() if LIBRARY_LINE in line]


def refusal(output: str) -> str:
    """The library's line saying it did not take the claim into arbitration (or refused it); empty if none."""
    line = next((x for x in library_lines(output) if any(k in x for k in NOT_ELASTIC)), "")
    return f"the library did not take the claim into arbitration: {line}" if line else ""


def why_not() -> str:
    """Why claims cannot be laid out here; empty when they can."""
    if os.geteuid() != 0:
        return (
            f"needs root: each claim's process sees its limits file and the GPU's board on read-only mounts "
            f"at {CLAIMS_ROOT} and {GPUS_ROOT}, in a mount namespace of its own, as in a container"
        )
    if shutil.which("unshare") is None:
        return "unshare not found (util-linux): the claims' mount namespaces cannot be made"
    return ""


class Layout:
    """The claims' files under `work` (host side), and how to run a process of a claim."""

    def __init__(
        self,
        work: Path,
        gpu_uuid: str,
        claims: Sequence[Claim],
        claims_root: Path | None = None,
        gpus_root: Path | None = None,
    ) -> None:
        self.work = work
        self.gpu_uuid = gpu_uuid
        self.claims = {c.uid: c for c in claims}
        self.claims_root = claims_root or CLAIMS_ROOT
        self.gpus_root = gpus_root or GPUS_ROOT
        self.gpus = work / "gpus"
        self.made_roots: list[Path] = []
        self._lay_out()

    @property
    def gpu_dir(self) -> Path:
        return self.gpus / self.gpu_uuid

    def claim_dir(self, uid: str) -> Path:
        """What the claim's process sees at the claims root: one directory, the claim's, named by its UID."""
        return self.work / f"claims-{uid}"

    def state_dir(self, uid: str) -> Path:
        """The claim's limiter directory on the host: inside its own directory, as the agent makes it (the
        library takes a limits file only whose `state=` is its own directory's `limiter`)."""
        return self.claim_dir(uid) / uid / "limiter"

    def activity_path(self, uid: str) -> Path:
        return self.gpu_dir / f"{uid}{board().ACTIVITY_SUFFIX}"

    def limits_text(self, claim: Claim) -> str:
        """The claim's limits file as the agent writes it: `limit=` and `priority=` only when not the default."""
        line = f"device={self.gpu_uuid} memory=unlimited cores={claim.floor}"
        if claim.top != claim.floor:
            line += f" limit={claim.top}"
        if claim.priority != "standard":
            line += f" priority={claim.priority}"
        state = self.claims_root / claim.uid / "limiter"
        return f"version=1\nclaim={NAMESPACE}/{claim.uid}\nstate={state}\n{line}\n"

    def _lay_out(self) -> None:
        layout = board()
        self.gpu_dir.mkdir(parents=True)
        for d in (self.gpus, self.gpu_dir):
            d.chmod(0o755)
        for claim in self.claims.values():
            state = self.state_dir(claim.uid)
            state.mkdir(mode=0o755, parents=True)
            _make_region(state / region().REGION_FILE)
            layout.make_activity(self.activity_path(claim.uid))
            os.link(self.activity_path(claim.uid), state / f"{self.gpu_uuid}{layout.ACTIVITY_SUFFIX}")
            limits = self.claim_dir(claim.uid) / claim.uid / "limits"
            limits.parent.mkdir(parents=True, exist_ok=True)
            limits.write_text(self.limits_text(claim))
            limits.chmod(0o444)
        path = self.gpu_dir / layout.BOARD_FILE
        layout.make_board(path)
        layout.write_board(
            path, [layout.Entry(c.uid, c.floor, c.top, c.priority) for c in self.claims.values()]
        )

    def argv(self, uid: str, library: Path, program: Sequence[str | Path]) -> list[str]:
        """`program` as a process of claim `uid`: in a mount namespace of its own, under the limiter."""
        limits = self.claims_root / uid / "limits"
        return [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_SCRIPT, "sh",
            str(self.gpus), str(self.gpus_root), str(self.claim_dir(uid)), str(self.claims_root), str(limits),
            "env", f"LD_PRELOAD={library}", *map(str, program),
        ]  # fmt: skip

    def activity(self, uid: str) -> Any:
        """What the claim's processes wrote in its activity file (`board.Activity`), None if unreadable."""
        return board().read_activity(self.activity_path(uid))

    def make_roots(self) -> None:
        """The mount points of the claims and GPUs roots, made on the host where missing (`remove_roots`)."""
        for root in (self.claims_root, self.gpus_root):
            missing = [p for p in (root, *root.parents) if not p.exists()]
            for p in reversed(missing):
                p.mkdir(mode=0o755)
                self.made_roots.append(p)

    def remove_roots(self) -> None:
        for p in reversed(self.made_roots):
            with contextlib.suppress(OSError):
                p.rmdir()
        self.made_roots.clear()


def _make_region(path: Path) -> None:
    """An empty region, laid out and sized as the agent makes it (the library never makes a claim's)."""
    layout = region()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, layout.header_fields())
        os.ftruncate(fd, layout.REGION_BYTES)
        os.fchmod(fd, 0o666)
    finally:
        os.close(fd)


@contextlib.contextmanager
def laid_out(
    work: Path,
    gpu_uuid: str,
    claims: Sequence[Claim],
    claims_root: Path | None = None,
    gpus_root: Path | None = None,
) -> Iterator[Layout]:
    """A `Layout` whose mount points exist while it is used."""
    layout = Layout(work, gpu_uuid, claims, claims_root, gpus_root)
    layout.make_roots()
    try:
        yield layout
    finally:
        layout.remove_roots()
