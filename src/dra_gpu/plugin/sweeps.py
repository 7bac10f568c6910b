"""The preparer's background duties: re-applying node-side setup that vanished, undoing the records of
claims the API no longer has, removing files no record accounts for, and rebuilding a checkpoint that was
set aside. The node agent's supervision loop calls them; none runs inside a kubelet call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_gpu.kube import objects
from dra_gpu.plugin.checkpoint import (
    ClaimState,
)
from dra_gpu.plugin.claims import results_in_pool
from dra_gpu.plugin.errors import bounded, describe, filesystem_error
from dra_gpu.plugin.locking import LockTimeout
from dra_gpu.plugin.made_devices import MadeDevices
from dra_gpu.plugin.preparer_core import PreparerCore
from dra_gpu.plugin.rebuild import Rebuild
from dra_gpu.plugin.sharing.modes import arbitration
from dra_gpu.plugin.sharing.plan import ClaimInfo
from dra_gpu.plugin.sharing.steps.directories import claim_temp_files
from dra_gpu.plugin.unprepare import Unprepare

log = logging.getLogger(__name__)

TEMP_FILE_AGE_S = 600.0
"""A temporary file this old in a claim's directory, a GPU's arbitration directory or the CDI directory is left
by an interrupted write."""
GPU_LOCK_WAIT_S = 1.0
"""How long the sweep waits for a GPU's lock to remove its idle arbitration directory (busy: next sweep)."""


class Sweeps:
    """The background duties of the preparer (see the module docstring)."""

    def __init__(self, core: PreparerCore, unprepare: Unprepare, rebuild: Rebuild, made: MadeDevices) -> None:
        self.core = core
        self.unprepare = unprepare
        self.rebuild = rebuild
        self.made = made
        self._gone_once: set[str] = set()
        """UIDs of completed records whose claims the last stale-claim sweep found gone."""

    def supervise(self) -> None:
        """Re-apply node-side setup that vanished behind our back (a crashed MPS control daemon)."""
        core = self.core
        self.rebuild.if_lost()
        checked: set[str] = set()
        for entry in core.snapshot().claims.values():
            if entry.state != ClaimState.PREPARE_COMPLETED or entry.bootId != core.boot_id:
                continue
            for hold in entry.holds:
                if hold.key in checked:
                    continue
                checked.add(hold.key)
                gpu = hold.params.get("gpu")
                try:
                    handler = core.handler(hold)
                    if not gpu and handler.in_place(hold, core.node):
                        continue  # a claim's own files: looked at first without its lock, the common case
                    with core.gpu_locks.hold([str(gpu)] if gpu else [f"claim:{entry.uid}"]):
                        current = core.entry(entry.uid)
                        if current is None or all(h.key != hold.key for h in current.holds):
                            continue  # unprepared meanwhile
                        if handler.in_place(hold, core.node):
                            continue
                        log.warning(
                            "node-side setup is gone; re-applying",
                            extra={"hold": hold.key, "claim": entry.ref},
                        )
                        handler.apply(hold, core.node)
                        core.metrics.setup_repairs.labels(kind=hold.kind).inc()
                except Exception as exc:
                    log.error(
                        "re-applying node-side setup failed",
                        extra={"hold": hold.key, "error": bounded(describe(exc))},
                    )
        core.compact()
        core.refresh_metrics()  # another process's writes, read by this round's loads

    def collect_stale(self) -> None:
        """Undo records of claims that the API no longer has (or has under another UID, or not allocated).

        Every record is looked at, whatever its state and boot: the kubelet re-prepares the claims of
        the pods it restarts after a reboot (the others may never be unprepared), a rebuild may have
        re-adopted a claim the kubelet had already unprepared, and the lost last journal line of an
        unprepare leaves a completed record behind. The claims are listed once, after the records were
        read, so that a claim prepared meanwhile is not mistaken for a gone one; a record is undone
        only if it is still the one looked at once its locks are held. Without an answer from the API
        nothing is decided. A record it cannot undo is counted, logged and left for the next sweep;
        the sweep goes on. A record the kubelet itself will unprepare (prepared and completed in this
        boot) is undone only when two sweeps in a row found its claim gone, so that the kubelet's own
        call comes first when there is one. Then files no record accounts for are removed: claims'
        directories and specs, and the temporary files of interrupted writes.
        """
        core = self.core
        checkpoint = core.snapshot()
        if checkpoint.rebuildPending:
            checkpoint = self.rebuild.rebuild()
        failed: list[str] = []
        live = self._live_claims() if checkpoint.claims else {}
        suspects, self._gone_once = self._gone_once, set()
        for entry in checkpoint.claims.values():
            if live is None:
                self._gone_once = suspects
                break  # no answer from the API: nothing is decided
            obj = live.get((entry.namespace, entry.name))
            if obj is not None and objects.uid(obj) == entry.uid and self._allocated_here(obj):
                continue
            kubelets = entry.state == ClaimState.PREPARE_COMPLETED and entry.bootId == core.boot_id
            if kubelets and entry.uid not in suspects:
                self._gone_once.add(entry.uid)  # the kubelet's own unprepare may be on its way
                continue
            claim = ClaimInfo(uid=entry.uid, namespace=entry.namespace, name=entry.name)
            try:
                with core.claim_locked(claim, None) as current:
                    if current is not entry:
                        continue  # prepared again or undone meanwhile
                    log.info(
                        "undoing the record of a claim that is gone or no longer allocated here",
                        extra={
                            "claim": entry.ref,
                            "state": entry.state,
                            "boot": entry.bootId == core.boot_id,
                        },
                    )
                    self.unprepare.undo(current)
            except Exception as exc:
                failed.append(entry.ref)
                log.warning(
                    "undoing a stale claim failed; its record stays and the next sweep tries again",
                    extra={"claim": entry.ref, "error": bounded(describe(exc))},
                )
        core.metrics.stale_uncleaned.set(len(failed))
        if not core.snapshot().rebuildPending:
            self._remove_unrecorded()
            self._remove_idle_gpu_dirs()
        core.refresh_metrics()

    def _remove_idle_gpu_dirs(self) -> None:
        """The arbitration directories of GPUs that no claim is on (unprepare keeps a GPU's directory for
        its next claim), including those of GPUs that left the node; each under its GPU's lock."""
        core = self.core
        for uuid in arbitration.gpu_dirs(core.node):
            try:
                with core.gpu_locks.hold([uuid], deadline=time.monotonic() + GPU_LOCK_WAIT_S):
                    if arbitration.remove_if_empty(arbitration.gpu_dir(core.node, uuid)):
                        log.info(
                            "removed the arbitration directory of a GPU no claim is on", extra={"gpu": uuid}
                        )
            except LockTimeout:
                continue  # the GPU is busy with a call: the next sweep
            except OSError as exc:
                log.warning(
                    "could not remove an idle GPU's arbitration directory; the next sweep tries again",
                    extra={"gpu": uuid, "error": bounded(describe(exc))},
                )

    def _live_claims(self) -> dict[tuple[str, str], dict[str, Any]] | None:
        """The API's ResourceClaims by (namespace, name); None when the API does not answer."""
        core = self.core
        try:
            items, _ = core.api.list("ResourceClaim")
        except Exception as exc:  # API unreachable: decide next time
            log.warning(
                "cannot list ResourceClaims for the stale-claim sweep; will retry", extra={"error": str(exc)}
            )
            return None
        return {(objects.namespace(o), objects.name(o)): o for o in items}

    def _allocated_here(self, obj: Mapping[str, Any]) -> bool:
        """Whether the claim's allocation has a device of this driver in this node's pool (a claim the
        scheduler deallocated can be in no pod's use)."""
        core = self.core
        return bool(results_in_pool(obj, core.node.driver, core.pool))

    def _remove_unrecorded(self) -> None:
        """Claims' files no record accounts for, and temporary files of interrupted writes."""
        core = self.core
        with core.lock.hold():
            known = set(core.load().claims)
            for uid in sorted(core.uids_on_disk() - known):
                try:
                    core.remove_leftovers(uid)
                except Exception as exc:
                    log.warning(
                        "could not remove a claim's leftover files; the next sweep tries again",
                        extra={"uid": uid[:64], "error": bounded(describe(exc))},
                    )
        cutoff = time.time() - TEMP_FILE_AGE_S
        temporary = [
            *core.specs.temp_files(),
            *claim_temp_files(core.node.state_dir / "claims"),
            *claim_temp_files(Path(arbitration.gpus_root(core.node))),
            *self.made.temp_files(),
            *core.store.temp_files(),
        ]
        for path in temporary:
            try:
                if path.lstat().st_mtime < cutoff:
                    path.unlink()
                    log.info("removed the temporary file of an interrupted write", extra={"path": str(path)})
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning(
                    "could not remove the temporary file of an interrupted write",
                    extra={"error": filesystem_error("removing", path, exc).message},
                )
