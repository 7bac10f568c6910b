"""Each limiter claim's floor: what the driver says the claim's processes hold on each GPU, published to the
claim's floor file, which the library never lets the claim's account fall below - so a claim that forged its
region's records gains nothing past one watch. Beside it, the region's count the agent read before asking
NVML, so that the library can tell memory freed in between from memory hidden.

A floor file is written through a descriptor kept from one write to the next (no container can write the
file; the agent made it when it prepared the claim), dropped when the claim goes and at every full sample,
and at most a quarter of the process's open-file limit of them."""

from __future__ import annotations

import os
from collections.abc import Container

from dra_gpu.limiter_abi.region import FLOOR_FILE, floor_uuids, open_floor, publish_floor
from dra_gpu.monitor.claim_files import KeptFds
from dra_gpu.monitor.figures import Held
from dra_gpu.monitor.memory_caps import Procs


class FloorPublisher:
    """Writes floors, each file again only when what it would say changed."""

    def __init__(self, claims_dir: str) -> None:
        self._claims_dir = claims_dir
        self._floors: dict[str, tuple[list[str], dict[str, tuple[int, int]]]] = {}
        """claim uid -> the floor file's GPUs and what was last published there."""
        self._fds = KeptFds()
        """claim uid -> the floor file, kept open."""

    def reopen(self) -> None:
        """Drops every kept descriptor: the next writes open the files again."""
        self._fds.close_all()

    def publish(
        self,
        limited: dict[tuple[str, str], Held],
        nvml_memory: dict[tuple[str, str], Procs],
        counts: dict[str, dict[str, int]],
        answered: Container[str],
    ) -> None:
        """Writes each limiter claim's floor (`limited`: the limiter shares): per GPU NVML answered for, what
        its processes hold (a process whose figure NVML cannot tell adds nothing: a floor is what is known),
        and the region's count before."""
        floors: dict[str, dict[str, tuple[int, int]]] = {}
        for key, h in limited.items():
            if h.gpu not in answered:
                continue
            procs = nvml_memory.get(key)
            known = sum(p[1] for p in procs) if procs else 0
            region = _by_uuid(counts.get(h.claim.uid, {}), h.gpu)
            floors.setdefault(h.claim.uid, {})[h.gpu] = (known, region)
        for uid, figures in floors.items():
            last = self._floors.get(uid)
            if last is not None and figures == last[1]:
                continue  # unchanged: an allocation waiting for a new sample is decided on this one anyway
            path = f"{self._claims_dir}/{uid}/limiter/{FLOOR_FILE}"
            uuids = last[0] if last is not None else floor_uuids(path)
            if uuids and self._write(uid, path, figures, uuids):
                self._floors[uid] = (uuids, figures)
            else:
                self._floors.pop(uid, None)
        if len(self._floors) > len(floors) or len(self._fds) > len(floors):
            self._floors = {uid: v for uid, v in self._floors.items() if uid in floors}
            self._fds.retain(floors)

    def _write(self, uid: str, path: str, figures: dict[str, tuple[int, int]], uuids: list[str]) -> bool:
        fd = self._fds.take(uid)
        if fd is None:
            fd = open_floor(path)
            if fd is None:
                return False
        try:
            publish_floor(fd, figures, uuids)
        except OSError:
            os.close(fd)
            return False
        self._fds.keep(uid, fd)
        return True


def _by_uuid(counts: dict[str, int], gpu: str) -> int:
    """The count of the region's entry for gpu (the library writes UUIDs as the driver reports them)."""
    if gpu in counts:
        return counts[gpu]
    wanted = gpu.lower()
    return next((v for u, v in counts.items() if u.lower() == wanted), 0)
