"""The limiter's accounting region of a claim, made by the agent (never by the library).

The file (``<claim dir>/limiter/dragpu-limiter.region``) is laid out and sized here, owned by root and
mode 0666, so every UID of every pod of the claim can account in it; the host's claim directories are
not reachable by other users. The CDI spec mounts the state directory read-only and the region file
read-write on top of it: a container can neither unlink, rename nor replace it (it is a mount point) nor
add files beside it. It can still write into it - truncate, zero or rewrite it - and the library then
refuses allocations on the claim's devices instead of starting a fresh account (it never creates, resizes
or initialises a claim's region). The layout is ``dra_gpu.limiter_abi.region``'s mirror of region.c.

Beside it the agent makes the claim's floor (``dragpu-limiter.floor``, one entry per GPU of the claim): the
monitor publishes there what NVML says the claim's processes hold, and the library never lets the claim's
account fall below it. It is in the read-only directory, so no process of the claim can lower it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Set
from pathlib import Path

from dra_gpu.inventory import GpuInfo
from dra_gpu.limiter_abi import region as layout
from dra_gpu.limiter_abi.board import make_file
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.sharing.plan import NodeContext, setup_failed

MODE = 0o666


def region_header() -> bytes:
    """The header of an empty region: the layout fields; no device, slot or shared entry yet."""
    return layout.header_fields()


def make_region(path: Path | str) -> bool:
    """Creates the region at path unless a file is there already (True when it made one).

    An existing file is kept whatever its state: processes of the claim may hold memory charged in it,
    and a tampered one must stay refused, not become a fresh account."""
    return make_file(path, region_header(), layout.REGION_BYTES, MODE, durable=True)


def floor_path(region: Path | str) -> str:
    """The agent's floor beside a claim's region: read-only to the claim (its directory is a read-only mount)."""
    return os.path.join(os.path.dirname(region), layout.FLOOR_FILE)


class ClaimRegion:
    kind = "region"

    def apply(self, hold: Hold, node: NodeContext) -> None:
        path = str(hold.params["path"])
        gpus = [g for g in str(hold.params.get("gpus", "")).split(",") if g]
        try:
            make_region(path)
            if gpus and layout.floor_uuids(floor_path(path)) != gpus:
                layout.make_floor(floor_path(path), gpus)
        except OSError as exc:
            raise setup_failed(f"creating {path}", exc) from None

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        path = str(hold.params["path"])
        for done in (floor_path(path), path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(done)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        path = str(hold.params["path"])
        gpus = [g for g in str(hold.params.get("gpus", "")).split(",") if g]
        # A damaged region stays (see make_region); a floor that is missing or names other GPUs is made again.
        return os.path.lexists(path) and (not gpus or layout.floor_uuids(floor_path(path)) == gpus)

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        return None  # per claim, not GPU-wide


HOLD_HANDLERS = (ClaimRegion(),)
