"""Dynamic MIG instances the agent makes for claims, recorded before they are made.

The record (claim, GPU, profile, start) is written before the instance is created, and completed
with the instance's UUID and ids once it exists, so a restarted agent knows every instance it may
have made: a repeated prepare of the claim adopts the instance at the recorded placement; at start,
records of claims the checkpoint does not have are undone (the instance destroyed) once the API says
the claim is gone; while it exists the kubelet's retry adopts the instance. An instance
without a record (an admin's, another tool's) is never adopted or destroyed. The file is only read
and written under the node lock.

Creating and destroying instances on one GPU is serialised by a lock per GPU (a process lock and a
file lock, like the GPU locks, under `mig-locks/`): the claim locks prepare and unprepare hold are
those of the claim's devices, and a prepared dynamic instance is a device of its own (its MIG UUID),
so an unprepare and a prepare on one GPU hold different claim locks. Without it their `nvidia-smi
mig` calls would interleave: a create finds its new instance as the UUID `nvidia-smi -L` did not
list before, and would take the other's. Order: claim and GPU locks, then this one, then the node lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_gpu.devicekinds.kind import ClaimRef, MakerHost, SetupFailed, ShareT
from dra_gpu.devicekinds.mig import MigPlacement, instance_view, mig_views
from dra_gpu.host.gpu_commands import CommandError
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.kube import NotFound, objects

log = logging.getLogger(__name__)

STORE_NAME = "mig-instances.json"
TEMP_PREFIX = ".mig-instances."
LOCK_DIR_NAME = "mig-locks"
Record = dict[str, Any]


class MigInstances:
    """The MIG kind's `DeviceMaker` (see the module docstring); failures are SetupFailed."""

    def __init__(self, host: MakerHost) -> None:
        self.api = host.api
        self.path = host.state_dir / STORE_NAME
        self.commands = host.commands
        self.lock = host.lock
        self._hook = host.hook
        self.table_locks = host.locks(LOCK_DIR_NAME)
        """One per GPU (its UUID): held over reading, creating and destroying the GPU's instances."""

    # -- the record file -----------------------------------------------------------------------------
    def _read(self) -> list[Record]:
        try:
            return list(json.loads(self.path.read_text()).get("instances") or [])
        except FileNotFoundError:
            return []

    def _write(self, records: list[Record]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=TEMP_PREFIX, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"instances": records}, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def temp_files(self) -> list[Path]:
        """Temporary files of the record file's writes (`.mig-instances.XXXX.tmp`): a kill leaves them."""
        return sorted(self.path.parent.glob(f"{TEMP_PREFIX}*.tmp"))

    @contextmanager
    def _records(self) -> Iterator[list[Record]]:
        """The records, written back after the block (under the node lock)."""
        with self.lock.hold():
            records = self._read()
            yield records
            self._write(records)

    def records(self) -> list[Record]:
        with self.lock.hold():
            return self._read()

    # -- prepare and unprepare -------------------------------------------------------------------------
    def materialize(self, claim: ClaimRef, shares: list[ShareT], gpus: Sequence[GpuInfo]) -> list[ShareT]:
        """Shares on dynamic placements get their instance (adopted if recorded and there, else made)."""
        _, placements = mig_views(list(gpus))
        out = []
        for share in shares:
            placement = placements.get(share.device)
            if placement is None:
                out.append(share)
                continue
            instance = self._instance_for(claim, placement)
            out.append(replace(share, gpu=instance_view(placement.parent, instance)))  # type: ignore[type-var]
        return out

    def _instance_for(self, claim: ClaimRef, placement: MigPlacement) -> MigInstance:
        with self.table_locks.hold([placement.parent.uuid]):
            return self._instance_locked(claim, placement)

    def _instance_locked(self, claim: ClaimRef, placement: MigPlacement) -> MigInstance:
        gpu, profile, start = placement.parent, placement.profile, placement.start
        key = {"claim": claim.uid, "gpu": gpu.uuid, "profile": profile.name, "start": start}
        live = self._live(gpu)
        unknown: MigInstance | None = None
        with self._records() as records:
            mine = next((r for r in records if all(r.get(k) == v for k, v in key.items())), None)
            if mine is None:
                records.append({**key, "namespace": claim.namespace, "name": claim.name, "uuid": ""})
            elif (found := _at(live, profile.name, start, mine.get("uuid") or None)) is not None:
                if found.uuid:
                    log.info("adopted the MIG instance made for this claim", extra={"uuid": found.uuid})
                    mine.update(uuid=found.uuid, giId=found.gi_id, ciId=found.ci_id)
                    return found
                unknown = found
        if unknown is not None:
            self._destroy(gpu, unknown, claim.ref)  # ours by its placement, but its UUID is not listed
        self._hook("prepare:mig-recorded")
        try:
            instance = self.commands.create_mig_instance(gpu, profile, start)
        except CommandError as exc:
            with self._records() as records:
                records[:] = [r for r in records if not all(r.get(k) == v for k, v in key.items())]
            raise SetupFailed(
                f"ResourceClaim {claim.ref}: creating MIG {profile.name} at memory slice {start} on GPU "
                f"{gpu.uuid} failed: {exc}; the placement is taken by an instance this driver did not "
                f"make, or the GPU left MIG mode: delete the instance or the claim",
            ) from None
        with self._records() as records:
            for r in records:
                if all(r.get(k) == v for k, v in key.items()):
                    r.update(uuid=instance.uuid, giId=instance.gi_id, ciId=instance.ci_id)
        self._hook("prepare:mig-created")
        log.info(
            "created a MIG instance",
            extra={"claim": claim.ref, "gpu": gpu.uuid, "profile": profile.name, "start": start},
        )
        return instance

    def release(self, uid: str, gpus: Sequence[GpuInfo]) -> None:
        """Destroy the claim's instances and drop their records; SetupFailed while one is in use."""
        by_uuid = {g.uuid: g for g in gpus}
        for record in [r for r in self.records() if r.get("claim") == uid]:
            gpu = by_uuid.get(str(record["gpu"]))
            with self.table_locks.hold([str(record["gpu"])]):
                if gpu is not None:
                    found = _at(
                        self._live(gpu),
                        str(record["profile"]),
                        int(record["start"]),
                        record.get("uuid") or None,
                    )
                    if found is not None:
                        self._destroy(gpu, found, uid)
                with self._records() as records:
                    records[:] = [r for r in records if r != record]

    def lost(self, uid: str, gpus: Sequence[GpuInfo]) -> list[str]:
        """The claim's recorded instances that are not on their GPU any more (a reboot or a GPU reset
        took them), each described; empty when all are there (or the claim has none)."""
        by_uuid = {g.uuid: g for g in gpus}
        gone = []
        for record in [r for r in self.records() if r.get("claim") == uid]:
            gpu = by_uuid.get(str(record["gpu"]))
            where = (
                f"MIG instance {record['profile']} at memory slice {record['start']} on GPU {record['gpu']}"
            )
            if (
                gpu is None
                or _at(
                    self._live(gpu), str(record["profile"]), int(record["start"]), record.get("uuid") or None
                )
                is None
            ):
                gone.append(where)
        return gone

    def reconcile(self, claims: Set[str], gpus: Sequence[GpuInfo]) -> None:
        """At start: undo the records of deleted claims the checkpoint does not have (a prepare that died)."""
        unknown = {str(r["claim"]): r for r in self.records() if str(r.get("claim")) not in claims}
        for uid, record in sorted(unknown.items()):
            if not self._gone(uid, record):
                continue
            try:
                self.release(uid, gpus)
                log.info("destroyed a MIG instance of an interrupted prepare", extra={"uid": uid})
            except SetupFailed as exc:
                log.error(
                    "could not destroy a MIG instance left by an interrupted prepare",
                    extra={"error": exc.message},
                )

    # -- helpers ---------------------------------------------------------------------------------------
    def _gone(self, uid: str, record: Record) -> bool:
        """The claim was deleted (or re-created); False while it exists or the API cannot say."""
        try:
            obj = self.api.get("ResourceClaim", str(record.get("name")), str(record.get("namespace")))
        except NotFound:
            return True
        except Exception as exc:  # unreachable: keep the instance; the kubelet's unprepare undoes it
            log.warning(
                "cannot tell whether a MIG instance's claim exists", extra={"uid": uid, "error": str(exc)}
            )
            return False
        return objects.uid(obj) != uid

    def _live(self, gpu: GpuInfo) -> list[MigInstance]:
        try:
            return self.commands.mig_instances(gpu)
        except CommandError as exc:
            raise SetupFailed(f"listing the MIG instances of GPU {gpu.uuid}: {exc}") from None

    def _destroy(self, gpu: GpuInfo, instance: MigInstance, who: str) -> None:
        try:
            self.commands.destroy_mig_instance(gpu, instance)
        except CommandError as exc:
            raise SetupFailed(
                f"destroying MIG instance {instance.uuid or instance.gi_id} of {who} on GPU {gpu.uuid}: "
                f"{exc}; stop the processes still using it",
            ) from None


def _at(live: Sequence[MigInstance], profile: str, start: int, uuid: str | None) -> MigInstance | None:
    """The live instance at a placement (and with `uuid`, when the record knows it)."""
    return next(
        (
            i
            for i in live
            if i.profile == profile and i.start == start and (uuid is None or not i.uuid or i.uuid == uuid)
        ),
        None,
    )
