"""Per-claim directories and files on the host (the limiter's shared accounting state, the claim's
limits file), removed on unprepare."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Set
from pathlib import Path

from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.sharing.plan import NodeContext, setup_failed


class ClaimDirectory:
    kind = "dir"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        path = Path(str(hold.params["path"]))
        try:
            path.mkdir(parents=True, exist_ok=True)
            # Explicit chmod: the umask must not decide whether a pod's non-root user may write here.
            os.chmod(path, int(hold.params.get("mode", 0o700)))
        except OSError as exc:
            raise setup_failed(f"creating {path}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        path = Path(str(hold.params["path"]))
        shutil.rmtree(path, ignore_errors=True)
        _remove_empty_parents(path, node)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return Path(str(hold.params["path"])).is_dir()

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


def _remove_empty_parents(path: Path, node: NodeContext) -> None:
    claims_root = node.state_dir / "claims"
    parent = path.parent
    while parent != claims_root and claims_root in parent.parents:
        with contextlib.suppress(OSError):
            parent.rmdir()
        parent = parent.parent


class ClaimFile:
    """A file with fixed content (e.g. the claim's limits), replaced atomically: a reader sees the
    old file or the new one, never a part."""

    kind = "file"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        path = Path(str(hold.params["path"]))
        if self.in_place(hold, node):
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(str(hold.params["content"]))
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, int(hold.params.get("mode", 0o444)))
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise setup_failed(f"writing {path}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        path = Path(str(hold.params["path"]))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        _remove_empty_parents(path, node)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        try:
            return Path(str(hold.params["path"])).read_text(encoding="utf-8") == str(hold.params["content"])
        except (OSError, UnicodeDecodeError):
            return False

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


HOLD_HANDLERS = (ClaimDirectory(), ClaimFile())
