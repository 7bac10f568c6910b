"""Per-claim directories on the host (e.g. the limiter's shared accounting state), removed on unprepare."""

from __future__ import annotations

import contextlib
import os
import shutil
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
        claims_root = node.state_dir / "claims"
        parent = path.parent
        while parent != claims_root and claims_root in parent.parents:
            with contextlib.suppress(OSError):
                parent.rmdir()
            parent = parent.parent

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return Path(str(hold.params["path"])).is_dir()

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


HOLD_HANDLERS = (ClaimDirectory(),)
