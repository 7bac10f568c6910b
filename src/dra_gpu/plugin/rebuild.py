"""Rebuilding a lost checkpoint: the claims in use are prepared again from the API, other claims' files
are removed and GPU-wide settings nobody holds are reset.
"""

from __future__ import annotations

import logging
import threading

from dra_gpu.host.gpu_commands import CommandError
from dra_gpu.kube import objects
from dra_gpu.plugin.checkpoint import (
    Checkpoint,
)
from dra_gpu.plugin.claims import results_in_pool
from dra_gpu.plugin.errors import bounded, describe
from dra_gpu.plugin.identity import claim_problem
from dra_gpu.plugin.locking import LockTimeout
from dra_gpu.plugin.prepare import Prepare
from dra_gpu.plugin.preparer_core import PreparerCore
from dra_gpu.plugin.sharing.plan import ClaimInfo

log = logging.getLogger(__name__)


class Rebuild:
    """Completing the checkpoint from the API and the disk (see `rebuild`)."""

    def __init__(self, core: PreparerCore, prepare: Prepare) -> None:
        self.core = core
        self.prepare = prepare
        self._lock = threading.Lock()
        """One rebuild at a time (`if_lost`)."""

    def if_lost(self) -> None:
        """Rebuild now if a damaged checkpoint was set aside (`PreparerCore.load`); one caller at a time.

        Called before and after every prepare and unprepare, and by the supervision loop.
        """
        if not self.core.rebuild_wanted or not self._lock.acquire(blocking=False):
            return
        try:
            if self.core.rebuild_wanted:
                self.rebuild()
        except Exception:
            log.exception("rebuilding the state failed; the stale-claim sweep tries again")
        finally:
            self._lock.release()

    def rebuild(self) -> Checkpoint:
        """Complete the checkpoint from the API (claims allocated here and in use) and the disk.

        Claims in use are prepared again (idempotently: their settings and daemons are kept); files of
        other claims are removed and GPU-wide settings nobody holds are reset. Without the API nothing
        is removed and the checkpoint is marked `rebuildPending`: the next start or stale-claim sweep
        tries again, and meanwhile the kubelet's own unprepare calls clean up claim by claim. Takes
        the locks it needs claim by claim and GPU by GPU: call it holding none.
        """
        core = self.core
        core.rebuild_wanted = False
        try:
            items, _ = core.api.list("ResourceClaim")
        except Exception as exc:  # ApiError or a transport failure: either way, no authoritative list
            log.error(
                "cannot list ResourceClaims to rebuild the state; will retry", extra={"error": str(exc)}
            )
            core.set_pending(True)
            return core.snapshot()
        for obj in items:
            if not objects.reserved_for(obj) or not results_in_pool(obj, core.node.driver, core.pool):
                continue
            claim = ClaimInfo(uid=objects.uid(obj), namespace=objects.namespace(obj), name=objects.name(obj))
            problem = claim_problem(claim.uid, claim.namespace, claim.name)
            if problem is not None:
                log.warning(
                    "not re-adopting a claim the API server should not have", extra={"error": problem}
                )
                continue
            try:
                with core.claim_locked(claim, obj) as entry:
                    if entry is not None:
                        continue
                    self.prepare.fresh(claim, obj)
                log.info("re-adopted a claim in use", extra={"claim": claim.ref})
            except Exception as exc:
                log.warning(
                    "could not re-adopt a claim", extra={"claim": claim.ref, "error": bounded(describe(exc))}
                )
            self.prepare.forget_notices(claim.uid)  # told when it was first prepared
        with core.lock.hold():
            for uid in core.uids_on_disk() - set(core.load().claims):
                try:
                    core.remove_leftovers(uid)
                except Exception as exc:
                    log.warning("could not remove a claim's leftover files", extra={"error": describe(exc)})
        self._reset_unheld_gpus()
        core.set_pending(False)
        return core.snapshot()

    def _reset_unheld_gpus(self) -> None:
        core = self.core
        for gpu in core.inventory.gpus():
            try:
                with core.gpu_locks.hold([gpu.uuid]):
                    with core.lock.hold():
                        core.load()
                        held = core.store.held_keys()
                    for handler in core.handlers.values():
                        try:
                            handler.reset_unheld(gpu, core.node, held)
                        except CommandError as exc:
                            log.warning(
                                "could not reset a GPU setting nobody holds",
                                extra={"gpu": gpu.uuid, "kind": handler.kind, "error": str(exc)},
                            )
            except LockTimeout as exc:
                log.warning("could not reset the GPU's settings nobody holds", extra={"error": str(exc)})
